"""A simulated MQTT client: the project's own codec (`mqtt.encoder`, `mqtt.decoder`)
over an in-memory pipe (`simulation.pipe`) straight into a node's normal connection
path.  It behaves as a well-behaved device does: it acknowledges what it receives
(PUBACK; PUBREC, then PUBCOMP on PUBREL for QoS 2, delivering a QoS 2 message once
even when the node sends it again), pings within its keep alive, and keeps its QoS 2
state across `reconnect`, as a device that keeps its session does.

Every step is reported to the cluster's event hook (`SimEvent`, `simulation.events`)
so checkers see publishes, acknowledgements and deliveries in one history.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import trio

from clock import Clock
from mqtt import (
    Connack,
    Connect,
    Decoder,
    Disconnect,
    Packet,
    Pingreq,
    Pingresp,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    RemoteProtocolError,
    Suback,
    Subscribe,
    Subscription,
    Unsuback,
    Unsubscribe,
    Will,
    encode,
)
from simulation.events import Emit
from simulation.pipe import Pipe, PipeEnd


class ConnectionLost(Exception):
    """The connection ended before the answer the client was waiting for."""


class NodeDown(ConnectionLost):
    """The node the client dialled is not running (killed, not restarted yet)."""


@dataclass(frozen=True)
class Received:
    """One message as the client's application got it, in arrival order."""

    topic: str
    payload: bytes
    qos: int
    dup: bool
    retain: bool
    packet_id: int | None
    at: float  # virtual seconds


class _Waiter:
    """One answer the client waits for (CONNACK, SUBACK, PUBACK, ...)."""

    __slots__ = ("done", "packet", "lost")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.packet: Packet | None = None
        self.lost = False

    async def wait(self) -> Packet:
        await self.done.wait()
        if self.packet is None:
            raise ConnectionLost("connection lost before the answer came")
        return self.packet


# Opens a pipe to a node's connection path: (node id, client id) -> the pipe.
Dial = Callable[[str, str], Pipe]


