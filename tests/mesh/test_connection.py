"""The Trio pump (mesh.connection) on an in-memory stream and Trio's MockClock: the
machine's deadlines become exact virtual times, with no socket and no sleep."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from clock import TrioClock
from hooks import HookPoint, Hooks
from mesh.broker import Broker
from mesh.client import SUBSCRIBE_SLICE
from mesh.connection import ClientConnection
from mqtt import (Connack, Connect, Decoder, Disconnect, Packet, Pingreq, Pingresp, Properties, Puback, Publish, ReasonCode, Suback,
                  Subscribe, Subscription, encode)
from routing.forward import ForwardTarget
from routing.links import AckGate
from session_store.model import Message


@pytest.fixture
def autojump_clock():
    return trio.testing.MockClock(autojump_threshold=0)


class Peer:
    """The client end of an in-memory stream, with a decoder for what the server sends."""

    def __init__(self, stream: trio.testing.StapledStream, level: int = 5) -> None:
        self.stream = stream
        self.level = level
        self.decoder = Decoder(role="client", protocol_level=level)

    async def send(self, packet: Packet) -> None:
        await self.stream.send_all(encode(packet, self.level))

    async def recv(self) -> Packet | None:
        """The next packet, or None at EOF."""
        while (packet := self.decoder.next_packet()) is None:
            data = await self.stream.receive_some()
            if not data:
                return None
            self.decoder.feed(data)
        return packet


async def _serve(nursery: trio.Nursery, broker: Broker, connect_timeout: float = 10.0) -> Peer:
    client, server = trio.testing.memory_stream_pair()
    conn = ClientConnection(broker, server, "peer", clock=TrioClock(), connect_timeout=connect_timeout, nursery=nursery)
    nursery.start_soon(conn.run)
    return Peer(client)


async def test_keep_alive_runs_out_one_and_a_half_keep_alives_after_the_last_packet(autojump_clock):
    async with trio.open_nursery() as nursery:
        peer = await _serve(nursery, Broker())
        await peer.send(Connect(client_id="ka", keep_alive=10, protocol_level=5))
        assert isinstance(await peer.recv(), Connack)
        t0 = trio.current_time()
        await trio.sleep_until(t0 + 14)
        await peer.send(Pingreq())  # pushes the deadline to t0 + 14 + 15
        assert isinstance(await peer.recv(), Pingresp)
        assert await peer.recv() == Disconnect(reason_code=ReasonCode.KEEP_ALIVE_TIMEOUT)
        assert trio.current_time() == pytest.approx(t0 + 14 + 15)
        assert await peer.recv() is None  # and the stream is closed


async def test_no_connect_within_the_timeout_closes_without_a_word(autojump_clock):
    async with trio.open_nursery() as nursery:
        t0 = trio.current_time()
        peer = await _serve(nursery, Broker(), connect_timeout=3.0)
        assert await peer.recv() is None
        assert trio.current_time() == pytest.approx(t0 + 3.0)


async def test_a_delivery_flows_through_the_machine_to_the_stream(autojump_clock):
    broker = Broker()
    async with trio.open_nursery() as nursery:
        sub = await _serve(nursery, broker)
        await sub.send(Connect(client_id="sub", keep_alive=0, protocol_level=5))
        await sub.send(Subscribe(packet_id=1, subscriptions=(Subscription("t/#", qos=1),)))
        assert [type(await sub.recv()).__name__ for _ in range(2)] == ["Connack", "Suback"]
        pub = await _serve(nursery, broker)
        await pub.send(Connect(client_id="pub", keep_alive=0, protocol_level=5))
        assert isinstance(await pub.recv(), Connack)
        await pub.send(Publish(topic="t/1", payload=b"hi", qos=1, packet_id=9))
        got = await sub.recv()
        assert isinstance(got, Publish) and (got.topic, got.payload, got.qos, got.packet_id) == ("t/1", b"hi", 1, 1)
        assert (await pub.recv()) is not None  # PUBACK
        assert list(broker.sessions["sub"].inflight) == [1]
        broker.close_all(ReasonCode.SERVER_SHUTTING_DOWN)
        assert await sub.recv() == Disconnect(reason_code=ReasonCode.SERVER_SHUTTING_DOWN)
        assert await pub.recv() == Disconnect(reason_code=ReasonCode.SERVER_SHUTTING_DOWN)


async def test_a_message_queued_behind_full_windows_is_encoded_once_for_all_its_subscribers(autojump_clock):
    """Each subscriber takes one message at a time (receive maximum 1): the rest wait in
    their queues and leave on each PUBACK, with the subscriber's next packet id joined
    into the message's one encoding (`Message.encoded`), DUP clear."""
    broker = Broker()
    async with trio.open_nursery() as nursery:
        subs = []
        for name in ("a", "b"):
            sub = await _serve(nursery, broker)
            await sub.send(Connect(client_id=name, keep_alive=0, protocol_level=5,
                                   properties=Properties(receive_maximum=1)))
            await sub.send(Subscribe(packet_id=1, subscriptions=(Subscription("t/#", qos=1),)))
            assert [type(await sub.recv()).__name__ for _ in range(2)] == ["Connack", "Suback"]
            subs.append(sub)
        pub = await _serve(nursery, broker)
        await pub.send(Connect(client_id="pub", keep_alive=0, protocol_level=5))
        assert isinstance(await pub.recv(), Connack)
        for i in range(3):
            await pub.send(Publish(topic="t/x", payload=b"m%d" % i, qos=1, packet_id=i + 1))
        for sub, name in zip(subs, ("a", "b")):
            for i in range(3):
                got = await sub.recv()
                assert isinstance(got, Publish)
                assert (got.payload, got.packet_id, got.dup) == (b"m%d" % i, i + 1, False)
                inflight = broker.sessions[name].inflight
                assert list(inflight) == [i + 1]  # the window of 1 holds this one; the rest wait
                encoded = inflight[i + 1].delivery.message.encoded
                assert encoded is not None and len(encoded) == 1  # one encoding, v5 QoS 1
                await sub.send(Puback(packet_id=i + 1))
        broker.close_all(ReasonCode.SERVER_SHUTTING_DOWN)


