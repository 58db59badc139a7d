"""Order across a takeover under load (issue 29, MQTT 4.6): a publisher keeps sending
while its subscriber's owner dies; the forwards that were on their way to the dead
owner are held by the publisher's node and merged into the session at the takeover,
while newer messages already reach the new owner directly once it has the session's
routes.  The held ones were published first, so they go first: each message reaches
the subscriber in the order it was published (a repeat only as a DUP resend)."""

from __future__ import annotations

import trio

from simulation.cluster import SimCluster
from tests.cluster_sim.helpers import check_stream, numbers, sim, wait_route
from tests.cluster_sim.test_replication import EXPIRY, wait_dead
from tests.cluster_sim.test_replication_takeover_load import Paced


def test_messages_held_for_the_dead_owner_are_delivered_before_newer_ones_that_came_directly() -> None:
    async def scenario(c: SimCluster) -> None:
        sub = await c.connect("n0", "order-sub", clean_start=False, session_expiry=EXPIRY)
        await sub.subscribe("order/q", 1)
        await wait_route(c, "order/q", {"n0"})
        pub = await c.connect("n1", "order-pub")
        paced = Paced()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(paced.run, pub, "order/q")
            await c.wait_for(lambda: len(sub.received) >= 100, 10, "the subscriber gets the stream")
            await c.kill("n0")
            await wait_dead(c, "n0")
            await sub.reconnect("n2", session_expiry=EXPIRY)
            assert sub.session_present
            at_takeover = paced.sent
            await c.wait_for(lambda: paced.sent >= at_takeover + 600, 10, "two seconds more of publishing")
            paced.stopped = True
        await c.wait_for(lambda: paced.acked <= set(numbers(sub.received)), 30, "every acknowledged message")
        stop = max(paced.acked) + 1
        check_stream([m for m in sub.received if int(m.payload) < stop], 1, stop)

    sim(scenario, session_replicas=2)
