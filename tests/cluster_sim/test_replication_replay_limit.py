"""Held messages replayed to a member back from the dead (issue 29): the cluster
accepted them for its sessions while it was down (acknowledged to their publishers),
so the replay is a recovery, not a slow consumer: the session's queue limit
(`max_queued_messages`) does not drop them, as at a takeover
(`test_replication_takeover_load`).  The same replay reaches a returning owner's
superseded copy, which is merged into the new owner's session."""

from __future__ import annotations

from simulation.cluster import SimCluster
from tests.cluster_sim.helpers import numbers, sim, wait_route
from tests.cluster_sim.test_replication import EXPIRY, wait_dead

LIMIT = 20
SENT = 100


def test_messages_held_for_a_dead_owner_and_replayed_when_it_is_back_pass_the_queue_limit() -> None:
    async def scenario(c: SimCluster) -> None:
        sub = await c.connect("n0", "away-sub", clean_start=False, session_expiry=EXPIRY)
        await sub.subscribe("away/q", 1)
        await wait_route(c, "away/q", {"n0"})
        await sub.disconnect()
        await c.kill("n0")
        await wait_dead(c, "n0")
        pub = await c.connect("n1", "away-pub")
        for i in range(SENT):  # held for n0 by n1, acknowledged
            assert await pub.publish("away/q", str(i).encode(), qos=1) == 0
        await c.restart("n0")
        await c.wait_for(lambda: "n0" in c.alive_nodes() and not c.cluster("n1").held.members.get("n0"), 30,
                         "the held messages replayed to n0")
        await c.wait_for(lambda: (s := c.running("n0").broker.sessions.get("away-sub")) is not None
                         and s.queued >= min(SENT, LIMIT), 10, "the replay queued on n0")
        await sub.reconnect("n0", session_expiry=EXPIRY)
        assert sub.session_present
        await c.wait_for(lambda: len(sub.received) >= SENT, 10, f"the {SENT} acknowledged messages")
        assert numbers(sub.received) == list(range(SENT))
        assert c.running("n0").broker.sessions["away-sub"].dropped == 0

    sim(scenario, session_replicas=2, max_queued_messages=LIMIT)
