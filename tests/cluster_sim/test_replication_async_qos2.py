"""QoS 2 exactly once across the owner's death in `async` replication (issue 29): the
owner acknowledges publishers alone, but a QoS 2 PUBLISH to a subscriber (and its
PUBREL) leaves only once its packet id state is on the replicas, so the node that
takes the session over sends it again under the same packet id (or sends the PUBREL),
never as a new message the client would take twice."""

from __future__ import annotations

import trio

from simulation.cluster import SimCluster
from tests.cluster_sim.helpers import numbers, sim, wait_route
from tests.cluster_sim.test_replication import EXPIRY, wait_dead

SENT = 300


def test_qos2_messages_the_client_took_before_the_owner_died_are_not_delivered_again() -> None:
    async def scenario(c: SimCluster) -> None:
        # One message in flight at a time: the rest wait in the session's queue, and the
        # owner moves each into flight as the one before completes.
        sub = await c.connect("n0", "q2-sub", clean_start=False, session_expiry=EXPIRY, receive_maximum=1)
        await sub.subscribe("q2/t", 2)
        await wait_route(c, "q2/t", {"n0"})
        pub = await c.connect("n1", "q2-pub")
        acked: set[int] = set()

        async def one(i: int) -> None:
            if await pub.publish("q2/t", str(i).encode(), qos=2) == 0:
                acked.add(i)

        async with trio.open_nursery() as nursery:
            for i in range(SENT):
                nursery.start_soon(one, i)
                await trio.sleep(0)
        assert len(acked) == SENT
        # Killed while the client takes the stream one message at a time.
        await c.wait_for(lambda: len(sub.received) >= SENT // 3, 30, "a third of the stream at the subscriber")
        await c.kill("n0")
        await wait_dead(c, "n0")
        await sub.reconnect("n2", session_expiry=EXPIRY)
        assert sub.session_present
        await c.run_for(10.0)
        got = numbers(sub.received)
        twice = sorted({n for n in got if got.count(n) > 1})
        assert not twice, f"QoS 2 messages delivered twice: {twice}"

    sim(scenario, session_replicas=2, session_replication="async")