class _SubscriptionsPerStep(trio.abc.Instrument):
    """How many subscriptions a session gained in each uninterrupted task step."""

    def __init__(self, broker: Broker, client_id: str) -> None:
        self.broker, self.client_id = broker, client_id
        self.size = 0
        self.steps: list[int] = []

    def _size(self) -> int:
        session = self.broker.sessions.get(self.client_id)
        return len(session.subscriptions) if session is not None else 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.size = self._size()

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        grown = self._size() - self.size
        if grown:
            self.steps.append(grown)


async def test_a_subscribe_of_1000_filters_is_handled_a_slice_at_a_time_and_acknowledged_in_order(autojump_clock):
    """A SUBSCRIBE of many filters does not hold the event loop for all of them (at a
    million routes, nodes taking SUBSCRIBEs of 1,000 from 10 clients at once missed
    their gossip probes): a slice per step; what the client sent after it is handled
    after its SUBACK, and a publish then reaches the new subscriptions."""
    broker = Broker()
    watch = _SubscriptionsPerStep(broker, "big")
    async with trio.open_nursery() as nursery:
        peer = await _serve(nursery, broker)
        await peer.send(Connect(client_id="big", keep_alive=0, protocol_level=5))
        assert isinstance(await peer.recv(), Connack)
        trio.lowlevel.add_instrument(watch)
        try:
            subs = tuple(Subscription(f"fleet/{i}/+", qos=0) for i in range(1000))
            await peer.stream.send_all(encode(Subscribe(packet_id=7, subscriptions=subs), 5) + encode(Pingreq(), 5)
                                       + encode(Publish(topic="fleet/999/x", payload=b"hi", qos=0), 5))
            suback = await peer.recv()
            assert isinstance(suback, Suback) and suback.packet_id == 7 and len(suback.reason_codes) == 1000
            assert isinstance(await peer.recv(), Pingresp)
            delivered = await peer.recv()
            assert isinstance(delivered, Publish) and delivered.topic == "fleet/999/x"
        finally:
            trio.lowlevel.remove_instrument(watch)
        assert sum(watch.steps) == 1000
        assert max(watch.steps) <= SUBSCRIBE_SLICE  # one step of 1,000 before
        nursery.cancel_scope.cancel()



class _JumpWhenWoken(trio.abc.Instrument):
    """Once armed, moves the clock on when a task is woken (the reader, by the bytes
    sent): its deadline passes while it waits to run, as on a starved node."""

    def __init__(self, clock: trio.testing.MockClock, by: float) -> None:
        self.clock, self.by = clock, by
        self.armed = self.jumped = False

    def task_scheduled(self, task: trio.lowlevel.Task) -> None:
        try:
            waker = trio.lowlevel.current_task()
        except RuntimeError:
            return  # woken by the run loop (a timer), not by the bytes sent
        if self.armed and task is not waker:
            self.armed, self.jumped = False, True
            self.clock.jump(self.by)


async def test_a_subscribe_in_slices_is_finished_when_the_readers_deadline_passed_meanwhile(autojump_clock):
    """The reader's scope fired while it waited to run with a big SUBSCRIBE read: the
    SUBSCRIBE is handled whole and acknowledged before the connection goes on (a
    slice cut off there left it half taken, and a parked connection then waited for
    bytes that never came, the rest of what it had read still in its machine:
    route_convergence --preload stalled with every node idle)."""
    broker = Broker()
    async with trio.open_nursery() as nursery:
        peer = await _serve(nursery, broker)
        await peer.send(Connect(client_id="big", keep_alive=10, protocol_level=5))
        assert isinstance(await peer.recv(), Connack)
        jump = _JumpWhenWoken(autojump_clock, 16)  # past the keep alive's 15 s
        trio.lowlevel.add_instrument(jump)
        try:
            subs = tuple(Subscription(f"fleet/{i}/+", qos=0) for i in range(1000))
            jump.armed = True
            await peer.send(Subscribe(packet_id=7, subscriptions=subs))
            suback = await peer.recv()
        finally:
            trio.lowlevel.remove_instrument(jump)
        assert jump.jumped
        assert isinstance(suback, Suback) and len(suback.reason_codes) == 1000
        assert await peer.recv() == Disconnect(reason_code=ReasonCode.KEEP_ALIVE_TIMEOUT)


