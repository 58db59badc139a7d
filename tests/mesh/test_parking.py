"""Idle plain-TCP connections park in the node's lot (no task) and keep every behaviour:
CONNECT answered while parked, keep alive and CONNECT timeouts, takeover, shutdown."""

from __future__ import annotations

import math
import os
import socket
import time

import pytest
import trio
import trio.testing

import clock

import mesh.parked
import mesh.parking
from mqtt import Connect, Disconnect, Pingreq, Pingresp, Publish, Subscribe, Subscription, encode
from mesh.parking import ParkingLot
from tests.mesh.test_broker_raw import Raw, recv_until_close
from tests.support import Client


def _parked(node) -> set[str]:
    """Client ids of the connections parked in the node's lot (empty id: no CONNECT yet)."""
    return node.call(lambda: {c.client_id for c in node.node._lot.parked()})


def _wait_for(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


@pytest.fixture
def quick_park(monkeypatch):
    monkeypatch.setattr(mesh.parked, "PARK_AFTER", 0.2)


def test_connect_is_answered_while_parked_and_the_client_stays_parked(node):
    raw = Raw(node.mqtt_port, level=4)
    raw.connect("idle-1")
    raw2 = Raw(node.mqtt_port, level=5)
    raw2.connect("idle-2")
    _wait_for(lambda: _parked(node) == {"idle-1", "idle-2"})
    # Parked, not gone: a PINGREQ wakes the connection and is answered.
    raw.send(Pingreq())
    assert type(raw.recv()).__name__ == "Pingresp"


def test_connect_split_over_two_segments_and_packets_behind_it(node):
    connect = encode(Connect(client_id="split", protocol_level=5), 5)
    sub = encode(Subscribe(packet_id=1, subscriptions=(Subscription("t/split", qos=0),)), 5)
    pub = encode(Publish(topic="t/split", payload=b"hello"), 5)
    raw = Raw(node.mqtt_port, level=5)
    raw.send_bytes(connect[:5])
    _wait_for(lambda: _parked(node) == {""})  # waits for the rest with no task
    raw.send_bytes(connect[5:] + sub + pub)  # CONNECT's tail, then two packets in one segment
    kinds = [type(raw.recv()).__name__ for _ in range(3)]
    assert kinds == ["Connack", "Suback", "Publish"]


def test_parked_client_wakes_goes_active_and_parks_again(node, quick_park):
    raw = Raw(node.mqtt_port, level=4)
    raw.connect("napper")
    _wait_for(lambda: "napper" in _parked(node))
    raw.send(Subscribe(packet_id=1, subscriptions=(Subscription("nap/#", qos=1),)))
    assert type(raw.recv()).__name__ == "Suback"
    assert "napper" not in _parked(node)  # a reader task has it now
    _wait_for(lambda: "napper" in _parked(node))  # idle PARK_AFTER: parked again
    pub = Client("pub", version=5)
    pub.connect(node.mqtt_port)
    pub.publish("nap/x", b"1", qos=1)
    msg = raw.recv()
    assert (type(msg).__name__, msg.payload) == ("Publish", b"1")  # writes need no reader


def test_keep_alive_timeout_of_a_parked_client(node):
    raw = Raw(node.mqtt_port, level=5)
    t0 = time.monotonic()
    raw.connect("sleepy", keep_alive=1)
    assert "sleepy" in _parked(node)
    packets = recv_until_close(raw)
    elapsed = time.monotonic() - t0
    assert [(type(p).__name__, p.reason_code) for p in packets] == [("Disconnect", 0x8D)]
    assert 1.4 <= elapsed < 4


def test_keep_alive_of_a_parked_client_is_pushed_by_its_packets(node, quick_park):
    raw = Raw(node.mqtt_port, level=5)
    raw.connect("pinger", keep_alive=1)
    for _ in range(4):  # 2.4 s in all, more than 1.5 s of grace
        time.sleep(0.6)
        raw.send(Pingreq())
        assert type(raw.recv()).__name__ == "Pingresp"


def test_connect_timeout_of_a_parked_socket(node_factory):
    node = node_factory(connect_timeout=0.5)
    raw = Raw(node.mqtt_port)
    _wait_for(lambda: _parked(node) == {""})
    t0 = time.monotonic()
    assert recv_until_close(raw) == []
    assert time.monotonic() - t0 < 3
    _wait_for(lambda: _parked(node) == set())


def test_takeover_of_a_parked_connection(node):
    old = Raw(node.mqtt_port, level=5)
    old.connect("twin")
    _wait_for(lambda: "twin" in _parked(node))
    new = Raw(node.mqtt_port, level=5)
    new.connect("twin")
    packets = recv_until_close(old)
    assert [(type(p).__name__, p.reason_code) for p in packets] == [("Disconnect", 0x8E)]
    new.send(Pingreq())
    assert type(new.recv()).__name__ == "Pingresp"


def test_will_of_a_parked_client_that_drops(node):
    watcher = Client("w", version=5)
    watcher.connect(node.mqtt_port)
    watcher.subscribe("wills/#", 1)
    dying = Client("dying", version=4)
    dying.connect(node.mqtt_port, will=("wills/dying", b"gone", 1, False))
    _wait_for(lambda: "dying" in _parked(node))
    dying.drop()
    (m,) = watcher.expect(1)
    assert m.payload == b"gone"


def test_shutdown_says_0x8b_to_parked_clients_and_closes_unconnected_sockets(node_factory):
    node = node_factory()
    v5 = Raw(node.mqtt_port, level=5)
    v5.connect("parked-v5")
    bare = Raw(node.mqtt_port)  # no CONNECT yet
    _wait_for(lambda: _parked(node) == {"parked-v5", ""})
    t0 = time.monotonic()
    node.stop()
    assert time.monotonic() - t0 < 4  # not held until the CONNECT timeout
    packets = recv_until_close(v5)
    assert [(type(p).__name__, p.reason_code) for p in packets] == [("Disconnect", 0x8B)]
    assert recv_until_close(bare) == []


# ------------------------------------------------------- the lot on its own


class _Fake:
    """A parkable socket end that records what the lot tells it."""

    def __init__(self, sock: socket.socket, deadline: float = math.inf) -> None:
        self.sock = sock
        self.deadline = deadline
        self._heap_at = math.inf
        self._lot_registered = False
        self.events: list[tuple[str, float]] = []

    def fileno(self) -> int:
        return self.sock.fileno()

    def on_readable(self) -> None:
        self.events.append(("readable", trio.current_time()))

    def on_deadline(self) -> None:
        self.events.append(("deadline", trio.current_time()))


async def test_lot_hands_over_readable_sockets_and_due_deadlines(autojump_clock):
    lot = ParkingLot(clock.TrioClock())
    a, a_peer = socket.socketpair()
    b, b_peer = socket.socketpair()
    c, _c_peer = socket.socketpair()
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lot.run)
            ready = _Fake(a)
            late = _Fake(b, deadline=trio.current_time() + 10)
            lot.park(ready)
            lot.park(late)
            a_peer.send(b"x")
            await trio.sleep(1)  # the epoll wait ends on a real event: move the clock a bit
            assert [e for e, _ in ready.events] == ["readable"]
            assert not lot.is_parked(ready) and lot.is_parked(late)
            # A nearer deadline parked while the lot waits wakes it earlier.
            soon = _Fake(c, deadline=trio.current_time() + 2)
            t0 = trio.current_time()
            lot.park(soon)
            await trio.sleep(3)
            assert soon.events == [("deadline", pytest.approx(t0 + 2))]
            # A deadline pushed back while parked is honoured at its new time.
            late.deadline += 5
            await trio.sleep(20)
            assert late.events and late.events[0][0] == "deadline"
            assert late.events[0][1] >= late.deadline
            # Unparked: its socket's events are not handed over any more.
            lot.park(ready)
            assert lot.unpark(ready) and not lot.unpark(ready)
            a_peer.send(b"y")
            await trio.sleep(1)
            assert [e for e, _ in ready.events] == ["readable"]
            lot.park(_Fake(b_peer))
            left = lot.stop()
            assert len(left) == 1 and not lot.park(_Fake(a))
            nursery.cancel_scope.cancel()
    finally:
        for s in (a, a_peer, b, b_peer, c, _c_peer):
            s.close()