class SimClient:
    def __init__(self, client_id: str, *, dial: Dial, nursery: trio.Nursery, clock: Clock, emit: Emit,
                 protocol: int = 5, keepalive: int = 60, ack_delay: float = 0.0, resend: bool = False) -> None:
        self.client_id = client_id
        self.protocol = protocol
        self.keepalive = keepalive
        self.ack_delay = ack_delay  # seconds before acknowledging a received message
        # As a device with a persistent session does: a PUBLISH (DUP) or PUBREL still
        # unanswered when the connection dies is sent again after a reconnect that finds
        # the session, and `publish` waits for its answer there (else ConnectionLost).
        self.resend = resend
        self.node_id = ""
        self.session_present = False
        self.connack_reason = -1
        self.connected = False
        self.disconnect_reason: int | None = None  # the node's DISCONNECT, if it sent one
        self.assigned_client_id: str | None = None
        self.received: list[Received] = []
        self._dial = dial
        self._nursery = nursery
        self._clock = clock
        self._emit = emit
        self._pipe: Pipe | None = None
        self._end: PipeEnd | None = None
        self._waiters: dict[tuple[str, int], _Waiter] = {}  # (answer kind, packet id)
        self._next_id = 0
        self._qos2_in: set[int] = set()  # QoS 2 ids delivered, PUBREL not yet seen
        self._outgoing: dict[int, Publish | Pubrel] = {}  # unanswered, in send order (resend only)
        self._resumed = trio.Event()  # set when a connect ends: who waits to resend looks again
        self._connection = 0  # which connection the tasks belong to
        self._ended = 0  # the last connection that ended (see `connect`)

    # ------------------------------------------------------------------ connecting

    async def connect(self, node_id: str, *, clean_start: bool = True, session_expiry: int = 0,
                      receive_maximum: int | None = None, will: Will | None = None) -> "SimClient":
        """Open a connection to `node_id` and wait for the CONNACK (refused ones too:
        see `connack_reason`). Raises NodeDown when the node is not running and
        ConnectionLost when the connection ends before the CONNACK."""
        if self.connected:
            raise RuntimeError(f"{self.client_id} is connected; disconnect or drop first")
        self.node_id = node_id
        self.disconnect_reason = None
        self._pipe = self._dial(node_id, self.client_id)
        self._end = self._pipe.client
        self._connection += 1
        if clean_start:
            self._qos2_in.clear()  # a new session: nothing of the old one is pending
        props = Properties(session_expiry_interval=session_expiry or None, receive_maximum=receive_maximum) \
            if self.protocol == 5 else Properties()
        waiter = self._waiter("connack", 0)
        self._nursery.start_soon(self._reader, self._end, self._connection)
        self._send(Connect(self.client_id, clean_start=clean_start, keep_alive=self.keepalive, will=will,
                           properties=props, protocol_level=self.protocol))
        self._emit("connect", client=self.client_id, node=node_id, clean_start=clean_start,
                   session_expiry=session_expiry)
        try:
            connack = await waiter.wait()
            assert isinstance(connack, Connack)
            self.connack_reason = connack.reason_code
            self.session_present = connack.session_present
            # A connection closed right after its CONNACK (0x8E and gone, say) may have
            # ended before this resumed: it is not connected then, or the next request
            # would wait for an answer that cannot come (its waiters already failed).
            self.connected = connack.reason_code < 0x80 and self._ended != self._connection
            if connack.properties.assigned_client_identifier:
                self.assigned_client_id = connack.properties.assigned_client_identifier
            self._emit("connack", client=self.client_id, node=node_id, reason=connack.reason_code,
                       session_present=connack.session_present)
            if self.connected and self.keepalive:
                self._nursery.start_soon(self._pinger, self._connection)
            if self.connected and self.session_present:
                self._resend_outgoing()
            else:
                self._outgoing.clear()  # no session: what was unanswered is gone with it
        finally:
            self._resumed.set()
            self._resumed = trio.Event()
        return self

    def _resend_outgoing(self) -> None:
        for packet_id, packet in self._outgoing.items():
            if isinstance(packet, Publish):
                self._waiter("puback" if packet.qos == 1 else "pubrec", packet_id)
                packet = replace(packet, dup=True)
            else:
                self._waiter("pubcomp", packet_id)
            self._emit("resend", client=self.client_id, node=self.node_id, packet_id=packet_id,
                       packet=type(packet).__name__.upper())
            self._send_quietly(packet)

    async def reconnect(self, node_id: str, *, clean_start: bool = False, session_expiry: int = 0,
                        receive_maximum: int | None = None, will: Will | None = None) -> "SimClient":
        """Connect again (to any node), keeping what was received and the QoS 2 state."""
        if self.connected:
            await self.drop()
        return await self.connect(node_id, clean_start=clean_start, session_expiry=session_expiry,
                                  receive_maximum=receive_maximum, will=will)

    # ------------------------------------------------------------------ operations

    async def publish(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False) -> int | None:
        """Publish; for QoS 1 the PUBACK's reason code, for QoS 2 the PUBCOMP's (or a
        refusing PUBREC's), None for QoS 0.  Raises ConnectionLost when the connection
        dies before the acknowledgement."""
        self._require_connected()
        packet_id = self._allocate_id() if qos else None
        self._emit("publish", client=self.client_id, node=self.node_id, topic=topic, payload=payload, qos=qos,
                   retain=retain, packet_id=packet_id)
        if not qos:
            self._send(Publish(topic, payload, 0, retain))
            await trio.lowlevel.checkpoint()
            return None
        assert packet_id is not None
        kind = "puback" if qos == 1 else "pubrec"
        answer = await self._exchange(kind, packet_id, Publish(topic, payload, qos, retain, packet_id=packet_id))
        assert isinstance(answer, (Puback, Pubrec))
        reason = answer.reason_code
        if qos == 2 and reason < 0x80:
            comp = await self._exchange("pubcomp", packet_id, Pubrel(packet_id))
            assert isinstance(comp, Pubcomp)
            reason = comp.reason_code
        self._outgoing.pop(packet_id, None)
        self._emit("acked", client=self.client_id, node=self.node_id, topic=topic, payload=payload, qos=qos,
                   packet_id=packet_id, reason=reason)
        return reason

    async def subscribe(self, topic_filter: str, qos: int = 1, *, no_local: bool = False,
                        retain_as_published: bool = False, retain_handling: int = 0) -> int:
        """Subscribe to one filter; the SUBACK's granted QoS or reason code."""
        self._require_connected()
        packet_id = self._allocate_id()
        waiter = self._waiter("suback", packet_id)
        self._send(Subscribe(packet_id, (Subscription(topic_filter, qos, no_local, retain_as_published,
                                                      retain_handling),)))
        suback = await waiter.wait()
        assert isinstance(suback, Suback)
        code = suback.reason_codes[0]
        self._emit("subscribed", client=self.client_id, node=self.node_id, filter=topic_filter, qos=qos, reason=code)
        return code

    async def unsubscribe(self, topic_filter: str) -> None:
        self._require_connected()
        packet_id = self._allocate_id()
        waiter = self._waiter("unsuback", packet_id)
        self._send(Unsubscribe(packet_id, (topic_filter,)))
        await waiter.wait()
        self._emit("unsubscribed", client=self.client_id, node=self.node_id, filter=topic_filter)

    async def disconnect(self, reason: int = 0, *, session_expiry: int | None = None) -> None:
        """A clean DISCONNECT, then close (v5: `session_expiry` changes the interval)."""
        if not self.connected or self._end is None:
            return
        props = Properties(session_expiry_interval=session_expiry) if session_expiry is not None else Properties()
        self._send(Disconnect(reason, props if self.protocol == 5 else Properties()))
        self._emit("disconnect", client=self.client_id, node=self.node_id)
        self._closed_by_us()
        await self._end.aclose()

    async def drop(self) -> None:
        """The connection goes away without DISCONNECT (a crashed device, a cut cable):
        the node sees the connection reset at once."""
        if self._pipe is None:
            return
        self._emit("drop", client=self.client_id, node=self.node_id)
        self._closed_by_us()
        self._pipe.sever()
        await trio.lowlevel.checkpoint()

    def messages(self, topic: str | None = None) -> list[Received]:
        return [m for m in self.received if topic is None or m.topic == topic]

    def payloads(self, topic: str | None = None) -> list[bytes]:
        return [m.payload for m in self.messages(topic)]

    # ------------------------------------------------------------------ internals

    async def _exchange(self, kind: str, packet_id: int, packet: Publish | Pubrel) -> Packet:
        """Send `packet` and wait for its answer `kind`; with `resend`, across reconnects
        that find the session (the reconnect sends it again)."""
        waiter = self._waiter(kind, packet_id)
        if self.resend:
            self._outgoing[packet_id] = packet
        try:
            self._send(packet)
        except ConnectionLost:
            if not self.resend:
                raise
        while True:
            try:
                return await waiter.wait()
            except ConnectionLost:
                if not self.resend:
                    raise
            while True:  # until a connect finds the session (and resent it) or loses it
                await self._resumed.wait()
                if packet_id not in self._outgoing:
                    raise ConnectionLost(f"{self.client_id}: the session is gone, and packet {packet_id} with it")
                found = self._waiters.get((kind, packet_id))
                if found is not None and self.connected:
                    waiter = found
                    break

    def _require_connected(self) -> None:
        if not self.connected:
            raise ConnectionLost(f"{self.client_id} is not connected")

    def _closed_by_us(self) -> None:
        self.connected = False
        self._connection += 1  # the old connection's tasks end quietly
        self._fail_waiters()

    def _allocate_id(self) -> int:
        for _ in range(65535):
            self._next_id = self._next_id % 65535 + 1
            if self._next_id not in self._outgoing and not any(pid == self._next_id for _, pid in self._waiters):
                return self._next_id
        raise RuntimeError("no packet id free")

    def _waiter(self, kind: str, packet_id: int) -> _Waiter:
        waiter = _Waiter()
        self._waiters[(kind, packet_id)] = waiter
        return waiter

    def _answer(self, kind: str, packet_id: int, packet: Packet) -> None:
        waiter = self._waiters.pop((kind, packet_id), None)
        if waiter is not None:
            waiter.packet = packet
            waiter.done.set()

    def _fail_waiters(self) -> None:
        waiters, self._waiters = self._waiters, {}
        for waiter in waiters.values():
            waiter.done.set()

    def _send(self, packet: Packet) -> None:
        if self._end is None:
            raise ConnectionLost(f"{self.client_id} has no connection")
        try:
            self._end.send_nowait(encode(packet, self.protocol))
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self._lost(f"send failed: {exc}")
            raise ConnectionLost(str(exc)) from None

    def _lost(self, why: str) -> None:
        if self.connected:
            self._emit("lost", client=self.client_id, node=self.node_id, why=why)
        self.connected = False
        self._ended = self._connection
        self._fail_waiters()

    async def _reader(self, end: PipeEnd, connection: int) -> None:
        decoder = Decoder(role="client", protocol_level=self.protocol)
        why = "closed by the node"
        try:
            while True:
                data = await end.receive_some()
                if not data:
                    break
                decoder.feed(data)
                for packet in decoder:
                    if connection != self._connection:
                        return
                    self._handle(packet)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            why = str(exc)
        except RemoteProtocolError as exc:
            why = f"bad packet from the node: {exc!r}"
        if connection == self._connection:
            self._lost(why)

    def _handle(self, packet: Packet) -> None:
        if isinstance(packet, Publish):
            self._on_publish(packet)
        elif isinstance(packet, Pubrel):
            self._qos2_in.discard(packet.packet_id)
            self._ack(Pubcomp(packet.packet_id))
        elif isinstance(packet, Connack):
            self._answer("connack", 0, packet)
        elif isinstance(packet, Puback):
            self._answer("puback", packet.packet_id, packet)
        elif isinstance(packet, Pubrec):
            self._answer("pubrec", packet.packet_id, packet)
        elif isinstance(packet, Pubcomp):
            self._answer("pubcomp", packet.packet_id, packet)
        elif isinstance(packet, Suback):
            self._answer("suback", packet.packet_id, packet)
        elif isinstance(packet, Unsuback):
            self._answer("unsuback", packet.packet_id, packet)
        elif isinstance(packet, Disconnect):
            self.disconnect_reason = packet.reason_code
            self._emit("kicked", client=self.client_id, node=self.node_id, reason=packet.reason_code)
        elif isinstance(packet, Pingresp):
            pass  # the keep alive was answered: the connection lives, nothing to record

    def _on_publish(self, p: Publish) -> None:
        duplicate = p.qos == 2 and p.packet_id in self._qos2_in
        if not duplicate:
            if p.qos == 2:
                assert p.packet_id is not None
                self._qos2_in.add(p.packet_id)
            self.received.append(Received(p.topic, p.payload, p.qos, p.dup, p.retain, p.packet_id, self._clock.now()))
            self._emit("deliver", client=self.client_id, node=self.node_id, topic=p.topic, payload=p.payload,
                       qos=p.qos, dup=p.dup, retain=p.retain, packet_id=p.packet_id)
        if p.qos == 1:
            assert p.packet_id is not None
            self._ack(Puback(p.packet_id))
        elif p.qos == 2:
            assert p.packet_id is not None
            self._ack(Pubrec(p.packet_id))

    def _ack(self, packet: Packet) -> None:
        if self.ack_delay:
            self._nursery.start_soon(self._ack_later, packet, self._connection)
        else:
            self._send_quietly(packet)

    async def _ack_later(self, packet: Packet, connection: int) -> None:
        await trio.sleep(self.ack_delay)
        if connection == self._connection:
            self._send_quietly(packet)

    def _send_quietly(self, packet: Packet) -> None:
        try:
            self._send(packet)
        except ConnectionLost:
            pass  # the reader reports the loss

    async def _pinger(self, connection: int) -> None:
        # A PINGREQ every 3/4 of the keep alive keeps the node from timing us out.
        while connection == self._connection and self.connected:
            await trio.sleep(self.keepalive * 0.75)
            if connection == self._connection and self.connected:
                self._send_quietly(Pingreq())
