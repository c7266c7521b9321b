"""``python -m tests.harness.probe ARGS``: print, as one JSON object, what this process sees of
itself (environment, arguments, PyTorch's threads, working folder, pid): the subject of tests
that start processes in more than one way."""

import json
import os
import sys

import torch

if __name__ == "__main__":
    print(json.dumps({"environ": dict(os.environ), "argv": sys.argv, "cwd": os.getcwd(),
                      "threads": torch.get_num_threads(), "pid": os.getpid()}))
