"""Session handoff on the simulator: a persistent client reconnects to another node and
finds its whole session there, whatever else is going on."""

from __future__ import annotations

from functools import partial

import pytest
import trio

from session_store.model import Session
from session_store.store import StoredSession

from simulation.cluster import SimCluster
from simulation.sim_client import SimClient
from tests.cluster_sim.helpers import check_stream, metrics, numbers, sim, status, wait_route

EXPIRY = 3600


async def subscribed_then_offline(c: SimCluster, node_id: str, client_id: str, topic_filter: str,
                                  qos: int = 1) -> SimClient:
    """A persistent v5 client that subscribes on `node_id`, waits until every node
    routes the filter there, and disconnects: its session waits on that node."""
    sub = await c.connect(node_id, client_id, clean_start=False, session_expiry=EXPIRY)
    await sub.subscribe(topic_filter, qos)
    await wait_route(c, topic_filter, {node_id})
    await sub.disconnect()
    return sub


async def sessions(c: SimCluster, node_id: str) -> int:
    count = (await status(c, node_id))["sessions"]
    assert isinstance(count, int)
    return count


def test_offline_queue_moves_to_the_node_the_client_reconnects_to() -> None:
    async def scenario(c: SimCluster) -> None:
        sub = await subscribed_then_offline(c, "n0", "mover", "move/#")
        pub = await c.connect("n2", "pub-c")
        for i in range(50):
            await pub.publish(f"move/{i}", str(i).encode(), qos=1)
        await sub.reconnect("n1", session_expiry=EXPIRY)
        assert sub.session_present
        await c.wait_for(lambda: len(sub.received) >= 50, 10, "the 50 queued messages")
        assert numbers(sub.received) == list(range(50))
        # The routes followed the session; n0 kept nothing.
        await wait_route(c, "move/#", {"n1"})
        await pub.publish("move/after", b"after", qos=1)
        await c.wait_for(lambda: len(sub.received) == 51, 5, "the message after the move")
        await c.run_for(1.0)
        assert sub.payloads()[50:] == [b"after"]
        assert await sessions(c, "n0") == 0
        assert 'meshd_handoffs_total{outcome="taken"} 1' in await metrics(c, "n1")
        assert 'meshd_handoffs_total{outcome="given"} 1' in await metrics(c, "n0")
        assert 'meshd_handoff_duration_ms{quantile="0.5"}' in await metrics(c, "n1")

    sim(scenario)


def test_a_v311_persistent_session_moves_too() -> None:
    async def scenario(c: SimCluster) -> None:
        sub = await c.connect("n0", "old-school", clean_start=False, protocol=4)
        await sub.subscribe("v3/#", 2)
        await wait_route(c, "v3/#", {"n0"})
        await sub.disconnect()
        pub = await c.connect("n2", "pub-v3", protocol=4)
        for i in range(10):
            assert await pub.publish("v3/x", str(i).encode(), qos=2) == 0
        await sub.reconnect("n1")
        assert sub.session_present
        await c.wait_for(lambda: len(sub.received) >= 10, 10, "the 10 queued messages")
        assert numbers(sub.received) == list(range(10))
        await wait_route(c, "v3/#", {"n1"})

    sim(scenario)


async def steady_publisher(c: SimCluster, pub: SimClient, qos: int, rate: float, stop: trio.Event,
                           sent: dict[int, int]) -> None:
    """`q<qos>:<n>` at a steady rate until `stop`; counts the acknowledged messages."""
    n = 0
    while not stop.is_set():
        assert await pub.publish(f"steady/q{qos}", f"{qos}:{n}".encode(), qos=qos) == 0
        n += 1
        sent[qos] = n
        await trio.sleep(1 / rate)


