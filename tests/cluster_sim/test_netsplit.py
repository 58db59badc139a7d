"""Netsplits and unreachable members on the simulator: QoS >= 1 messages for a member
that cannot be reached are held and replayed in order when it is back; a minority side
can be told to refuse work; a killed holder keeps what it held."""

from __future__ import annotations

from netsplit.monitor import PartitionMonitor
from simulation.cluster import SimCluster
from tests.cluster_sim.helpers import sim, wait_route

EXPIRY = 3600


async def cluster_view(c: SimCluster, node_id: str) -> dict[str, object]:
    code, body = await c.api(node_id, "GET", "/api/v1/cluster")
    assert code == 200 and isinstance(body, dict)
    return body


def partition_view(c: SimCluster, node_id: str) -> dict[str, object]:
    monitor = c.running(node_id).partitions
    assert isinstance(monitor, PartitionMonitor)
    return monitor.snapshot()


async def see(c: SimCluster, observers: list[str], member: str, state: str, timeout: float = 60.0) -> None:
    await c.wait_for(lambda: all(c.gossip(o).member_state(member) == state for o in observers), timeout,
                     f"{observers} see {member} {state}")


def test_a_3_2_netsplit_holds_messages_for_the_other_side_and_replays_them_in_order_on_heal() -> None:
    async def scenario(c: SimCluster) -> None:
        majority, minority = ["n0", "n1", "n2"], ["n3", "n4"]
        sub = await c.connect("n3", "held-sub", clean_start=False, session_expiry=EXPIRY)
        await sub.subscribe("held/#", 1)
        await wait_route(c, "held/#", {"n3"})
        await sub.disconnect()
        pub = await c.connect("n0", "held-pub")
        c.cut(majority, minority)
        for m in minority:
            await see(c, majority, m, "dead")
        await c.wait_for(lambda: partition_view(c, "n0")["partitioned"] is True, 30, "n0 sees the partition")
        assert (await cluster_view(c, "n0"))["partitioned"] is True  # what the API shows
        for i in range(30):
            assert await pub.publish(f"held/{i}", f"m{i}".encode(), qos=1) == 0  # acknowledged: held on n0's disk
        assert await pub.publish("held/q0", b"not held", qos=0) is None
        held = (await cluster_view(c, "n0"))["held"]  # what the API (the dashboard's Cluster page) shows
        assert held["n3"] == 30 and sum(held.values()) == 30
        c.heal()
        await c.wait_converged(timeout=60)
        await sub.reconnect("n3", session_expiry=EXPIRY)
        assert sub.session_present
        await c.wait_for(lambda: len(sub.received) >= 30, 20, "the 30 held messages")
        await c.run_for(1.0)
        assert sub.payloads() == [f"m{i}".encode() for i in range(30)]  # in order; QoS 0 is not held
        await c.wait_for(lambda: not any(c.cluster(n).held.members for n in c.node_ids), 30, "no held traffic left")

    sim(scenario, nodes=5)


def test_operations_can_be_refused_on_the_minority_side() -> None:
    """allow_*_during_netsplit off.  n0 cut off alone: n2 is on the majority side and
    keeps serving.  n2 cut off alone: it answers CONNECT with 0x88, SUBSCRIBE and
    PUBLISH with 0x83; after the heal, all is accepted again."""

    async def scenario(c: SimCluster) -> None:
        early = await c.connect("n2", "early")
        c.cut(["n0"], ["n1", "n2"])
        await c.wait_for(lambda: partition_view(c, "n2")["partitioned"] is True, 60, "n2 sees a partition")
        assert partition_view(c, "n2")["minority"] is False
        assert (await c.connect("n2", "during-majority")).connack_reason == 0
        assert await early.subscribe("m/#", 1) == 1
        c.heal()
        await c.wait_for(lambda: partition_view(c, "n2")["partitioned"] is False, 120, "n2 sees the heal")
        c.cut(["n2"], ["n0", "n1"])
        # Alone, n2 accuses only once Lifeguard lets it (its probes get no nacks).
        await c.wait_for(lambda: partition_view(c, "n2")["minority"] is True, 120, "n2 in the minority")
        assert (await cluster_view(c, "n2"))["minority"] is True  # what the API shows
        late = await c.connect("n2", "late")
        assert late.connack_reason == 0x88 and not late.connected
        assert await early.subscribe("x/#", 1) == 0x83
        assert await early.publish("x/y", b"no", qos=1) == 0x83
        c.heal()
        await c.wait_for(lambda: partition_view(c, "n2")["partitioned"] is False, 120, "n2 sees the heal")
        assert await early.subscribe("x/#", 1) == 1
        assert (await c.connect("n2", "later")).connack_reason == 0

    sim(scenario, allow_connect_during_netsplit=False, allow_subscribe_during_netsplit=False,
        allow_publish_during_netsplit=False)


def test_held_messages_survive_a_kill9_and_restart_of_the_holder() -> None:
    async def scenario(c: SimCluster) -> None:
        sub = await c.connect("n0", "held-restart", clean_start=False, session_expiry=EXPIRY)
        await sub.subscribe("kept/#", 1)
        await wait_route(c, "kept/#", {"n0"})
        await sub.disconnect()
        c.cut(["n0"], ["n1", "n2"])
        await see(c, ["n2"], "n0", "dead")
        pub = await c.connect("n2", "kept-pub")
        for i in range(10):
            assert await pub.publish(f"kept/{i}", f"k{i}".encode(), qos=1) == 0
        await pub.disconnect()
        await c.kill("n2")  # no clean shutdown: the held messages must already be synced
        await c.restart("n2")
        c.heal()
        await c.wait_converged(timeout=60)
        await sub.reconnect("n0", session_expiry=EXPIRY)
        await c.wait_for(lambda: len(sub.received) >= 10, 30, "the 10 held messages")
        assert sub.payloads() == [f"k{i}".encode() for i in range(10)]

    sim(scenario)
