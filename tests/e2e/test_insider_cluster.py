"""A member that poisons every state it sends, on real daemons: a 4-node ring of
``dacflnode start --faults FILE`` processes over 127.0.0.1, node-2 sending its states scaled by
50 from round 3 on. Its neighbours refuse them, quarantine the edge (visible in ``status`` and in
the Prometheus counters while the run goes on), no honest round waits for a refused state, and
``Σ x = Σ ω_prev`` holds among the honest nodes at the end."""

from __future__ import annotations

import pytest
import yaml

from dacflnode.transport.control_types import NodeStatus
from dacflnode.transport.grpc_control import fetch_metrics, fetch_status
from tests.e2e.test_fault_cluster import TOLERANCE, cluster
from tests.harness.cluster import Cluster
from tests.harness.polling import until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

#: Long enough that one round waiting for a refused state would show in the round's timings,
#: and that no honest exchange on a loaded machine comes near it (they take well under 1 s).
DEADLINE = 10.0


async def quarantined_by(c: Cluster, i: int, timeout: float = 120.0) -> NodeStatus:
    """Node ``i``'s status once it shows a quarantined neighbour (polled while it runs)."""

    async def quarantining() -> NodeStatus | None:
        if c.procs[i].poll() is not None:
            pytest.fail(f"node-{i} exited before it showed a quarantine\n{c.logs([i])}")
        try:
            status = await fetch_status(c.control_address(i), auth=c.control_auth(i))
        except Exception:  # not serving yet: fail at the deadline if it lasts
            return None
        return status if status.quarantines else None

    return await until(quarantining, timeout, interval=0.05,
                       what=lambda: f"node-{i} showed no quarantine\n{c.logs([i])}")


async def test_a_member_poisoning_every_round_is_quarantined_and_nobody_waits(tmp_path):
    plan = [{"poison": "node-2", "rounds": [3, 60], "scale": 50.0}]
    faults = tmp_path / "faults.yaml"
    faults.write_text(yaml.safe_dump({"faults": plan}))
    with cluster(tmp_path, 4, 40, deadline=DEADLINE, args=("--faults", str(faults))) as c:
        c.start(*range(4))
        status = await quarantined_by(c, 1)
        by_id = {n.node_id: n for n in status.neighbours}
        assert by_id["node-2"].state == "quarantined"
        assert by_id["node-2"].refused_states >= 2 and by_id["node-0"].refused_states == 0
        assert status.refused_states == by_id["node-2"].refused_states
        assert status.refusals.get("absurd-state", 0) >= 2
        text = await fetch_metrics(c.control_address(1), "prometheus",
                                   auth=c.control_auth(1))
        assert 'dacfl_peer_quarantines_total{node="node-1",peer="node-2"} 1.0' in text
        assert 'dacfl_peer_quarantines_total{node="node-1",peer="node-0"} 0.0' in text
        honest = [0, 1, 3]
        assert c.wait(timeout=120) == [0] * 4, c.logs(range(4))
        c.assert_finished(honest)
        longest = 0.0
        for i in honest:  # no honest round waited for a refused state (or anything else)
            slow = [(m["round"], m["exchange_s"]) for m in c.metrics(i)
                    if m["exchange_s"] >= 0.9 * DEADLINE]
            assert slow == [], (f"node-{i}", slow, c.logs([i]))
            longest = max([longest, *(m["exchange_s"] for m in c.metrics(i))])
        print(f"longest honest exchange {longest:.3f} s (deadline {DEADLINE:g} s)")
        for i in (1, 3):  # node-2's neighbours refused its states and say so per round
            assert c.metrics(i)[-1]["refused_states"] >= 2
        assert c.metrics(0)[-1]["refused_states"] == 0
        residual = c.residual(honest)
        print(f"residual among the honest nodes {residual:.2e}")
        assert residual <= TOLERANCE, residual
