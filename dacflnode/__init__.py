"""dacflnode: a peer-to-peer federated-learning node implementing DACFL.

DACFL (dynamic-average-consensus based federated learning) trains one model across devices with
no central server: each node mixes its neighbours' models with a symmetric doubly stochastic
matrix, trains on its own data, and runs first-order dynamic average consensus (FODAC) to track
the network-average model.
"""

__version__ = "0.1.0"
