"""A takeover before the owner's claim spread (issue 29): the owner dies right after
its client's CONNECT, before the node the client reconnects to heard the owner's
ownership claim; the replica holds the copy (sync replication acknowledged the
messages), so the reconnecting node asks the session's rendezvous replica set for a
copy and takes the session over from it instead of starting a new one."""

from __future__ import annotations

from replication.placement import replicas_for
from simulation.cluster import SimCluster
from tests.cluster_sim.helpers import numbers, sim
from tests.cluster_sim.test_replication import EXPIRY, replication, wait_dead


def test_a_reconnect_that_never_heard_the_owners_claim_takes_the_session_from_the_replica() -> None:
    async def scenario(c: SimCluster) -> None:
        replica = replicas_for("early", "n0", ["n0", "n1", "n2"], 2)[0]
        elsewhere = next(n for n in ("n1", "n2") if n != replica)
        # The owner dies before its claim reached `elsewhere`: that node loses every
        # word of the claim (gossip or push-pull) until the client reconnects there.
        # (Cutting the network instead lets a seed's push-pull carry it anyway.)
        register = c.cluster(elsewhere).handoffs.register
        merge = register.merge
        setattr(register, "merge", lambda claim, wall_ms: claim.client_id != "early" and merge(claim, wall_ms))
        sub = await c.connect("n0", "early", clean_start=False, session_expiry=EXPIRY)
        await sub.subscribe("early/q", 1)
        pub = await c.connect("n0", "early-pub")
        for i in range(5):
            assert await pub.publish("early/q", str(i).encode(), qos=1) == 0  # sync: on the replica
        await c.wait_for(lambda: len(sub.received) == 5, 5, "the 5 messages")
        await sub.drop()
        assert replication(c, replica).copies_held["early"].seq > 0
        await c.crash("n0")
        await wait_dead(c, "n0")
        assert register.get("early") is None
        await sub.reconnect(elsewhere, session_expiry=EXPIRY)
        setattr(register, "merge", merge)
        assert sub.session_present
        # The subscription came along: a new message reaches the client.
        pub2 = await c.connect(replica, "early-pub2")
        await c.wait_for(lambda: all(c.cluster(n).table.routes().get("early/q") == {elsewhere}
                                     for n in c.alive_nodes()), 10, "the route to the new owner")
        assert await pub2.publish("early/q", b"5", qos=1) == 0
        await c.wait_for(lambda: 5 in numbers(sub.received), 10, "the message after the takeover")
        assert sorted(set(numbers(sub.received))) == list(range(6))

    sim(scenario, session_replicas=2)