async def test_entries_of_deadlines_gone_to_inf_leave_the_heap(autojump_clock, monkeypatch):
    # Clients parked before their CONNECT (its timeout in the heap) and parked again
    # once in with no keep alive: their entries are dropped once they are half the
    # heap, not held until the CONNECT timeout passes.
    monkeypatch.setattr(mesh.parking, "COMPACT_AT", 3)
    lot = ParkingLot(clock.TrioClock())
    pairs = [socket.socketpair() for _ in range(10)]
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lot.run)
            t0 = trio.current_time()
            fakes = [_Fake(a, deadline=t0 + 10) for a, _ in pairs]
            for fake in fakes:
                lot.park(fake)
            assert len(lot._heap) == 10
            for fake in fakes[:7]:  # their CONNECT came: keep alive 0, no deadline
                assert lot.unpark(fake)
                fake.deadline = math.inf
                lot.park(fake)
            # Rebuilt at the 6th stale entry (more than 3, and more than half of 10): the
            # 3 live ones and the 7th, stale, are left.
            assert len(lot._heap) == 4
            # One of them gets a deadline again (keep alive set by a later CONNECT): honoured.
            assert lot.unpark(fakes[0])
            fakes[0].deadline = t0 + 5
            lot.park(fakes[0])
            await trio.sleep(20)
            assert fakes[0].events == [("deadline", pytest.approx(t0 + 5))]
            assert [f.events[0] for f in fakes[7:]] == [("deadline", pytest.approx(t0 + 10))] * 3
            assert all(not f.events for f in fakes[1:7])  # parked, with no deadline
            assert not lot._heap
            lot.stop()
            nursery.cancel_scope.cancel()
    finally:
        for a, b in pairs:
            a.close()
            b.close()