def test_reconnects_across_nodes_while_publishing_lose_nothing() -> None:
    async def scenario(c: SimCluster) -> None:
        sub = await c.connect("n0", "roamer", clean_start=False, session_expiry=EXPIRY)
        await sub.subscribe("steady/#", 2)
        await wait_route(c, "steady/#", {"n0"})
        pubs = [await c.connect("n2", f"steady-{q}") for q in (1, 2)]
        stop = trio.Event()
        sent: dict[int, int] = {}
        async with trio.open_nursery() as nursery:
            for q, pub in zip((1, 2), pubs):
                nursery.start_soon(steady_publisher, c, pub, q, 150.0, stop, sent)
            # One client throughout, as a real device keeps its session state (QoS 2
            # messages it acknowledged with PUBREC are delivered on the PUBREL it gets later).
            for hop in ("n1", "n0", "n2"):
                await c.run_for(0.7)
                await sub.disconnect()
                await sub.reconnect(hop, session_expiry=EXPIRY)
                assert sub.session_present, f"no session on {hop}"
            await c.run_for(0.5)
            stop.set()

        def complete() -> bool:
            return all(len({m.payload for m in sub.messages(f"steady/q{q}")}) == sent[q] for q in (1, 2))

        await c.wait_for(complete, 15, "every message")
        for q in (1, 2):
            check_stream(sub.messages(f"steady/q{q}"), q, sent[q])
        assert min(sent.values()) > 100

    sim(scenario)


def test_owner_killed_during_reconnect_then_its_copy_is_merged_when_it_returns() -> None:
    """One copy of each session (`session_replicas` 1): the session is only on its dead
    owner, so the client starts afresh and the owner's copy is merged when it is back.
    With replicas it is taken over at once (tests/cluster_sim/test_replication.py)."""

    async def scenario(c: SimCluster) -> None:
        sub = await subscribed_then_offline(c, "n0", "survivor", "kill/#")
        pub = await c.connect("n2", "pub-kill")
        for i in range(20):
            assert await pub.publish(f"kill/{i}", f"old:{i}".encode(), qos=1) == 0  # on n0's disk
        await c.kill("n0")
        started = c.clock.now()
        await sub.reconnect("n1", session_expiry=EXPIRY)
        assert c.clock.now() - started < 8, "CONNACK took too long"
        assert not sub.session_present  # documented: the owner is gone, no copy here
        await sub.subscribe("kill/#", 1)
        await wait_route(c, "kill/#", {"n1"}, nodes=["n1", "n2"])
        await pub.publish("kill/new", b"new", qos=1)
        await c.wait_for(lambda: sub.payloads() == [b"new"], 5, "the new message")
        # n0 comes back on its store: its copy is merged into n1's session, nothing is lost.
        await c.restart("n0")
        await c.wait_for(lambda: len(sub.received) >= 21, 30, "the 20 old messages")
        assert sub.payloads()[1:] == [f"old:{i}".encode() for i in range(20)]  # in order
        await c.wait_for(lambda: not c.running("n0").broker.sessions, 10, "n0 forgot its copy")

    sim(scenario, session_replicas=1)


def test_concurrent_connects_on_two_nodes_leave_exactly_one() -> None:
    async def scenario(c: SimCluster) -> None:
        await subscribed_then_offline(c, "n0", "twin", "twin/#")
        twins: dict[str, SimClient] = {}

        async def connect(node_id: str) -> None:
            twins[node_id] = await c.connect(node_id, "twin", clean_start=False, session_expiry=EXPIRY)

        async with trio.open_nursery() as nursery:
            for n in ("n1", "n2"):
                nursery.start_soon(connect, n)
        await c.run_for(2.0)
        kicked = {n: t.disconnect_reason for n, t in twins.items() if t.disconnect_reason is not None}
        assert len(kicked) == 1, kicked
        loser, reason = kicked.popitem()
        assert reason == 0x8E  # session taken over
        winner = "n1" if loser == "n2" else "n2"
        # One session, on the winner; the routes say so everywhere.
        await wait_route(c, "twin/#", {winner})
        for n in c.node_ids:
            assert await sessions(c, n) == (1 if n == winner else 0), n
        pub = await c.connect("n0", "twin-pub")
        await pub.publish("twin/x", b"one", qos=1)
        await c.wait_for(lambda: bool(twins[winner].received), 5, "the winner's message")
        await c.run_for(1.0)
        assert twins[winner].payloads() == [b"one"]
        assert not twins[loser].received

    sim(scenario)


def test_a_clean_connect_elsewhere_kicks_the_old_connection() -> None:
    async def scenario(c: SimCluster) -> None:
        old = await c.connect("n0", "kickme", clean_start=False, session_expiry=EXPIRY)
        await old.subscribe("kick/#", 1)
        await wait_route(c, "kick/#", {"n0"})
        new = await c.connect("n1", "kickme")  # clean start: the old session is void
        assert not new.session_present
        await c.wait_for(lambda: old.disconnect_reason is not None, 10, "the old connection kicked")
        assert old.disconnect_reason == 0x8E
        await wait_route(c, "kick/#", set())
        await c.wait_for(lambda: not c.running("n0").broker.sessions, 10, "n0 dropped the session")

    sim(scenario)


