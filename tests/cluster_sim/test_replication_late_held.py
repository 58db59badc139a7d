"""A held message fetched after the takeover (issue 29 step 5, the queue delivered in
order): a member cut off from the taker while the owner died could not be asked for
what it held for the dead owner at the takeover; once the cut heals, its newer messages
reach the taker directly while the held ones are fetched a little later
(`Replication._follow_held`).  Those go ahead of the newer ones from the same origin
still queued, so each publisher's messages reach the client in their order."""

from __future__ import annotations

import trio

from simulation.cluster import SimCluster
from tests.cluster_sim.helpers import check_stream, numbers, sim, wait_route
from tests.cluster_sim.test_replication import EXPIRY, replication, wait_dead
from tests.cluster_sim.test_replication_takeover_load import Paced


def test_held_messages_fetched_after_the_takeover_go_before_newer_ones_still_queued() -> None:
    async def scenario(c: SimCluster) -> None:
        sub = await c.connect("n0", "late-sub", clean_start=False, session_expiry=EXPIRY)
        await sub.subscribe("late/q", 1)
        await wait_route(c, "late/q", {"n0"})
        await c.wait_for(lambda: bool((replication(c, "n0").describe("late-sub") or {}).get("replicas")), 10,
                         "a replica")
        view = replication(c, "n0").describe("late-sub")
        assert view is not None
        taker = view["replicas"][0]["node"]  # it takes the session from its own copy
        publisher_node = next(n for n in ("n1", "n2", "n3") if n != taker)
        pub = await c.connect(publisher_node, "late-pub")
        paced = Paced()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(paced.run, pub, "late/q")
            await c.wait_for(lambda: len(sub.received) >= 100, 10, "the subscriber gets the stream")
            # The publisher's node cannot answer the taker: what it forwarded to n0 and
            # holds for it once n0 is dead is not fetched at the takeover.
            c.cut([publisher_node], [taker])
            await c.kill("n0")
            await c.wait_for(lambda: "n0" not in c.gossip(taker).alive_members(), 30, "n0 dead at the taker")
            await sub.reconnect(taker, session_expiry=EXPIRY)
            assert sub.session_present
            await sub.disconnect()  # what comes now is queued: the merge can order it
            await c.run_for(1.0)
            c.heal()
            at_heal = paced.sent
            await c.wait_for(lambda: paced.sent >= at_heal + 600, 10, "two seconds more of publishing")
            paced.stopped = True
        await wait_dead(c, "n0")
        await c.run_for(5.0)  # the held ones fetched (every 2 s)
        await sub.reconnect(taker, session_expiry=EXPIRY)
        await c.wait_for(lambda: paced.acked <= set(numbers(sub.received)), 30, "every acknowledged message")
        stop = max(paced.acked) + 1
        check_stream([m for m in sub.received if int(m.payload) < stop], 1, stop)

    sim(scenario, nodes=4, session_replicas=2, max_queued_messages=100_000)
