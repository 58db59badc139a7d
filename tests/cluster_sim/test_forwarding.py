"""Routes and forwarding across the cluster, on the simulator: one broker as clients see
it, whichever node they connect to."""

from __future__ import annotations

import pytest

from simulation.cluster import SimCluster
from tests.cluster_sim.helpers import metrics, numbers, routes, sim, wait_route


@pytest.mark.parametrize("qos", [0, 1, 2])
def test_publish_on_n2_reaches_a_subscriber_on_n0_in_order_once(qos: int) -> None:
    async def scenario(c: SimCluster) -> None:
        sub = await c.connect("n0", "sub-a")
        assert await sub.subscribe("plant/+/temp", qos) == qos
        await wait_route(c, "plant/+/temp", {"n0"})
        pub = await c.connect("n2", "pub-c")
        for i in range(20):
            await pub.publish(f"plant/{i}/temp", str(i).encode(), qos=qos)
        await c.wait_for(lambda: len(sub.received) >= 20, 5, "20 messages")
        await c.run_for(1.0)  # anything more (a loop, a duplicate) would arrive by now
        assert numbers(sub.received) == list(range(20))  # order kept across the hop
        assert {m.qos for m in sub.received} == {qos}

    sim(scenario)


def test_subscribers_on_every_node_each_get_one_copy() -> None:
    async def scenario(c: SimCluster) -> None:
        subs = [await c.connect(n, f"s-{n}", protocol=4) for n in c.node_ids]
        for s in subs:
            await s.subscribe("all/#", 1)
        await wait_route(c, "all/#", set(c.node_ids))
        pub = await c.connect("n1", "p")
        assert await pub.publish("all/x", b"fan", qos=1) == 0
        await c.wait_for(lambda: all(s.received for s in subs), 5, "every subscriber")
        await c.run_for(1.0)
        assert [s.payloads() for s in subs] == [[b"fan"]] * 3

    sim(scenario)


def test_ten_nodes_every_node_reaches_a_new_subscription() -> None:
    """What tests/cluster/test_ten_nodes did with processes: a subscription on one node
    is reached by a publish from each of the nine others."""

    async def scenario(c: SimCluster) -> None:
        pubs = {n: await c.connect(n, f"pub-{n}") for n in c.node_ids[1:]}
        for round_ in range(2):
            topic = f"conv/{round_}"
            sub = await c.connect("n0", f"conv-sub-{round_}")
            await sub.subscribe(topic, 1)
            started = c.clock.now()
            await wait_route(c, topic, {"n0"})
            converged = c.clock.now() - started
            assert converged < 2.0, f"route took {converged:.2f} virtual s to reach every node"
            for n, pub in pubs.items():
                assert await pub.publish(topic, n.encode(), qos=1) == 0
            await c.wait_for(lambda: len(sub.received) == 9, 5, "one message from each other node")
            assert sorted(sub.payloads()) == sorted(n.encode() for n in pubs)

    sim(scenario, nodes=10)


def test_shared_subscription_is_round_robin_across_nodes() -> None:
    async def scenario(c: SimCluster) -> None:
        workers = [await c.connect(n, f"worker-{n}") for n in ("n0", "n1")]
        for w in workers:
            await w.subscribe("$share/workers/jobs/#", 1)
        await wait_route(c, "$share/workers/jobs/#", {"n0", "n1"})
        pub = await c.connect("n2", "p")
        for i in range(20):
            await pub.publish(f"jobs/{i}", str(i).encode(), qos=1)
        await c.wait_for(lambda: sum(len(w.received) for w in workers) >= 20, 5, "20 jobs")
        await c.run_for(1.0)
        got = [numbers(w.received) for w in workers]
        assert sorted(got[0] + got[1]) == list(range(20))  # each job once, cluster-wide
        assert len(got[0]) == len(got[1]) == 10  # round-robin over the nodes with members

    sim(scenario)


def test_retained_message_is_cluster_wide() -> None:
    async def scenario(c: SimCluster) -> None:
        pub = await c.connect("n2", "p")
        assert await pub.publish("state/valve", b"closed", qos=1, retain=True) == 0
        await c.wait_for(lambda: all(c.node(n).broker.retained.get("state/valve") is not None  # type: ignore[union-attr]
                                     for n in c.node_ids), 5, "the retained message on every node")
        late = await c.connect("n0", "late")
        await late.subscribe("state/#", 1)
        await c.wait_for(lambda: bool(late.received), 5, "the retained message")
        m = late.received[0]
        assert (m.topic, m.payload, m.retain) == ("state/valve", b"closed", True)
        # Cleared on another node: gone everywhere.
        other = await c.connect("n1", "clear")
        await other.publish("state/valve", b"", qos=1, retain=True)
        await c.wait_for(lambda: all(c.node(n).broker.retained.get("state/valve") is None  # type: ignore[union-attr]
                                     for n in c.node_ids), 5, "the retained message cleared everywhere")

    sim(scenario)


