"""Session replication on the simulator: a persistent session survives its node's
death, taken over from a replica with nothing acknowledged lost."""

from __future__ import annotations

from replication.service import Replication
from simulation.cluster import SimCluster
from tests.cluster_sim.helpers import numbers, sim, wait_route

EXPIRY = 3600


def replication(c: SimCluster, node_id: str) -> Replication:
    replicas = c.cluster(node_id).handoffs.replicas
    assert isinstance(replicas, Replication)
    return replicas


async def wait_dead(c: SimCluster, dead: str, timeout: float = 30.0) -> None:
    await c.wait_for(lambda: all(dead not in c.gossip(n).alive_members() for n in c.alive_nodes()), timeout,
                     f"{dead} seen dead")


def test_queued_messages_survive_the_owner_kill_and_come_from_the_replica() -> None:
    async def scenario(c: SimCluster) -> None:
        sub = await c.connect("n0", "rep-sub", clean_start=False, session_expiry=EXPIRY)
        await sub.subscribe("rep/q", 1)
        await wait_route(c, "rep/q", {"n0"})
        await sub.disconnect()
        pub = await c.connect("n1", "rep-pub")
        for i in range(100):
            assert await pub.publish("rep/q", str(i).encode(), qos=1) == 0
        await c.kill("n0")
        await wait_dead(c, "n0")
        await sub.reconnect("n2", session_expiry=EXPIRY)
        assert sub.session_present
        await c.wait_for(lambda: len(sub.received) >= 100, 10, "the 100 acknowledged messages")
        assert numbers(sub.received) == list(range(100))
        # The subscription came along: a new message reaches the client on n2.
        await wait_route(c, "rep/q", {"n2"}, nodes=["n1", "n2"])
        assert await pub.publish("rep/q", b"100", qos=1) == 0
        await c.wait_for(lambda: len(sub.received) == 101, 10, "the message after the takeover")

    sim(scenario, session_replicas=2)


def test_with_one_copy_the_same_kill_loses_the_session() -> None:
    """The control: `session_replicas` 1 is today's behaviour (the session was only on
    the dead node: a new one, nothing of the queue)."""

    async def scenario(c: SimCluster) -> None:
        sub = await c.connect("n0", "lone-sub", clean_start=False, session_expiry=EXPIRY)
        await sub.subscribe("lone/q", 1)
        await wait_route(c, "lone/q", {"n0"})
        await sub.disconnect()
        pub = await c.connect("n1", "lone-pub")
        for i in range(10):
            assert await pub.publish("lone/q", str(i).encode(), qos=1) == 0
        await c.crash("n0")
        await wait_dead(c, "n0")
        await sub.reconnect("n2", session_expiry=EXPIRY)
        assert not sub.session_present

    sim(scenario, session_replicas=1)


def test_inflight_messages_are_resent_with_dup_and_qos2_arrives_once() -> None:
    """A connected v5 subscriber that does not acknowledge: its QoS 1 and 2 messages are
    in flight at the owner when the owner dies; on the node it reconnects to they are
    sent again with DUP=1 under their packet ids, and each QoS 2 message completes once."""

    async def scenario(c: SimCluster) -> None:
        sub = await c.connect("n0", "slow-sub", clean_start=False, session_expiry=EXPIRY, ack_delay=3600.0)
        await sub.subscribe("slow/#", 2)
        await wait_route(c, "slow/#", {"n0"})
        pub = await c.connect("n1", "slow-pub")
        for i in range(5):
            assert await pub.publish("slow/1", f"1:{i}".encode(), qos=1) == 0
            assert await pub.publish("slow/2", f"2:{i}".encode(), qos=2) == 0
        await c.wait_for(lambda: len(sub.received) >= 10, 10, "the 10 messages, unacknowledged")
        first = {(m.payload, m.packet_id) for m in sub.received if m.qos == 1}
        await c.run_for(1.0)  # the in-flight state reached the replica
        await c.crash("n0")
        await wait_dead(c, "n0")
        sub.ack_delay = 0.0
        await sub.reconnect("n2", session_expiry=EXPIRY)
        assert sub.session_present
        await c.wait_for(lambda: len(sub.received) >= 15, 10, "the QoS 1 messages again")
        await c.run_for(2.0)
        again = sub.received[10:]
        # QoS 1: sent again, DUP, same packet ids; QoS 2: the client holds their packet
        # ids (PUBREC sent), so the DUP resends are not new messages: each arrived once.
        assert all(m.dup and m.qos == 1 for m in again)
        assert {(m.payload, m.packet_id) for m in again} == first
        assert sorted(m.payload for m in sub.received if m.qos == 2) == [f"2:{i}".encode() for i in range(5)]

    sim(scenario, session_replicas=2)


