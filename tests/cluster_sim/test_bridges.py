"""Bridges on the cluster simulator: a bridge added through one node's API is configured
on every node (cluster config register `bridge/<id>`), each node queues only what its
own clients publish, a bad table is refused where it is posted, and a delete spreads."""

from __future__ import annotations

from typing import Any

from simulation.cluster import SimCluster
from tests.bridges.helpers import bridge_manager
from tests.cluster_sim.helpers import sim

# Nothing listens there: the queue keeps what is published, the bridge says why.
BRIDGE = {"id": "out", "type": "http", "url": "http://127.0.0.1:1/hook", "egress": ["plant/#"],
          "backoff_min_s": 1.0, "backoff_max_s": 5.0}


def bridge_on(c: SimCluster, node_id: str) -> dict[str, Any] | None:
    node = c.running(node_id)
    return bridge_manager(node).describe("out")


def test_a_bridge_posted_on_one_node_runs_on_every_node() -> None:
    async def scenario(c: SimCluster) -> None:
        code, body = await c.api("n0", "POST", "/api/v1/bridges", {**BRIDGE, "queue_max_bytes": 0})
        assert code == 400 and isinstance(body, dict) and body["error"].startswith("queue_max_bytes:"), body
        code, body = await c.api("n0", "POST", "/api/v1/bridges", BRIDGE)
        assert code == 201, body
        await c.wait_for(lambda: all(bridge_on(c, n) is not None for n in c.node_ids), 10, "the bridge everywhere")
        described = bridge_on(c, "n2")
        assert described is not None and described["source"] == "cluster"

        # Each node bridges what its own clients publish.
        pub = await c.connect("n2", "p")
        for i in range(3):
            await pub.publish("plant/7/temp", str(i).encode(), qos=1)
        queued = {n: (bridge_on(c, n) or {})["metrics"]["queued"] for n in c.node_ids}
        assert queued == {"n0": 0, "n1": 0, "n2": 3}
        await c.wait_for(lambda: (bridge_on(c, "n2") or {})["status"]["last_error"] is not None, 10,
                         "the unreachable target reported")

        code, body = await c.api("n1", "DELETE", "/api/v1/bridges/out")
        assert code == 200, body
        await c.wait_for(lambda: all(bridge_on(c, n) is None for n in c.node_ids), 10, "the bridge gone everywhere")
        code, body = await c.api("n0", "GET", "/api/v1/bridges/out")
        assert code == 404

    sim(scenario)