def test_a_restarted_node_pulls_the_retained_messages() -> None:
    async def scenario(c: SimCluster) -> None:
        await c.kill("n0")
        pub = await c.connect("n2", "p")
        await pub.publish("state/door", b"open", qos=1, retain=True)
        await c.restart("n0")
        await c.wait_converged()
        late = await c.connect("n0", "late")
        await late.subscribe("state/#", 1)
        await c.wait_for(lambda: bool(late.received), 5, "the retained message from the others")
        assert late.received[0].payload == b"open"

    sim(scenario)


def test_unsubscribe_removes_the_route_everywhere() -> None:
    async def scenario(c: SimCluster) -> None:
        sub = await c.connect("n0", "u")
        await sub.subscribe("gone/soon", 1)
        await wait_route(c, "gone/soon", {"n0"})
        await sub.unsubscribe("gone/soon")
        await wait_route(c, "gone/soon", set())
        await sub.subscribe("back/again", 1)
        await wait_route(c, "back/again", {"n0"})
        await sub.disconnect()  # a clean session's routes go with it
        await wait_route(c, "back/again", set())

    sim(scenario)


def test_kill9_of_a_node_removes_its_routes_and_does_not_hang_publishers() -> None:
    async def scenario(c: SimCluster) -> None:
        sub = await c.connect("n1", "b-sub")
        await sub.subscribe("b/only", 1)
        await wait_route(c, "b/only", {"n1"})
        await c.kill("n1")
        await c.wait_for(lambda: all("b/only" not in routes(c, n) for n in ("n0", "n2")), 30, "n1's routes dropped")
        pub = await c.connect("n0", "p")
        with_timeout = c.clock.now()
        assert await pub.publish("b/only", b"x", qos=1) is not None
        assert c.clock.now() - with_timeout < 1.0

    sim(scenario)


def test_forwarding_shows_in_metrics() -> None:
    async def scenario(c: SimCluster) -> None:
        sub = await c.connect("n0", "m")
        await sub.subscribe("metrics/x", 1)
        await wait_route(c, "metrics/x", {"n0"})
        pub = await c.connect("n2", "p")
        await pub.publish("metrics/x", b"1", qos=1)
        samples = dict(line.rsplit(" ", 1) for line in (await metrics(c, "n2")).splitlines()
                       if line.startswith("meshd_"))
        assert samples['meshd_members{state="alive"}'] == "3"
        assert float(samples["meshd_forwarded_out_total"]) >= 1
        assert float(samples["meshd_routes"]) >= 1

    sim(scenario)


def test_sys_topics_show_the_members() -> None:
    async def scenario(c: SimCluster) -> None:
        sub = await c.connect("n0", "sys")
        await sub.subscribe("$SYS/mesh/members/#", 0)
        await sub.subscribe("$SYS/mesh/members", 0)

        def latest() -> dict[str, bytes]:
            return {m.topic: m.payload for m in sub.received}

        # Retained from the node's first rounds, then updated as the members are seen.
        await c.wait_for(lambda: latest().get("$SYS/mesh/members/count") == b"3", 5, "3 members in $SYS")
        await c.wait_for(lambda: latest().get("$SYS/mesh/members") == b'["n0", "n1", "n2"]', 5, "the member list")

    sim(scenario, sys_interval=0.5)


@pytest.mark.parametrize("mode", ["batch", "sync"])
def test_a_forwarded_publish_is_acknowledged_by_the_receiving_nodes_rule(mode: str) -> None:
    """The publisher's PUBACK waits for the node with the subscriber under that node's
    rule: in `sync` until what it wrote is on its disk (here a disk that takes 2 s per
    commit), in `batch` not at all (the store's window bounds what a crash may lose)."""

    async def scenario(c: SimCluster) -> None:
        sub = await c.connect("n0", "fwd-sub", clean_start=False, session_expiry=3600)
        await sub.subscribe("fwd/+", 1)  # persistent: every forwarded message changes n0's store
        await wait_route(c, "fwd/+", {"n0"})
        pub = await c.connect("n1", "fwd-pub")
        c.slow_disk("n0", 2.0)
        waits = []
        for i in range(3):
            started = c.clock.now()
            assert await pub.publish(f"fwd/{i}", str(i).encode(), qos=1) == 0
            waits.append(c.clock.now() - started)
        await c.wait_for(lambda: len(sub.received) == 3, 10, "3 messages")
        assert sub.payloads() == [b"0", b"1", b"2"]
        if mode == "sync":
            assert min(waits) > 1.5, waits  # one 2 s commit (it may have begun a little before)
        else:
            assert max(waits) < 0.1, waits

    sim(scenario, durability=mode, durability_batch_ms=4000)
