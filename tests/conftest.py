import torch

# The suite runs small models on a 2-core machine: one intra-op thread is faster for them and
# leaves the other core to the processes that cluster tests start.
torch.set_num_threads(1)