async def test_a_hooked_publish_is_routed_and_acknowledged_when_the_readers_deadline_passed_meanwhile(autojump_clock):
    """The reader's scope fired while it waited to run with a PUBLISH whose
    message.publish hook awaits: the PUBLISH is routed and acknowledged, not cut off at
    the hook's first checkpoint (it was lost then: no PUBACK, nothing delivered, and the
    reader read on)."""
    hooks = Hooks()

    async def slow_hook(message: Message) -> None:
        await trio.lowlevel.checkpoint()  # the chain awaits: where a fired scope would cut it off

    hooks.add(HookPoint.MESSAGE_PUBLISH, slow_hook, name="slow")
    broker = Broker(hooks=hooks)
    async with trio.open_nursery() as nursery:
        sub = await _serve(nursery, broker)
        await sub.send(Connect(client_id="sub", keep_alive=0, protocol_level=5))
        await sub.send(Subscribe(packet_id=1, subscriptions=(Subscription("t", qos=1),)))
        assert [type(await sub.recv()).__name__ for _ in range(2)] == ["Connack", "Suback"]
        pub = await _serve(nursery, broker)
        await pub.send(Connect(client_id="pub", keep_alive=10, protocol_level=5))
        assert isinstance(await pub.recv(), Connack)
        jump = _JumpWhenWoken(autojump_clock, 16)  # past the keep alive's 15 s
        trio.lowlevel.add_instrument(jump)
        try:
            jump.armed = True
            await pub.stream.send_all(encode(Publish(topic="t", payload=b"hooked", qos=1, packet_id=5), 5) + encode(Pingreq(), 5))
            first = await pub.recv()
        finally:
            trio.lowlevel.remove_instrument(jump)
        assert jump.jumped
        assert first == Puback(packet_id=5)
        assert isinstance(await pub.recv(), Pingresp)
        delivered = await sub.recv()
        assert isinstance(delivered, Publish) and delivered.payload == b"hooked"
        nursery.cancel_scope.cancel()


class _AwaitingMesh:
    """A cluster whose session claim awaits (`Mesh.prepare_connect`), and nothing else."""

    def __init__(self) -> None:
        self.claims: list[str] = []

    def plain_nodes(self, topic: str) -> frozenset[str]:
        return frozenset()

    def stays_here(self, retain: bool) -> bool:
        return True

    def shared_nodes(self, topic: str) -> dict[tuple[str, str], set[str]]:
        return {}

    def pick_shared_node(self, key: tuple[str, str], candidates: list[str]) -> str:
        return candidates[0]

    def retained_targets(self) -> list[str]:
        return []

    def forward(self, msg: Message, targets: dict[str, ForwardTarget], gate: AckGate | None) -> int:
        return 0

    def route_changed(self, topic_filter: str, present: bool) -> None:
        pass  # no other node to tell

    def session_ended(self, client_id: str) -> None:
        pass  # no other node to tell

    def keep_expired(self, client_id: str, left_at: float, expired_at: float, now: float) -> float | None:
        return None

    def connect_is_local(self, client_id: str, clean_start: bool, persistent: bool) -> bool:
        return False

    async def prepare_connect(self, client_id: str, clean_start: bool, persistent: bool) -> str:
        await trio.lowlevel.checkpoint()  # asking the node that held the session: an await
        self.claims.append(client_id)
        return "claimed"


async def test_a_connect_whose_claim_awaits_is_answered_when_the_readers_deadline_passed_meanwhile(autojump_clock):
    """The reader's scope fired while it waited to run with a CONNECT whose session claim
    awaits: the claim runs whole and the CONNECT is answered (it was cut off at the
    claim's first checkpoint: no CONNACK, and the connection closed later as if no
    CONNECT had come)."""
    mesh = _AwaitingMesh()
    broker = Broker(mesh=mesh)
    async with trio.open_nursery() as nursery:
        peer = await _serve(nursery, broker, connect_timeout=10.0)
        await trio.testing.wait_all_tasks_blocked()  # the reader waits for the CONNECT
        jump = _JumpWhenWoken(autojump_clock, 11)  # past the CONNECT timeout
        trio.lowlevel.add_instrument(jump)
        try:
            jump.armed = True
            await peer.send(Connect(client_id="late", keep_alive=0, protocol_level=5, clean_start=False,
                                    properties=Properties(session_expiry_interval=60)))
            with trio.fail_after(60):  # virtual seconds: no CONNACK ever came before
                first = await peer.recv()
        finally:
            trio.lowlevel.remove_instrument(jump)
        assert jump.jumped
        assert isinstance(first, Connack) and first.reason_code == ReasonCode.SUCCESS
        assert mesh.claims == ["late"]
        await peer.send(Pingreq())
        assert isinstance(await peer.recv(), Pingresp)
        nursery.cancel_scope.cancel()