@pytest.fixture
def autojump_clock():
    return trio.testing.MockClock(autojump_threshold=0.05)


def test_accepted_clients_have_nagle_off(node):
    # Set once on the listener and inherited (Linux), or per client where it is not.
    raw = Raw(node.mqtt_port, level=4)
    raw.connect("nodelay")
    def nodelay(fd: int) -> int:
        with socket.socket(fileno=os.dup(fd)) as sock:
            return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)

    fds = node.call(lambda: [nodelay(c.stream.fileno()) for c in node.node.broker.connections.values()])
    assert fds and all(fds)


def test_connect_answered_inline_only_when_no_handoff_can_be_needed():
    from types import SimpleNamespace

    from mesh.broker import Broker
    from clock import ManualClock
    from mesh.client import _handoff_is_noop
    from routing.handoff_driver import Handoffs

    class Gossip:
        def __init__(self, alive: list[str]) -> None:
            self.alive = alive

        def on_broadcast(self, kind, handler):
            pass

        def register_push_pull(self, name, get, merge):
            pass

        def alive_members(self):
            return self.alive

        def has_peers(self):
            return bool(self.alive)

    def handoffs(alive: list[str]) -> Handoffs:
        return Handoffs(node_id="A", broker=Broker(node_id="A"), gossip=Gossip(alive), cluster=None,
                        trace=SimpleNamespace(emit=lambda **kw: None), clock=ManualClock())

    assert _handoff_is_noop(handoffs([]), "c", True, False)  # no live peer, clean session
    assert not _handoff_is_noop(handoffs(["B"]), "c", True, False)  # a live peer may own it
    assert not _handoff_is_noop(handoffs([]), "c", False, False)  # clean start 0: claims
    assert not _handoff_is_noop(handoffs([]), "c", True, True)  # persistent (v5 expiry)
    busy = handoffs([])
    busy._locks["c"] = object()  # a CONNECT of the same id under way
    assert not _handoff_is_noop(busy, "c", True, False)
    assert not _handoff_is_noop(None, "c", True, False)


@pytest.mark.parametrize("transport", ["tcp", "websockets"])
def test_keep_alive_pushed_by_traffic_then_enforced(node, transport):
    # paho pings every second with keep alive 1: 2.5 s connected is past the first
    # 1.5 s deadline, so the deadline moved (parked TCP and task-held WebSocket alike).
    c = Client(f"ka-{transport}", version=5, transport=transport)
    port = node.ports["ws"] if transport == "websockets" else node.mqtt_port
    c.connect(port, keepalive=1)
    c.subscribe("ka/x", 0)
    time.sleep(2.5)
    c.publish("ka/x", b"still here")
    assert c.expect(1)[0].payload == b"still here"
    assert c.disconnects.empty()


def test_big_subscribes_back_to_back_are_all_answered_when_slicing_outlasts_the_park_deadline(node, monkeypatch):
    # Each SUBSCRIBE of 1,000 filters is taken a slice at a time and takes longer than
    # PARK_AFTER here: the reader's deadline is past when the next one is due.  The
    # reader left the fired scope and started each fresh one already past its deadline
    # (the idle mark was from before the work), so the next SUBSCRIBE was never begun:
    # route_convergence.py --preload 800000 on 4 nodes stalled with every node idle.
    monkeypatch.setattr(mesh.parked, "PARK_AFTER", 0.001)
    raw = Raw(node.mqtt_port, level=4)
    raw.connect("bulk")
    big = [encode(Subscribe(packet_id=n + 1, subscriptions=tuple(Subscription(f"bulk/{n}/{i}/+", qos=0)
                                                                 for i in range(1000))), 4) for n in range(3)]
    raw.send_bytes(b"".join(big) + encode(Pingreq(), 4))
    kinds = [(type(p).__name__, getattr(p, "packet_id", None)) for p in (raw.recv() for _ in range(4))]
    assert kinds == [("Suback", 1), ("Suback", 2), ("Suback", 3), ("Pingresp", None)]