async def publish_with_slow_replica(c: SimCluster, client_id: str, disk_seconds: float) -> tuple[float, str]:
    """A persistent session on n0 with one replica whose disk takes `disk_seconds` per
    commit; one QoS 1 publish from another node: (seconds to its PUBACK, the replica)."""
    sub = await c.connect("n0", client_id, clean_start=False, session_expiry=EXPIRY)
    await sub.subscribe(f"{client_id}/q", 1)
    await wait_route(c, f"{client_id}/q", {"n0"})
    await sub.disconnect()
    await c.run_for(2.0)  # the session's snapshot reached its replica
    replicas = (replication(c, "n0").describe(client_id) or {}).get("replicas")
    assert isinstance(replicas, list) and len(replicas) == 1
    replica = str(replicas[0]["node"])
    pub = await c.connect("n1" if replica != "n1" else "n2", f"{client_id}-pub")
    c.slow_disk(replica, disk_seconds)
    start = c.clock.now()
    assert await pub.publish(f"{client_id}/q", b"x", qos=1) == 0
    return c.clock.now() - start, replica


def test_sync_acknowledgement_waits_for_the_replica_and_async_does_not() -> None:
    async def scenario(c: SimCluster) -> None:
        waited, _ = await publish_with_slow_replica(c, "gate", 1.0)
        assert 1.0 <= waited < 1.5, f"acknowledged after {waited:.3f} s"

    sim(scenario, session_replicas=2)

    async def scenario_async(c: SimCluster) -> None:
        waited, _ = await publish_with_slow_replica(c, "gate", 1.0)
        assert waited < 0.5, f"acknowledged after {waited:.3f} s"

    sim(scenario_async, session_replicas=2, session_replication="async")


def test_a_replica_that_does_not_answer_is_replaced_and_the_ack_waits_for_the_new_one() -> None:
    async def scenario(c: SimCluster) -> None:
        waited, stalled = await publish_with_slow_replica(c, "stall", 10.0)
        # Bounded: the replica's 2 s, then the new replica's snapshot.
        assert 2.0 <= waited < 3.0, f"acknowledged after {waited:.3f} s"
        replicas = (replication(c, "n0").describe("stall") or {}).get("replicas")
        assert isinstance(replicas, list) and [r["node"] for r in replicas] != [stalled]
        assert replication(c, "n0").stats.replaced == 1

    sim(scenario, session_replicas=2)


def test_fewer_members_than_copies_runs_degraded_and_nothing_stalls() -> None:
    async def scenario(c: SimCluster) -> None:
        sub = await c.connect("n0", "alone", clean_start=False, session_expiry=EXPIRY)
        await sub.subscribe("alone/q", 1)
        await wait_route(c, "alone/q", {"n0"})
        await sub.disconnect()
        await c.crash("n1")
        await wait_dead(c, "n1")
        pub = await c.connect("n0", "alone-pub")
        start = c.clock.now()
        for i in range(5):
            assert await pub.publish("alone/q", str(i).encode(), qos=1) == 0
        assert c.clock.now() - start < 1.0
        await c.run_for(2.0)
        stats = replication(c, "n0").stats
        assert stats.under_replicated == 1 and stats.degraded_episodes == 1

    sim(scenario, nodes=2, session_replicas=2)


def test_the_operator_sees_owner_replicas_sequence_lag_and_epoch() -> None:
    async def scenario(c: SimCluster) -> None:
        sub = await c.connect("n0", "shown", clean_start=False, session_expiry=EXPIRY)
        await sub.subscribe("shown/q", 1)
        await wait_route(c, "shown/q", {"n0"})
        await sub.disconnect()
        pub = await c.connect("n1", "shown-pub")
        for i in range(3):
            assert await pub.publish("shown/q", str(i).encode(), qos=1) == 0
        code, body = await c.api("n2", "GET", "/api/v1/clients/shown")
        assert code == 200 and isinstance(body, dict)
        assert body["node"] == "n0"
        rep = body["replication"]
        assert rep["copies"] == 2 and rep["mode"] == "sync" and rep["epoch"]
        [replica] = rep["replicas"]
        assert replica["node"] in ("n1", "n2") and replica["lag"] == 0 and replica["seq"] == rep["seq"]
        metrics = (await c.api("n0", "GET", "/metrics"))[1]
        assert isinstance(metrics, str)
        assert "meshd_replication_under_replicated_sessions 0" in metrics
        assert "meshd_replication_lag_changes 0" in metrics

    sim(scenario, session_replicas=2)


