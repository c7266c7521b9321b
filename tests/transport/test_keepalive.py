"""The clients' keepalive pings are within what the servers permit: a client and a server made
by :mod:`dacflnode.transport.channels`, idle over several keepalive pings, part without a
``GOAWAY ENHANCE_YOUR_CALM "too_many_pings"``. Every keepalive time is divided by 20 (a ping
a second) so that the test takes seconds; the option names and their ratios are the module's.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

#: A server and a client with the module's options (keepalive times scaled), one call, idle for
#: 5 s (5 client pings; a server that refused them would strike at the 2nd and close at the
#: 4th), one more call. argv[1]: the server's received-ping minimum, or "module".
PAIR = r"""
import asyncio, sys
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from dacflnode.transport import channels

SCALED = {"grpc.keepalive_time_ms", "grpc.keepalive_timeout_ms",
          "grpc.http2.min_ping_interval_without_data_ms"}

def scaled(options):
    return [(k, v // 20 if k in SCALED else v) for k, v in options]

channels.SERVER_OPTIONS[:] = scaled(channels.SERVER_OPTIONS)
channels.CHANNEL_OPTIONS[:] = scaled(channels.CHANNEL_OPTIONS)
if sys.argv[1] != "module":
    channels.SERVER_OPTIONS[:] = [
        (k, int(sys.argv[1]) if k == "grpc.http2.min_ping_interval_without_data_ms" else v)
        for k, v in channels.SERVER_OPTIONS]

async def main():
    server = channels.create_server()
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = channels.bind(server, "127.0.0.1:0")
    await server.start()
    channel = channels.create_channel(f"127.0.0.1:{port}")
    stub = health_pb2_grpc.HealthStub(channel)
    await stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
    await asyncio.sleep(5.0)
    await stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
    await channel.close()
    await server.stop(None)
    print("done")

asyncio.run(main())
"""


def idle_pair(server_min_ping: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GRPC_VERBOSITY": "ERROR"}
    env.pop("GRPC_TRACE", None)
    return subprocess.run([sys.executable, "-c", PAIR, server_min_ping], capture_output=True,
                          text=True, timeout=60, env=env)


def test_an_idle_client_pinging_at_its_keepalive_gets_no_goaway():
    run = idle_pair("module")
    assert run.returncode == 0 and run.stdout.strip() == "done", run.stderr
    assert "too_many_pings" not in run.stderr and "GOAWAY" not in run.stderr, run.stderr


def test_a_server_that_permits_fewer_pings_would_send_goaway():
    """The control: gRPC's default minimum (5 minutes, what a misspelt option leaves) makes
    the same idle pair end in ``too_many_pings``, so the test above can fail."""
    run = idle_pair(str(300_000))
    assert run.returncode == 0, run.stderr
    assert "too_many_pings" in run.stderr, run.stderr
