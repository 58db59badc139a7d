"""A takeover from a replica under load (issue 29): what the cluster accepted for a
session while its owner was being found dead (held for the dead owner by the member
that forwarded it, acknowledged to the publisher) reaches the new owner at once, and
is not lost to the session's queue limit (`max_queued_messages` protects against a
slow consumer, not against the cluster's own recovery)."""

from __future__ import annotations

import trio

from simulation.cluster import SimCluster
from simulation.sim_client import SimClient
from tests.cluster_sim.helpers import numbers, sim, wait_route
from tests.cluster_sim.test_replication import EXPIRY, wait_dead

RATE = 300  # messages a second


class Paced:
    """A QoS 1 publisher at `RATE` messages a second, each publish in a task of its own
    (the acknowledgements of sync replication take longer than 1/RATE)."""

    def __init__(self) -> None:
        self.sent = 0
        self.acked: set[int] = set()
        self.stopped = False

    async def run(self, pub: SimClient, topic: str) -> None:
        async def one(i: int) -> None:
            if await pub.publish(topic, str(i).encode(), qos=1) == 0:
                self.acked.add(i)

        async with trio.open_nursery() as nursery:
            while not self.stopped:
                nursery.start_soon(one, self.sent)
                self.sent += 1
                await trio.sleep(1 / RATE)


def test_what_was_held_for_the_dead_owner_is_not_dropped_by_the_queue_limit_at_the_takeover() -> None:
    limit = 200  # the default 1,000 scaled to the simulator's faster detection of a dead member

    async def scenario(c: SimCluster) -> None:
        sub = await c.connect("n0", "busy-sub", clean_start=False, session_expiry=EXPIRY)
        await sub.subscribe("busy/q", 1)
        await wait_route(c, "busy/q", {"n0"})
        pub = await c.connect("n1", "busy-pub")
        paced = Paced()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(paced.run, pub, "busy/q")
            await c.wait_for(lambda: len(sub.received) >= 100, 10, "the subscriber gets the stream")
            await c.kill("n0")
            at_kill = paced.sent
            await wait_dead(c, "n0")
            held = paced.sent - at_kill
            await sub.reconnect("n2", session_expiry=EXPIRY)
            assert sub.session_present
            at_takeover = paced.sent
            await c.wait_for(lambda: paced.sent >= at_takeover + RATE, 10, "a second more of publishing")
            paced.stopped = True
        assert held > limit, f"only {held} messages published while n0 was found dead: no burst to test"
        await c.wait_for(lambda: paced.acked <= set(numbers(sub.received)), 30,
                         "every acknowledged message")
        assert c.running("n2").broker.stats.dropped_queue_full == 0

    sim(scenario, session_replicas=2, max_queued_messages=limit)