def test_a_flapping_client_leaks_nothing() -> None:
    async def scenario(c: SimCluster) -> None:
        sub = await c.connect("n0", "flapper", clean_start=False, session_expiry=EXPIRY)
        await sub.subscribe("steady/#", 1)
        await wait_route(c, "steady/#", {"n0"})
        pub = await c.connect("n2", "flap-pub")
        stop = trio.Event()
        sent: dict[int, int] = {}
        hops = ("n1", "n2", "n0") * 34
        async with trio.open_nursery() as nursery:
            nursery.start_soon(steady_publisher, c, pub, 1, 100.0, stop, sent)
            for i, hop in enumerate(hops[:100]):
                await sub.disconnect()
                await sub.reconnect(hop, session_expiry=EXPIRY)
                assert sub.session_present, f"no session on {hop} (hop {i})"
            stop.set()
        await pub.disconnect()
        last = hops[99]
        await c.wait_for(lambda: len({m.payload for m in sub.received}) >= sent[1], 15, "every message")
        check_stream(sub.received, 1, sent[1])
        await wait_route(c, "steady/#", {last})
        for n in c.node_ids:
            want = 1 if n == last else 0
            await c.wait_for(lambda n=n, want=want: len(c.running(n).broker.sessions) == want, 10,
                             f"{n} holds {want} sessions")
        # Nothing of the moves is left behind: no held queues, no open handoffs.
        for n in c.node_ids:
            assert not c.cluster(n).held.members, n

    sim(scenario)


def test_a_silent_third_node_does_not_stop_a_handoff() -> None:
    """n2 is cut off (not yet known dead): its fence and flush time out, the move goes on."""

    async def scenario(c: SimCluster) -> None:
        sub = await subscribed_then_offline(c, "n0", "patient", "patient/#")
        pub = await c.connect("n0", "pub-patient")
        for i in range(5):
            await pub.publish("patient/x", str(i).encode(), qos=1)
        c.cut(["n2"], ["n0", "n1"])
        started = c.clock.now()
        await sub.reconnect("n1", session_expiry=EXPIRY)
        assert sub.session_present and c.clock.now() - started < 5
        await c.wait_for(lambda: len(sub.received) >= 5, 5, "the 5 queued messages")
        assert numbers(sub.received) == list(range(5))

    sim(scenario)


def test_a_roaming_client_onto_a_node_with_a_slow_clock_gets_its_session_on_the_retry() -> None:
    """n0's wall clock runs 0.5 s behind.  The client moves n2 -> n1 -> n0 faster than
    n1's ownership claim spreads: n0's claim is stamped below n1's (HLC by wall time,
    no causal path between the two CONNECTs), so n2, still asked as the owner, refuses
    it as the older one (0x8E; last-writer-wins by HLC, ARCHITECTURE.md).  The refusal
    teaches n0 the newer claim: the device's next attempt, at once, finds the whole
    session (the bug was an empty session: n0 took its own losing claim for ownership),
    and gossip spreads n1's claim although n0's losing one was sent later."""

    async def scenario(c: SimCluster) -> None:
        c.skew("n0", -0.5)
        sub = await subscribed_then_offline(c, "n2", "roamer", "roam/#")
        pub = await c.connect("n2", "roam-pub")
        for i in range(5):
            await pub.publish("roam/x", str(i).encode(), qos=1)
        await sub.reconnect("n1", session_expiry=EXPIRY)
        await c.wait_for(lambda: len(sub.received) == 5, 5, "the first 5 messages")
        await sub.disconnect()
        for i in range(5, 10):
            await pub.publish("roam/x", str(i).encode(), qos=1)
        await sub.reconnect("n0", session_expiry=EXPIRY)
        if sub.disconnect_reason == 0x8E:
            await sub.reconnect("n0", session_expiry=EXPIRY)
        assert sub.session_present and sub.disconnect_reason is None
        await c.wait_for(lambda: len(sub.received) >= 10, 5, "the 5 queued messages")
        check_stream(sub.received, 1, 10)
        await c.wait_for(lambda: all(c.cluster(n).handoffs.register.owner("roamer") == "n0" for n in c.node_ids),
                         5, "every node sees n0 as the owner")
        await c.wait_for(lambda: [n for n in c.node_ids if "roamer" in c.running(n).broker.sessions] == ["n0"], 5,
                         "only n0 holds the session")  # n1 lets go once its ho_done is answered

    sim(scenario)