def test_the_old_owner_back_from_the_dead_loses_and_the_client_stays_connected() -> None:
    async def scenario(c: SimCluster) -> None:
        sub = await c.connect("n0", "phoenix", clean_start=False, session_expiry=EXPIRY)
        await sub.subscribe("phx/q", 1)
        await wait_route(c, "phx/q", {"n0"})
        await sub.disconnect()
        pub = await c.connect("n1", "phx-pub")
        for i in range(20):
            assert await pub.publish("phx/q", str(i).encode(), qos=1) == 0
        await c.kill("n0")
        await wait_dead(c, "n0")
        await sub.reconnect("n2", session_expiry=EXPIRY)
        assert sub.session_present
        await c.wait_for(lambda: len(sub.received) >= 20, 10, "the 20 messages")
        await c.restart("n0")
        await c.wait_converged(timeout=60)
        await c.run_for(10.0)  # n0's copy is pushed to n2 and merged there
        assert sub.connected
        assert "phoenix" not in c.running("n0").broker.sessions
        await wait_route(c, "phx/q", {"n2"})
        assert await pub.publish("phx/q", b"20", qos=1) == 0
        await c.wait_for(lambda: len(sub.received) >= 21, 10, "the message after the return")
        await c.run_for(2.0)
        assert numbers(sub.received) == list(range(21))

    sim(scenario, session_replicas=2)


def test_replication_is_switched_on_at_run_time_by_a_cluster_config_event() -> None:
    """`session_replicas` 1 at start; set to 2 through the API of one node: every node
    applies it, and a session that existed before gets its copy (re-replication)."""

    async def scenario(c: SimCluster) -> None:
        sub = await c.connect("n0", "late", clean_start=False, session_expiry=EXPIRY)
        await sub.subscribe("late/q", 1)
        await wait_route(c, "late/q", {"n0"})
        await sub.disconnect()
        assert replication(c, "n0").describe("late") is None
        code, _ = await c.api("n1", "PUT", "/api/v1/config/session_replicas", {"value": 2})
        assert code == 200
        await c.wait_for(lambda: all(replication(c, n).copies == 2 for n in c.alive_nodes()), 10, "2 copies everywhere")
        await c.wait_for(lambda: len((replication(c, "n0").describe("late") or {}).get("replicas", [])) == 1, 10,
                         "the session's copy")
        pub = await c.connect("n1", "late-pub")
        for i in range(5):
            assert await pub.publish("late/q", str(i).encode(), qos=1) == 0
        await c.crash("n0")
        await wait_dead(c, "n0")
        await sub.reconnect("n2", session_expiry=EXPIRY)
        assert sub.session_present
        await c.wait_for(lambda: len(sub.received) >= 5, 10, "the 5 messages")
        assert numbers(sub.received) == list(range(5))

    sim(scenario, session_replicas=1)


def test_after_a_handoff_the_new_owners_copy_wins_over_the_old_owners() -> None:
    """The session moves n0 -> n1 by a handoff (both alive), then n1 dies: the copy
    taken is n1's (the newest claim), not a stale one of n0's time."""

    async def scenario(c: SimCluster) -> None:
        sub = await c.connect("n0", "mover", clean_start=False, session_expiry=EXPIRY)
        await sub.subscribe("mv/q", 1)
        await wait_route(c, "mv/q", {"n0"})
        await sub.disconnect()
        pub = await c.connect("n2", "mv-pub")
        for i in range(10):
            assert await pub.publish("mv/q", str(i).encode(), qos=1) == 0
        await sub.reconnect("n1", session_expiry=EXPIRY)
        assert sub.session_present
        await c.wait_for(lambda: len(sub.received) >= 10, 10, "the first 10")
        await c.run_for(1.0)
        await sub.disconnect()
        await wait_route(c, "mv/q", {"n1"})
        for i in range(10, 20):
            assert await pub.publish("mv/q", str(i).encode(), qos=1) == 0
        await c.crash("n1")
        await wait_dead(c, "n1")
        await sub.reconnect("n2", session_expiry=EXPIRY)
        assert sub.session_present
        await c.wait_for(lambda: len(sub.received) >= 20, 10, "the next 10")
        await c.run_for(2.0)
        assert numbers(sub.received) == list(range(20))

    sim(scenario, session_replicas=2)
