"""The log lines only a cluster produces (README "Logs"), on the simulator: a session
taken over from another node, and the messages held for an unreachable member
replayed when it is back."""

from __future__ import annotations

import logging

import pytest

from oplog import EVENT_ATTR, FIELDS_ATTR
from simulation.cluster import SimCluster
from tests.cluster_sim.helpers import sim, wait_route

EXPIRY = 3600


def lines(caplog: pytest.LogCaptureFixture, event: str) -> list[dict[str, object]]:
    out = []
    for r in caplog.records:
        if getattr(r, EVENT_ATTR, None) == event:
            assert r.getMessage().startswith(event + " ")
            out.append(getattr(r, FIELDS_ATTR))
    return out


def test_taken_over_from_a_node_and_held_messages_replayed(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)

    async def scenario(c: SimCluster) -> None:
        sub = await c.connect("n1", "roamer", clean_start=False, session_expiry=EXPIRY)
        await sub.subscribe("held/#", 1)
        await wait_route(c, "held/#", {"n1"})
        await sub.disconnect()
        await sub.reconnect("n2", session_expiry=EXPIRY)  # the session moves n1 -> n2
        assert sub.session_present
        (taken,) = [f for f in lines(caplog, "client.taken_over") if f["client_id"] == "roamer"]
        assert taken["from_node"] == "n1" and isinstance(taken["duration_ms"], float)
        await wait_route(c, "held/#", {"n2"})
        await sub.disconnect()

        pub = await c.connect("n0", "held-pub")
        c.cut(["n0", "n1"], ["n2"])
        await c.wait_for(lambda: c.gossip("n0").member_state("n2") == "dead", 60, "n0 sees n2 dead")
        for i in range(5):
            assert await pub.publish(f"held/{i}", b"x", qos=1) == 0  # held on n0 for n2
        assert lines(caplog, "held.replayed") == []
        c.heal()
        await c.wait_for(lambda: lines(caplog, "held.replayed"), 60, "the replay")
        assert lines(caplog, "held.replayed") == [{"member": "n2", "messages": 5}]

    sim(scenario, nodes=3)