def test_a_publishers_unanswered_qos2_message_resent_after_a_move_is_delivered_once() -> None:
    """A persistent publisher's QoS 2 PUBLISH gets no PUBREC (its node's link to the
    subscriber's node is cut one way, so the forward is not acknowledged); the device
    drops off and reconnects to another node, which takes its session over, QoS 2 ids
    received included, and sends the PUBLISH again (DUP).  The subscriber gets the
    message exactly once, and the publisher its PUBCOMP."""

    async def scenario(c: SimCluster) -> None:
        sub = await c.connect("n1", "once-sub")
        await sub.subscribe("once/#", 2)
        await wait_route(c, "once/#", {"n1"})
        pub = await c.connect("n0", "once-pub", clean_start=False, session_expiry=EXPIRY, resend=True)
        resent: list[object] = []
        c.on_event(lambda e: resent.append(e.detail["packet"]) if e.kind == "resend" else None)
        reasons: list[int | None] = []
        c.cut(["n1"], ["n0"], one_way=True)  # n1's acknowledgements of n0's forwards stall
        async with trio.open_nursery() as nursery:
            async def publish() -> None:
                reasons.append(await pub.publish("once/x", b"exactly once", qos=2))

            nursery.start_soon(publish)
            await c.run_for(0.5)
            assert not reasons
            await pub.drop()
            await pub.reconnect("n2", session_expiry=EXPIRY)
            assert pub.session_present
            await c.run_for(0.5)
            c.heal()
        assert reasons == [0]
        assert resent == ["PUBLISH"]  # sent again, with DUP, to n2
        await c.wait_for(lambda: bool(sub.received), 5, "the message")
        await c.run_for(2.0)
        assert sub.payloads() == [b"exactly once"]

    sim(scenario)


def test_a_giver_restarted_in_the_middle_of_a_handoff_does_not_close_the_connect_as_taken_over(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Simulator seed 3614 of 3 nodes, 6 clients, 15 s: the giver was killed after it
    answered `ho_begin` and was back before the taker's `ho_commit`.  Restarted, it knew
    of no handoff and answered 'aborted', which the taker took for a newer CONNECT
    elsewhere: CONNACK, then DISCONNECT 0x8E, with no other connection anywhere.  It
    now answers 'forgot': the taker goes on with the copy it installed, and the giver's
    restored copy is merged into it later, nothing delivered twice."""

    async def scenario(c: SimCluster) -> None:
        sub = await subscribed_then_offline(c, "n0", "midway", "mid/#")
        pub = await c.connect("n2", "pub-mid")
        for i in range(5):
            assert await pub.publish(f"mid/{i}", f"m{i}".encode(), qos=1) == 0  # durable on n0
        taker = c.running("n1").broker
        install = taker.install_session
        installed = trio.Event()

        def install_and_tell(stored: StoredSession, now: float) -> Session:
            installed.set()  # the giver's ho_begin answer is here; its next step meets a restarted giver
            return install(stored, now)

        monkeypatch.setattr(taker, "install_session", install_and_tell)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(sub.reconnect, "n1", session_expiry=EXPIRY))
            await installed.wait()
            await c.kill("n0")
            await c.run_for(1)  # back within the taker's handoff budget
            await c.restart("n0")
        assert sub.connected and sub.disconnect_reason is None, "closed as if taken over"
        assert sub.session_present
        await c.wait_for(lambda: len(sub.received) >= 5, 10, "the 5 queued messages")
        await pub.publish("mid/new", b"new", qos=1)
        await c.wait_for(lambda: b"new" in sub.payloads(), 10, "a new message")
        # The restarted giver's copy goes to n1 and is merged there: nothing twice.
        await c.wait_for(lambda: "midway" not in c.running("n0").broker.sessions, 20, "n0 pushed its copy")
        await c.run_for(2)
        assert sub.payloads() == [f"m{i}".encode() for i in range(5)] + [b"new"]

    sim(scenario, session_replicas=1)
