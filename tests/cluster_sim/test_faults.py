"""Cluster cases that processes could not stage cheaply: a subscriber's node killed in
the middle of a QoS 2 stream, messages published while it was down, traffic both ways
across a netsplit, a will across nodes, a publisher's PUBACK across an unreachable link."""

from __future__ import annotations

import trio

from mqtt import Will
from simulation.cluster import SimCluster
from tests.cluster_sim.helpers import check_stream, sim, wait_route

EXPIRY = 3600


def test_kill9_of_the_subscribers_node_loses_no_acknowledged_qos2_message_and_repeats_none() -> None:
    """Persistent QoS 2 subscriber on n1, publisher on n0.  n1 is killed in the middle
    of the stream: what was acknowledged before is on n1's disk or held by n0 while n1
    is dead, and replayed when it is back; the subscriber, reconnecting to n1, gets
    every acknowledged message exactly once, in order."""

    async def scenario(c: SimCluster) -> None:
        sub = await c.connect("n1", "durable", clean_start=False, session_expiry=EXPIRY)
        await sub.subscribe("q2/#", 2)
        await wait_route(c, "q2/#", {"n1"})
        pub = await c.connect("n0", "q2-pub")
        acked = 0
        for i in range(20):
            assert await pub.publish("q2/x", f"{i}".encode(), qos=2) == 0
            acked += 1
        await c.kill("n1")
        await c.wait_for(lambda: c.gossip("n0").member_state("n1") == "dead", 60, "n0 sees n1 dead")
        for i in range(20, 40):
            assert await pub.publish("q2/x", f"{i}".encode(), qos=2) == 0  # held by n0 for n1
            acked += 1
        await c.restart("n1")
        await c.wait_converged(timeout=60)
        await sub.reconnect("n1", session_expiry=EXPIRY)
        assert sub.session_present
        await c.wait_for(lambda: len(sub.received) >= acked, 30, f"{acked} messages")
        await c.run_for(2.0)
        check_stream(sub.received, 2, acked)

    sim(scenario, durability="sync")


def test_traffic_both_ways_across_a_netsplit_is_delivered_after_the_heal() -> None:
    async def scenario(c: SimCluster) -> None:
        left, right = ["n0", "n1"], ["n2", "n3", "n4"]
        subs = {n: await c.connect(n, f"sub-{n}", clean_start=False, session_expiry=EXPIRY) for n in ("n0", "n4")}
        for n, s in subs.items():
            await s.subscribe(f"to/{n}/#", 1)
            await wait_route(c, f"to/{n}/#", {n})
        pubs = {n: await c.connect(n, f"pub-{n}") for n in ("n1", "n3")}
        c.cut(left, right)
        await c.wait_for(lambda: c.gossip("n1").member_state("n4") == "dead"
                         and c.gossip("n3").member_state("n0") == "dead", 60, "both sides see the split")
        for i in range(10):
            assert await pubs["n1"].publish(f"to/n4/{i}", f"{i}".encode(), qos=1) == 0
            assert await pubs["n3"].publish(f"to/n0/{i}", f"{i}".encode(), qos=1) == 0
        c.heal()
        await c.wait_converged(timeout=60)
        await c.wait_for(lambda: all(len(s.received) >= 10 for s in subs.values()), 30, "every message")
        await c.run_for(1.0)
        for s in subs.values():
            check_stream(s.received, 1, 10)

    sim(scenario, nodes=5)


def test_a_will_reaches_a_subscriber_on_another_node() -> None:
    async def scenario(c: SimCluster) -> None:
        watcher = await c.connect("n2", "watcher")
        await watcher.subscribe("status/#", 1)
        await wait_route(c, "status/#", {"n2"})
        device = await c.connect("n0", "device", will=Will("status/device", b"gone", qos=1))
        await device.drop()  # no DISCONNECT: the will goes out
        await c.wait_for(lambda: bool(watcher.received), 5, "the will")
        assert (watcher.received[0].topic, watcher.received[0].payload) == ("status/device", b"gone")
        polite = await c.connect("n0", "polite", will=Will("status/polite", b"gone", qos=1))
        await polite.disconnect()  # a clean DISCONNECT: no will
        await c.run_for(2.0)
        assert [m.topic for m in watcher.received] == ["status/device"]

    sim(scenario)


def test_puback_waits_for_a_remote_node_it_cannot_reach_then_comes_after_the_heal() -> None:
    """The forward to n1 stalls on a cut link (n1 not yet known dead): the publisher's
    PUBACK waits; once the link heals the message is delivered and acknowledged."""

    async def scenario(c: SimCluster) -> None:
        sub = await c.connect("n1", "frozen-sub")
        await sub.subscribe("hold/#", 1)
        await wait_route(c, "hold/#", {"n1"})
        pub = await c.connect("n0", "p")
        c.cut(["n0"], ["n1"])
        reasons: list[int | None] = []
        async with trio.open_nursery() as nursery:
            async def publish() -> None:
                reasons.append(await pub.publish("hold/1", b"wait for me", qos=1))

            nursery.start_soon(publish)
            await c.run_for(0.4)
            assert not reasons and not sub.received
            c.heal()
        assert reasons == [0]
        await c.wait_for(lambda: bool(sub.received), 5, "the message")
        assert sub.payloads() == [b"wait for me"]

    sim(scenario)


def test_a_subscribers_node_killed_while_it_was_offline_keeps_its_session_and_routes() -> None:
    async def scenario(c: SimCluster) -> None:
        sub = await c.connect("n1", "sleeper", clean_start=False, session_expiry=EXPIRY)
        await sub.subscribe("nap/#", 1)
        await wait_route(c, "nap/#", {"n1"})
        await sub.disconnect()
        await c.kill("n1")
        await c.restart("n1")
        await wait_route(c, "nap/#", {"n1"}, timeout=60)  # restored from n1's store, spread again
        pub = await c.connect("n2", "p")
        assert await pub.publish("nap/1", b"wake", qos=1) == 0
        await sub.reconnect("n1", session_expiry=EXPIRY)
        assert sub.session_present
        await c.wait_for(lambda: bool(sub.received), 5, "the message")
        assert sub.payloads() == [b"wake"]

    sim(scenario)


def test_a_one_way_partition_stalls_forwards_and_loses_nothing() -> None:
    """n0 -> n1 cut one way only: n1 stays alive for everyone (indirect probes through
    n2 answer for it), so n0 does not hold; its forwards to n1 stall on the link (and
    so do their PUBACKs: a liveness limit, not a loss).  After the heal every message
    arrives, in order."""

    async def scenario(c: SimCluster) -> None:
        sub = await c.connect("n1", "one-way-sub")
        await sub.subscribe("ow/#", 1)
        await wait_route(c, "ow/#", {"n1"})
        pub = await c.connect("n0", "one-way-pub")
        c.cut(["n0"], ["n1"], one_way=True)
        acked: list[int] = []
        async with trio.open_nursery() as nursery:
            async def publish_all() -> None:
                for i in range(10):
                    assert await pub.publish("ow/x", str(i).encode(), qos=1) == 0
                    acked.append(i)

            nursery.start_soon(publish_all)
            await c.run_for(20.0)
            assert not sub.received  # nothing crosses the cut
            assert c.gossip("n0").member_state("n1") in ("alive", "suspect")
            c.heal()
        await c.wait_for(lambda: len(sub.received) >= 10, 10, "every message")
        check_stream(sub.received, 1, 10)

    sim(scenario)
