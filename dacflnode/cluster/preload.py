"""What the fork server of :mod:`dacflnode.cluster.forked` imports once: the setting that
``dacflnode start`` makes before it imports gRPC, then every module a daemon loads (torch and
the compiler stack its optimizers import on first use, gRPC, the daemon, its transport and
control service).

Only imports: no thread of the daemon, no gRPC channel or server and no tensor operation happen
here, so that a fork of this process is a clean daemon process.
"""

import os

# gRPC reads it once, at import; `dacflnode start` sets the same before it imports gRPC
FORK_SUPPORT = ("GRPC_ENABLE_FORK_SUPPORT", "false")
os.environ.setdefault(*FORK_SUPPORT)

# torch's optimizers import the compiler stack (torch._dynamo, about 1.5 s of CPU) at their
# first construction: a daemon's first round paid it, several times over on a busy machine
import torch._dynamo  # noqa: E402,F401

import dacflnode.daemon.service  # noqa: E402
import dacflnode.transport.grpc_control  # noqa: E402
import dacflnode.transport.grpc_transport  # noqa: E402,F401
