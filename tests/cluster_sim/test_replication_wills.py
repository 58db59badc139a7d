"""Wills travel with a replicated session (issue 29): the owner dies, the client takes
its session over from the replica on another node, and its will is honoured there as
on the owner: sent when its connection was lost with no delay (or its delay passed
while no one could send it), cancelled by the reconnect within its delay."""

from __future__ import annotations

from mqtt import Properties, Will
from replication.changes import ReplicaCopy
from simulation.cluster import SimCluster
from tests.cluster_sim.helpers import sim, wait_route
from tests.cluster_sim.test_replication import EXPIRY, replication, wait_dead


def held(c: SimCluster, client_id: str) -> ReplicaCopy | None:
    """The copy of the session on n1 or n2 (its replica: its owner is n0)."""
    return replication(c, "n1").copies_held.get(client_id) or replication(c, "n2").copies_held.get(client_id)


async def known_everywhere(c: SimCluster, client_id: str) -> None:
    """Until every node knows n0 owns the session and its replica holds a copy: a node
    that never heard of the owner's claim opens a new session, not a takeover."""
    await c.wait_for(lambda: held(c, client_id) is not None
                     and all(c.cluster(n).handoffs.register.get(client_id) is not None for n in c.alive_nodes()),
                     10, f"{client_id}'s claim and copy")


def will(topic: str, payload: bytes, delay: int | None = None) -> Will:
    return Will(topic, payload, 1, False, Properties(will_delay_interval=delay))


def test_a_will_without_delay_is_sent_once_by_the_node_that_takes_the_session_over() -> None:
    async def scenario(c: SimCluster) -> None:
        watcher = await c.connect("n1", "watcher")
        await watcher.subscribe("wills/#", 1)
        await wait_route(c, "wills/#", {"n1"})
        dev = await c.connect("n0", "dev", clean_start=False, session_expiry=EXPIRY, will=will("wills/dev", b"gone"))
        await dev.subscribe("dev/cmd", 1)
        await known_everywhere(c, "dev")
        await c.wait_for(lambda: (copy := held(c, "dev")) is not None and copy.will is not None, 10,
                         "the will on the replica")
        await c.crash("n0")
        await wait_dead(c, "n0")
        assert watcher.payloads("wills/dev") == []  # no one sent it: the owner died with the connection
        await dev.reconnect("n2", session_expiry=EXPIRY)
        assert dev.session_present
        await c.wait_for(lambda: watcher.payloads("wills/dev") == [b"gone"], 10, "the will, from n2")
        await c.run_for(5.0)
        assert watcher.payloads("wills/dev") == [b"gone"]

    sim(scenario, session_replicas=2)


def test_a_delayed_will_is_cancelled_by_the_reconnect_and_sent_when_its_delay_passed_unseen() -> None:
    async def scenario(c: SimCluster) -> None:
        watcher = await c.connect("n1", "watcher")
        await watcher.subscribe("wills/#", 1)
        await wait_route(c, "wills/#", {"n1"})
        # Connected at the owner's death, back within its 30 s delay: the will is cancelled.
        back = await c.connect("n0", "back", clean_start=False, session_expiry=EXPIRY,
                               will=will("wills/back", b"back gone", delay=30))
        # Gone abnormally while its owner lived (the owner holds the will for 10 s), the
        # owner dies before it is due, the client comes back after: it is sent then.
        late = await c.connect("n0", "late", clean_start=False, session_expiry=EXPIRY,
                               will=will("wills/late", b"late gone", delay=10))
        await late.drop()
        started = c.clock.now()
        await c.wait_for(lambda: (copy := held(c, "late")) is not None and copy.will is not None
                         and copy.disconnected_at is not None, 5, "late's pending will on its replica")
        await known_everywhere(c, "back")
        await known_everywhere(c, "late")
        await c.crash("n0")
        await wait_dead(c, "n0")
        await back.reconnect("n2", session_expiry=EXPIRY)
        assert back.session_present
        await c.run_for(max(0.0, started + 15.0 - c.clock.now()))
        assert watcher.payloads("wills/late") == []  # due, but its owner is dead
        await late.reconnect("n2", session_expiry=EXPIRY)
        assert late.session_present
        await c.wait_for(lambda: watcher.payloads("wills/late") == [b"late gone"], 10, "late's will")
        await c.run_for(40.0)  # past back's delay: its will stays cancelled
        assert watcher.payloads("wills/back") == []
        assert watcher.payloads("wills/late") == [b"late gone"]

    sim(scenario, session_replicas=2)
