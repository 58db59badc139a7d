"""A replica's record of the QoS 2 messages its copy's session completed survives the
replica's restart (issue 29 step 5, QoS 2 exactly once): a takeover from the restarted
replica still skips them when they arrive late by another way.  Here that way is the
publisher's node: the owner's acknowledgements of its forwards never reach it (a
one-way cut), so they are still on its link to the dead owner at the takeover, and
the new owner fetches them as held for it (`Replication.held_for`)."""

from __future__ import annotations

import trio

from simulation.cluster import SimCluster
from tests.cluster_sim.helpers import sim, wait_route
from tests.cluster_sim.test_replication import EXPIRY, replication, wait_dead

COUNT = 5


def test_a_restarted_replica_still_knows_the_qos2_messages_the_owner_completed() -> None:
    async def scenario(c: SimCluster) -> None:
        sub = await c.connect("n0", "given-sub", clean_start=False, session_expiry=EXPIRY)
        await sub.subscribe("given/q", 2)
        await wait_route(c, "given/q", {"n0"})
        await c.wait_for(lambda: bool((replication(c, "n0").describe("given-sub") or {}).get("replicas")), 10,
                         "a replica")
        view = replication(c, "n0").describe("given-sub")
        assert view is not None
        replica = view["replicas"][0]["node"]
        publisher_node = next(n for n in ("n1", "n2") if n != replica)
        pub = await c.connect(publisher_node, "given-pub")
        c.cut(["n0"], [publisher_node], one_way=True)  # its forwards arrive, their acks do not
        async with trio.open_nursery() as nursery:
            for i in range(COUNT):
                nursery.start_soon(pub.publish, "given/q", str(i).encode(), 2)
            session = c.running("n0").broker.sessions["given-sub"]
            await c.wait_for(lambda: len(sub.received) == COUNT and not session.inflight, 10,
                             "the subscriber completes the five")

            def given() -> int:
                copy = replication(c, replica).copies_held.get("given-sub")
                return 0 if copy is None else len(copy.given)

            await c.wait_for(lambda: given() == COUNT, 10, "the replica knows they were completed")
            await c.kill(replica)
            await c.restart(replica)
            await c.wait_for(lambda: replica in c.gossip("n0").alive_members(), 30, "the replica back")
            await c.run_for(3.0)  # its copy brought up to date by the owner
            await c.kill("n0")
            await c.wait_for(lambda: "n0" not in c.gossip(replica).alive_members(), 30, "n0 dead at the replica")
            c.heal()
            await sub.reconnect(replica, session_expiry=EXPIRY)
            assert sub.session_present
            await c.run_for(10.0)  # what the publisher's node held for n0 is fetched and merged
            nursery.cancel_scope.cancel()
        assert sorted(m.payload for m in sub.received) == [str(i).encode() for i in range(COUNT)]

    sim(scenario, session_replicas=2)
