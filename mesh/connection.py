"""One MQTT client connection: the Trio shell around the codec and the broker.

No task per message, and none for an idle plain-TCP client: such a connection waits
in the node's `ParkingLot` (one epoll set for all of them, `mesh/parking.py`) and costs
its objects only (this one, its socket, decoder and session). Its CONNECT is usually
answered right there, synchronously, with no task at all (`on_readable`). Otherwise,
and whenever a parked client sends, the connection gets one reader task (`run`) that
decodes packets and handles each synchronously (the broker never awaits), and parks
the connection again once nothing was read for `PARK_AFTER` seconds. TLS and WebSocket
clients keep their reader task for life.

Handlers append encoded bytes to this connection's outbox. The first write into an
empty outbox starts a writer task (in the node's connection nursery) that flushes the
whole outbox in one `send_all` per round, which coalesces writes per scheduler tick,
and ends once the outbox is empty.

Deadlines: `_deadline` (Trio clock) is the read side's one deadline: the CONNECT
timeout, then keep alive, pushed forward on every read. A parkable reader's cancel
scope is not moved per read: when it fires, the reader looks at `_deadline` and either
times out, parks the connection (idle) or carries on in a fresh scope.

Back-pressure: QoS 1/2 deliveries beyond the inflight window wait in the session queue
(bounded by `max_queued_messages`); QoS 0 deliveries are dropped, and counted, while
the outbox holds more than `OUTBOX_LIMIT` bytes (a slow consumer loses QoS 0 first and
never makes the node grow without bound).
"""

from __future__ import annotations

import logging
import math
import socket
import time
from collections import deque
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

import trio

from mqtt import (
    EMPTY_PROPERTIES,
    Auth,
    Connack,
    Connect,
    Decoder,
    Disconnect,
    MQTTError,
    Pingreq,
    Pingresp,
    Properties,
    Puback,
    RemoteProtocolError,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    ReasonCode,
    Suback,
    Subscribe,
    Unsuback,
    Unsubscribe,
    encode,
    patch_publish,
)
from mqtt.encoder import encode_plain_publish
from mesh.acl import ClientAcl
from mesh.limits import TokenBucket
from mesh.parking import ParkingLot
from routing.links import AckGate
from session_store.model import Delivery, Session

if TYPE_CHECKING:
    from mesh.broker import Broker
    from mesh.security import Security

log = logging.getLogger("meshd.connection")

OUTBOX_LIMIT = 4 * 1024 * 1024
READ_SIZE = 65536
FLUSH_ON_CLOSE_TIMEOUT = 2.0
# A parkable reader that read nothing for this long gives up its task. Long enough that
# a busy client never churns between task and lot, short enough that idle ones do not
# hold a task for long.
PARK_AFTER = 1.0


class ByteStream(Protocol):
    async def receive_some(self, max_bytes: int | None = None) -> bytes: ...
    async def send_all(self, data: bytes) -> None: ...
    async def aclose(self) -> None: ...


class SocketByteStream:
    """A connected non-blocking `socket.socket` as a ByteStream, for plain TCP clients.

    What `trio.SocketStream` does, with the same checkpoints and errors, minus what
    an idle client pays for it (~2 KB: trio's socket wrapper, two conflict
    detectors, and the frames of its helpers while a read waits). One reader task
    and at most one writer task use it, never two of either.
    """

    __slots__ = ("_sock",)

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self._sock = sock

    def fileno(self) -> int:
        return self._sock.fileno()

    def receive_nowait(self, max_bytes: int = READ_SIZE) -> bytes | None:
        """Whatever the socket has now (b"" at EOF), None when nothing; no checkpoint."""
        sock = self._sock
        try:
            return sock.recv(max_bytes)
        except BlockingIOError:
            return None
        except OSError as exc:
            raise _stream_error(sock, exc) from exc

    def send_nowait(self, data: bytes) -> int:
        """Send what the socket takes now; how many bytes that was. No checkpoint."""
        sock = self._sock
        try:
            return sock.send(data)
        except BlockingIOError:
            return 0
        except OSError as exc:
            raise _stream_error(sock, exc) from exc

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        sock = self._sock
        size = max_bytes or READ_SIZE
        await trio.lowlevel.checkpoint_if_cancelled()
        waited = False
        while True:
            try:
                data = sock.recv(size)
                break
            except BlockingIOError:
                pass
            except OSError as exc:
                raise _stream_error(sock, exc) from exc
            # Wait outside the except block: a handled exception (with its traceback)
            # would stay alive for as long as the client is idle (~0.5 KB).
            await trio.lowlevel.wait_readable(sock)
            waited = True
        if not waited:
            await trio.lowlevel.cancel_shielded_checkpoint()
        return data

    async def send_all(self, data: bytes) -> None:
        sock = self._sock
        await trio.lowlevel.checkpoint_if_cancelled()
        waited = False
        try:
            with memoryview(data) as view:
                total = len(view)
                sent = 0
                while sent < total:
                    try:
                        sent += sock.send(view[sent:] if sent else view)
                        continue
                    except BlockingIOError:
                        pass
                    await trio.lowlevel.wait_writable(sock)
                    waited = True
        except OSError as exc:
            raise _stream_error(sock, exc) from exc
        if not waited:
            await trio.lowlevel.cancel_shielded_checkpoint()

    async def aclose(self) -> None:
        sock = self._sock
        if sock.fileno() != -1:
            trio.lowlevel.notify_closing(sock)  # a task waiting on it gets ClosedResourceError
            sock.close()
        await trio.lowlevel.checkpoint()


def _stream_error(sock: socket.socket, exc: OSError) -> Exception:
    if sock.fileno() == -1:
        return trio.ClosedResourceError("socket was closed")
    return trio.BrokenResourceError(f"socket connection broken: {exc}")


class ClientConnection:
    __slots__ = (
        "broker", "stream", "peer", "transport", "decoder", "protocol_level", "client_id",
        "session", "keep_alive", "will", "username", "send_window", "client_max_packet",
        "alias_in", "alias_out", "alias_out_max", "closing", "close_reason", "_writing",
        "_outbox", "_outbox_bytes", "_writer_done", "_nursery", "_reader_scope", "request_problem_info",
        "connect_timeout", "_pending_acks", "security", "peer_ip", "cert_cn", "acl", "_publish_bucket", "_rate_delay", "acl_generation",
        "_lot", "_lot_registered", "_deadline", "_heap_at", "_idle_since", "_connect_packet",
    )

    def __init__(self, broker: "Broker", stream: ByteStream, peer: str, transport: str = "tcp", *, connect_timeout: float = 10.0,
                 security: "Security | None" = None, peer_ip: str = "", cert_cn: str | None = None,
                 nursery: trio.Nursery | None = None, lot: ParkingLot | None = None) -> None:
        self.broker = broker
        self.stream = stream
        self.peer = peer
        self.transport = transport
        self.connect_timeout = connect_timeout
        self.security = security
        self.peer_ip = peer_ip
        self.cert_cn = cert_cn
        self.acl: ClientAcl | None = None  # None: no ACL configured, everything allowed
        self.acl_generation = 0
        rate = security.settings.publish_rate if security is not None else 0.0
        self._publish_bucket = TokenBucket(rate, max(1.0, rate)) if rate else None
        self._rate_delay = 0.0
        self.decoder = Decoder(role="server", max_packet_size=broker.limits.max_packet_size)
        self.protocol_level = 4
        self.client_id = ""
        self.session: Session | None = None
        self.keep_alive = 0
        self.will: Any = None
        self.username: str | None = None
        self.send_window = broker.limits.max_inflight
        self.client_max_packet: int | None = None
        # Topic alias maps, created on first use (most clients never use aliases).
        self.alias_in: dict[int, str] | None = None
        self.alias_out: dict[str, int] | None = None
        self.alias_out_max = 0
        self.request_problem_info = True
        self.closing = False
        self.close_reason: int | None = None
        self._outbox: list[bytes] = []
        self._outbox_bytes = 0
        # True while a writer task (or the final flush) owns the outbox: a write then
        # only appends; otherwise the write starts a writer.
        self._writing = False
        self._writer_done: trio.Event | None = None  # made only when close waits for a writer
        self._nursery = nursery  # where writer and reader tasks start (not a bound method: 0.1 KB)
        self._reader_scope: trio.CancelScope | None = None
        # Acks waiting for a sync or a remote node; created on first use.
        self._pending_acks: deque[tuple[int, AckGate | None, Any]] | None = None
        # Parking (plain TCP in a node only: the stream must be a SocketByteStream).
        self._lot = lot
        self._deadline = math.inf  # CONNECT timeout, then keep alive (Trio clock)
        self._heap_at = math.inf  # owned by the lot
        self._lot_registered = False  # owned by the lot
        self._idle_since = -math.inf  # Trio time of the last read
        self._connect_packet: Connect | None = None  # decoded while parked, for run()

    # ---------------------------------------------------------------- output

    def write(self, data: bytes) -> None:
        self._outbox.append(data)
        self._outbox_bytes += len(data)
        if not self._writing:
            self._writing = True
            assert self._nursery is not None
            self._nursery.start_soon(self._writer)

    def send(self, packet: Any) -> None:
        self.write(encode(packet, self.protocol_level))

    def close(self, reason: int | None = None) -> None:
        """Close from the server side: DISCONNECT with `reason` on v5, then the socket."""
        if self.closing:
            return
        self.closing = True
        self.close_reason = reason
        if reason is not None and self.protocol_level == 5 and self.session is not None:
            self.send(Disconnect(reason_code=reason))
        if self._lot is not None and self._lot.unpark(self):
            self._start()  # a task to say goodbye and close the socket
        elif self._reader_scope is not None:
            self._reader_scope.cancel()

    def take_will(self) -> Any:
        will, self.will = self.will, None
        return will

    # -------------------------------------------------------------- delivery

    def deliver(self, delivery: Delivery, now: float, cache: dict[Any, bytes] | None = None) -> None:
        """Send one delivery now, or queue it behind the inflight window."""
        session = self.session
        assert session is not None
        if delivery.message.expired(now):
            self.broker.stats.dropped_expired += 1
            return
        if self.closing:
            # DISCONNECT is on its way: nothing may follow it on the wire (QoS >= 1
            # waits in the session for the next connection).
            if delivery.qos:
                self.broker.enqueue(session, delivery)
            return
        if delivery.qos == 0:
            if self._outbox_bytes > OUTBOX_LIMIT:
                self.broker.stats.dropped_slow_consumer += 1
                return
            self._send_publish(delivery, None, False, now, cache)
            return
        if session.queued or len(session.inflight) >= self.send_window:
            self.broker.stats.window_full += 1
            self.broker.enqueue(session, delivery)
            return
        pid = session.allocate_packet_id()
        self.broker.add_inflight(session, pid, delivery)
        self._send_publish(delivery, pid, False, now, cache)

    def _send_publish(self, d: Delivery, packet_id: int | None, dup: bool, now: float, cache: dict[Any, bytes] | None) -> None:
        msg = d.message
        level = self.protocol_level
        data: bytes | None = None
        key = None
        if cache is not None and not self.alias_out_max:
            key = (level, d.qos, d.retain, d.subscription_ids)
            data = cache.get(key)
        if data is None:
            topic = msg.topic
            props = EMPTY_PROPERTIES
            if level == 5:
                props = msg.properties
                changes: dict[str, Any] = {}
                if d.subscription_ids:
                    changes["subscription_identifiers"] = d.subscription_ids
                if msg.expires_at is not None:
                    changes["message_expiry_interval"] = msg.remaining_expiry(now)
                if self.alias_out_max and not dup:
                    alias_out = self.alias_out
                    if alias_out is None:
                        alias_out = self.alias_out = {}
                    alias = alias_out.get(topic)
                    if alias is not None:
                        changes["topic_alias"] = alias
                        topic = ""
                    elif len(alias_out) < self.alias_out_max:
                        alias = len(alias_out) + 1
                        alias_out[topic] = alias
                        changes["topic_alias"] = alias
                if changes:
                    props = replace(props, **changes)
            if props is EMPTY_PROPERTIES:
                data = encode_plain_publish(topic, msg.payload, d.qos, d.retain, dup, packet_id if d.qos else None, level)
            else:
                data = encode(
                    Publish(topic=topic, payload=msg.payload, qos=d.qos, retain=d.retain, dup=dup,
                            packet_id=packet_id if d.qos else None, properties=props),
                    level,
                )
            if self.client_max_packet is not None and len(data) > self.client_max_packet:
                # MQTT-3.1.2-25: too big for this client: discard as if delivered.
                self.broker.stats.dropped_too_large += 1
                if packet_id is not None and self.session is not None:
                    self.broker.release_inflight(self.session, packet_id)
                return
            if key is not None:
                cache[key] = data  # type: ignore[index]
        elif packet_id is not None:
            data = patch_publish(data, packet_id=packet_id)
        self.broker.stats.messages_out[d.qos] += 1
        self.write(data)

    def _fill_window(self, now: float) -> None:
        session = self.session
        assert session is not None
        if not session.queued:
            return
        queue = session.queue
        broker = self.broker
        while queue and len(session.inflight) < self.send_window and not self.closing:
            d = broker.dequeue(session)
            if d.message.expired(now):
                broker.release_dequeued(session, d)
                broker.stats.dropped_expired += 1
                continue
            if d.qos == 0:
                broker.release_dequeued(session, d)
                self._send_publish(d, None, False, now, None)
                continue
            pid = session.allocate_packet_id()
            broker.add_inflight(session, pid, d)
            self._send_publish(d, pid, False, now, None)

    def _resume(self, now: float) -> None:
        """Session resumed: resend unacknowledged PUBLISHes with DUP=1 and pending
        PUBRELs, in their original order (MQTT-4.4.0-1), then drain the queue."""
        session = self.session
        assert session is not None
        for pid, entry in list(session.inflight.items()):
            if entry.state == "pubrel":
                self.send(Pubrel(packet_id=pid))
            elif entry.delivery.message.expired(now):
                self.broker.release_inflight(session, pid)
                self.broker.stats.dropped_expired += 1
            else:
                self._send_publish(entry.delivery, pid, True, now, None)
        self._fill_window(now)

    # --------------------------------------------------------------- parking

    def fileno(self) -> int:
        return self.stream.fileno()  # type: ignore[attr-defined]

    def park_new(self) -> None:
        """A just-accepted connection: wait in the lot for its CONNECT."""
        assert self._lot is not None
        self._deadline = trio.current_time() + self.connect_timeout
        # The CONNECT is often here already (sent right after the handshake, which the
        # kernel finished before accept): answer it now, or park if it is not.
        self.on_readable()

    def _start(self) -> None:
        assert self._nursery is not None
        self._nursery.start_soon(self.run)

    def on_readable(self) -> None:
        """The lot: bytes (or EOF) arrived for this parked connection."""
        if self.session is None and not self.closing:
            try:
                if self._connect_inline():
                    return
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self.closing = True  # reset by the peer: the task closes the socket
            except Exception:
                log.exception("%s: CONNECT failed", self.peer)
                self.closing = True
        self._idle_since = trio.current_time()  # active now: the task reads for PARK_AFTER at least
        self._start()

    def on_deadline(self) -> None:
        """The lot: the CONNECT timeout or keep alive ran out while parked."""
        self._start()  # the task finds its deadline passed and says why

    def on_lot_closed(self) -> None:
        """The node stops: a connection still parked (no CONNECT yet) is closed."""
        self.close()
        self._start()

    def _connect_inline(self) -> bool:
        """Answer a CONNECT from the lot with no task when nothing in it needs to wait;
        True when done (parked again or handed to a writer), False when `run` must go on."""
        lot = self._lot
        stream = self.stream
        assert lot is not None and isinstance(stream, SocketByteStream)
        data = stream.receive_nowait(READ_SIZE)
        if data is None:
            return lot.park(self)  # woken for nothing
        if not data:
            return False  # EOF: the task ends the connection
        self.broker.stats.bytes_in += len(data)
        decoder = self.decoder
        try:
            decoder.feed(data)
            packet = decoder.next_packet()
        except MQTTError as exc:
            self._answer_bad_connect(exc)
            self.closing = True
            return False
        if packet is None:
            return lot.park(self)  # the rest of the CONNECT is on its way
        if type(packet) is not Connect:
            log.info("%s: first packet was not CONNECT; closing", self.peer)
            self.closing = True
            return False
        if not self._can_connect_now(packet):
            self._connect_packet = packet
            return False
        self._writing = True  # hold writes: they leave below, in one send, without a writer task
        try:
            if not self._handle_connect_now(packet, time.time()):
                self.closing = True
            elif self._handle_buffered():  # packets that came with the CONNECT
                self.closing = True
        finally:
            self._writing = False
        if self.closing:
            return False  # the task flushes what is in the outbox, then closes
        if not self._flush_now():
            self.closing = True
            return False
        if self._rate_delay:
            return False
        now = trio.current_time()
        self._idle_since = now
        self._deadline = now + self.keep_alive * 1.5 if self.keep_alive else math.inf
        return lot.park(self)

    def _flush_now(self) -> bool:
        """Send the outbox from here as far as the socket takes it now; a writer task
        sends the rest. False when the connection is broken."""
        outbox = self._outbox
        if not outbox or self._writing:
            return True
        data = outbox[0] if len(outbox) == 1 else b"".join(outbox)
        outbox.clear()
        self._outbox_bytes = 0
        try:
            sent = self.stream.send_nowait(data)  # type: ignore[attr-defined]
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            log.debug("%s: send failed: %s", self.peer, exc)
            return False
        self.broker.stats.bytes_out += sent
        if sent < len(data):
            self.write(data[sent:])
        return True

    def _can_connect_now(self, c: Connect) -> bool:
        """Whether `_handle_connect` would never wait for this CONNECT: no password hash
        to check (a thread), no session to claim or fetch from another node."""
        security = self.security
        if security is not None and security.needs_hashing(c.username):
            return False
        cluster = self.broker.cluster
        if cluster is None:
            return True
        persistent = (c.properties.session_expiry_interval or 0) > 0 if c.protocol_level == 5 else not c.clean_start
        return _handoff_is_noop(getattr(cluster, "handoffs", None), c.client_id, c.clean_start, persistent)

    # ------------------------------------------------------------------- run

    async def run(self) -> None:
        """The connection's reader task: from CONNECT (unless answered while parked)
        until it ends, or until it parks (idle, plain TCP in a node)."""
        if self._nursery is None:
            # No nursery given: writers run in a nursery of our own.
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                await self.run()
            return
        parked = False
        try:
            if self.closing:
                return  # closed (or broken) while parked or before the task ran
            if self.session is None and self._connect_packet is None and self._deadline == math.inf:
                self._deadline = trio.current_time() + self.connect_timeout  # MQTT-3.1.0-1
            while True:
                with trio.CancelScope(deadline=self._scope_deadline()) as scope:
                    self._reader_scope = scope
                    if self.session is None:
                        connect, self._connect_packet = self._connect_packet, None
                        if connect is None:
                            connect = await self._read_connect()
                            if connect is None:
                                return
                        scope.deadline = self._deadline = math.inf
                        if not await self._handle_connect(connect, time.time()):
                            return
                        connect = None  # not kept alive by this frame for the connection's lifetime
                        now = trio.current_time()
                        self._idle_since = now
                        if self.keep_alive:
                            self._deadline = now + self.keep_alive * 1.5
                        scope.deadline = self._scope_deadline()
                    # Packets that arrived together with CONNECT, or were read while parked.
                    if self._handle_buffered():
                        return
                    await self._read_loop()
                    return
                self._reader_scope = None
                if self.closing:
                    return
                now = trio.current_time()
                if now >= self._deadline:
                    if self.session is None:
                        log.info("%s: no CONNECT within %.0f s; closing", self.peer, self.connect_timeout)
                    else:
                        log.info("%s: %s keep alive timeout (%.0f s)", self.peer, self.client_id, self.keep_alive * 1.5)
                        self.close(ReasonCode.KEEP_ALIVE_TIMEOUT)
                    return
                lot = self._lot
                if lot is not None and now - self._idle_since >= PARK_AFTER and self._pending_ok() and lot.park(self):
                    parked = True
                    return
                # Not due, not idle (or the lot is closed): read on in a fresh scope.
        except* (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as group:
            log.debug("%s: connection lost: %s", self.peer, group.exceptions[0])
        except* Exception:
            # A bug in one connection must not take the listener (or the node) down.
            log.exception("%s: connection failed", self.peer)
        finally:
            self._reader_scope = None
            if not parked:
                with trio.CancelScope(shield=True):
                    if self.session is not None:
                        self.broker.connection_lost(self, time.time(), publish_will=True)
                    await self._final_flush()
                    await self.stream.aclose()

    def _scope_deadline(self) -> float:
        """When the reader's scope fires: its deadline, or when it may park (if idle)."""
        lot = self._lot
        if lot is None or lot.stopped or self.session is None:
            return self._deadline
        return min(self._deadline, self._idle_since + PARK_AFTER)

    def _pending_ok(self) -> bool:
        """Nothing that only the reader task finishes (a publish_rate pause)."""
        return not self._rate_delay

    async def _read_loop(self) -> None:
        """Read and handle packets until the connection ends. The scope around it may
        fire meanwhile (see `run`): nothing read is lost then, as a read is a checkpoint
        only before the bytes are taken."""
        decoder = self.decoder
        stats = self.broker.stats
        receive = self.stream.receive_some
        grace = self.keep_alive * 1.5
        track = bool(grace) or self._lot is not None
        # TLS and WebSocket streams: the scope's deadline moves with every read, so it
        # fires only when keep alive ran out (their receive is not cancelled mid-stream
        # for nothing). A parkable socket's scope fires anyway once a second (see `run`).
        scope = self._reader_scope if self._lot is None else None
        while True:
            if self._rate_delay:
                # publish_rate: read nothing more from this client until the PUBLISH
                # that went over the rate has earned its token.
                await trio.sleep(self._rate_delay)
                self._rate_delay = 0.0
                assert self._publish_bucket is not None
                self._publish_bucket.take(time.time())
            data = await receive(READ_SIZE)
            if not data:
                return
            stats.bytes_in += len(data)
            if track:
                # MQTT-3.1.2-22: keep alive counts from the last packet received.
                now = trio.current_time()
                self._idle_since = now
                if grace:
                    self._deadline = now + grace
                    if scope is not None:
                        scope.deadline = self._deadline
            try:
                decoder.feed(data)
            except MQTTError as exc:
                self._protocol_violation(exc)
                return
            if self._handle_buffered():
                return

    async def _read_connect(self) -> Connect | None:
        """First packet must be CONNECT (within the caller's deadline)."""
        while True:
            data = await self.stream.receive_some(READ_SIZE)
            if not data:
                return None
            self.broker.stats.bytes_in += len(data)
            try:
                self.decoder.feed(data)
                packet = self.decoder.next_packet()
            except MQTTError as exc:
                self._answer_bad_connect(exc)
                return None
            if packet is not None:
                if not isinstance(packet, Connect):
                    log.info("%s: first packet was not CONNECT; closing", self.peer)
                    return None
                return packet

    def _answer_bad_connect(self, exc: MQTTError) -> None:
        self.broker.stats.protocol_errors += 1
        log.info("%s: bad CONNECT: %s (reason 0x%02X)", self.peer, exc, exc.reason_code)
        level = self.decoder.protocol_level
        if exc.reason_code == ReasonCode.UNSUPPORTED_PROTOCOL_VERSION:
            # Answer in the oldest dialect the client may understand (MQTT-3.1.2-2).
            self.protocol_level = 4
            self.send(Connack(reason_code=ReasonCode.UNSUPPORTED_PROTOCOL_VERSION))
        elif level == 5:
            self.protocol_level = 5
            self.send(Connack(reason_code=exc.reason_code))

    # --------------------------------------------------------------- CONNECT

    async def _handle_connect(self, c: Connect, now: float) -> bool:
        """CONNECT to CONNACK: False when refused (CONNACK with the reason is sent)."""
        ids = self._connect_prologue(c)
        if ids is None:
            return False
        client_id, assigned = ids
        security = self.security
        if security is not None:
            if not self._admit():
                return False
            if security.needs_hashing(c.username):
                # scrypt costs ~0.1 s of CPU: never on the Trio thread.
                result = await trio.to_thread.run_sync(security.authenticate, c.username, c.password, self.peer_ip, self.cert_cn)
            else:
                result = security.authenticate(c.username, c.password, self.peer_ip, self.cert_cn)
            if not self._accept_auth(c, client_id, result):
                return False
        if not self._accept_will(c):
            return False
        cluster = self.broker.cluster
        if cluster is not None:
            # Claim the client id cluster-wide; take the session over from the node
            # that holds it (bounded by the handoff budget, below the CONNECT timeout).
            persistent = (c.properties.session_expiry_interval or 0) > 0 if c.protocol_level == 5 else not c.clean_start
            outcome = await cluster.handoffs.prepare_connect(client_id, c.clean_start, persistent)
            if outcome == "superseded":
                # A newer CONNECT for this id won elsewhere: this one is taken over.
                self.send(Connack(session_present=False, reason_code=ReasonCode.SUCCESS))
                if c.protocol_level == 5:
                    self.send(Disconnect(reason_code=ReasonCode.SESSION_TAKEN_OVER))
                self.closing = True
                return False
            now = time.time()
        self._open_session(c, client_id, assigned, now)
        return True

    def _handle_connect_now(self, c: Connect, now: float) -> bool:
        """`_handle_connect` for a CONNECT that `_can_connect_now` cleared: no await."""
        ids = self._connect_prologue(c)
        if ids is None:
            return False
        client_id, assigned = ids
        security = self.security
        if security is not None:
            if not self._admit():
                return False
            if not self._accept_auth(c, client_id, security.authenticate(c.username, c.password, self.peer_ip, self.cert_cn)):
                return False
        if not self._accept_will(c):
            return False
        self._open_session(c, client_id, assigned, now)
        return True

    def _connect_prologue(self, c: Connect) -> tuple[str, str | None] | None:
        """The client id (assigned when empty and allowed) and whether it was assigned;
        None when refused."""
        level = c.protocol_level
        self.protocol_level = level
        client_id = c.client_id
        assigned = None
        if not client_id:
            if level == 5 or (level == 4 and c.clean_start):
                client_id = assigned = self.broker.assign_client_id()
            else:
                self.send(Connack(reason_code=ReasonCode.CLIENT_IDENTIFIER_NOT_VALID))
                return None
        if level == 5 and c.properties.authentication_method is not None:
            self.send(Connack(reason_code=ReasonCode.BAD_AUTHENTICATION_METHOD))
            return None
        self.client_id = client_id
        self.username = c.username
        return client_id, assigned

    def _admit(self) -> bool:
        """Connection limits (MQTT-3.2.2-7 reason codes; v3 return codes by the encoder)."""
        security = self.security
        assert security is not None
        refusal = security.admit(self.peer_ip, self.broker.client_count(), time.monotonic())
        if refusal is not None:
            self.send(Connack(reason_code=refusal))
            return False
        return True

    def _accept_auth(self, c: Connect, client_id: str, result: Any) -> bool:
        """Authentication's verdict, then the client's ACL and the will's check against it."""
        security = self.security
        assert security is not None
        if not result.ok:
            self.send(Connack(reason_code=result.reason_code))
            return False
        if result.username is not None:
            self.username = result.username
        self.acl = security.client_acl(self.username, client_id, self.peer_ip)
        self.acl_generation = security.acl_generation
        if c.will is not None and self.acl is not None and not self.acl.can_publish(c.will.topic):
            security.denied("publish")
            log.info("%s: %s refused: the will topic %r is not allowed by the ACL", self.peer, client_id, c.will.topic)
            self.send(Connack(reason_code=ReasonCode.NOT_AUTHORIZED))
            return False
        return True

    def _accept_will(self, c: Connect) -> bool:
        self.will = c.will
        if c.will is not None and c.will.retain and not self.broker.limits.retain_available:
            self.send(Connack(reason_code=ReasonCode.RETAIN_NOT_SUPPORTED))
            return False
        return True

    def _open_session(self, c: Connect, client_id: str, assigned: str | None, now: float) -> None:
        """Keep alive and v5 limits, the session, CONNACK, and a resumed session's backlog."""
        limits = self.broker.limits
        level = c.protocol_level
        props = c.properties
        keep_alive = c.keep_alive
        server_keep_alive = None
        if level == 5 and limits.max_keepalive < 65535 and (keep_alive == 0 or keep_alive > limits.max_keepalive):
            keep_alive = server_keep_alive = limits.max_keepalive
        elif level == 5 and keep_alive > limits.max_keepalive:
            keep_alive = server_keep_alive = limits.max_keepalive
        self.keep_alive = keep_alive

        if level == 5:
            if props.receive_maximum is not None:
                self.send_window = min(self.send_window, props.receive_maximum)
            self.client_max_packet = props.maximum_packet_size
            self.alias_out_max = props.topic_alias_maximum or 0
            if props.request_problem_information == 0:
                self.request_problem_info = False

        session, present = self.broker.open_session(self, c, client_id, now)
        self.session = session

        ack_props = EMPTY_PROPERTIES
        if level == 5:
            fields: dict[str, Any] = {
                "receive_maximum": limits.receive_maximum,
                "maximum_packet_size": limits.max_packet_size,
                "topic_alias_maximum": limits.topic_alias_maximum,
            }
            if assigned is not None:
                fields["assigned_client_identifier"] = assigned
            if server_keep_alive is not None:
                fields["server_keep_alive"] = server_keep_alive
            if not limits.retain_available:
                fields["retain_available"] = 0
            if props.request_response_information == 1:
                fields["response_information"] = f"meshd/response/{client_id}"
            ack_props = Properties(**fields)
        self.send(Connack(session_present=present, reason_code=ReasonCode.SUCCESS, properties=ack_props))
        log.debug("%s: %s connected (v%d, %s, session present=%s)", self.peer, client_id, level, self.transport, present)
        if present:
            self._resume(now)

    def _handle_buffered(self) -> bool:
        """Handle every complete packet in the decoder; True when the connection must end."""
        now = time.time()
        try:
            while True:
                packet = self.decoder.next_packet()
                if packet is None:
                    return self.closing
                self._dispatch(packet, now)
                if self.closing:
                    return True
        except MQTTError as exc:
            self._protocol_violation(exc)
            return True

    def _protocol_violation(self, exc: MQTTError) -> None:
        self.broker.stats.protocol_errors += 1
        limit = _LIMIT_BY_REASON.get(exc.reason_code)
        if limit is not None and self.security is not None:
            self.security.limits_hit[limit] += 1
        log.info("%s: %s protocol violation: %s (reason 0x%02X); closing", self.peer, self.client_id, exc, exc.reason_code)
        self.close(exc.reason_code)

    async def _writer(self) -> None:
        """Flush the outbox until it is empty, then end (started by `write`)."""
        stream = self.stream
        stats = self.broker.stats
        outbox = self._outbox
        try:
            while outbox:
                data = b"".join(outbox)
                outbox.clear()
                self._outbox_bytes = 0
                stats.bytes_out += len(data)
                await stream.send_all(data)
        except Exception as exc:
            # Runs in the node's nursery: a failed send ends this connection, never the node.
            if not isinstance(exc, (trio.BrokenResourceError, trio.ClosedResourceError, OSError)):
                log.exception("%s: writer failed", self.peer)
            else:
                log.debug("%s: send failed: %s", self.peer, exc)
            outbox.clear()
            self._outbox_bytes = 0
            self.close()
        finally:
            if self._writer_done is None:
                self._writing = False
            else:
                self._writer_done.set()  # closing: the final flush owns the outbox now

    async def _final_flush(self) -> None:
        """Wait for a running writer, then send what is left (e.g. a DISCONNECT)."""
        with trio.move_on_after(FLUSH_ON_CLOSE_TIMEOUT):
            if self._writing:
                self._writer_done = trio.Event()
                await self._writer_done.wait()
            self._writing = True  # from now on nothing starts a writer
            if not self._outbox:
                return
            data = b"".join(self._outbox)
            self._outbox.clear()
            self._outbox_bytes = 0
            try:
                await self.stream.send_all(data)
                self.broker.stats.bytes_out += len(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass

    # -------------------------------------------------------------- handlers

    def _dispatch(self, p: Any, now: float) -> None:
        t = type(p)
        if t is Publish:
            self._on_publish(p, now)
        elif t is Puback:
            self._on_ack(p.packet_id, now)
        elif t is Pubrec:
            self._on_pubrec(p, now)
        elif t is Pubrel:
            self._on_pubrel(p)
        elif t is Pubcomp:
            self._on_ack(p.packet_id, now)
        elif t is Subscribe:
            self._on_subscribe(p, now)
        elif t is Unsubscribe:
            self._on_unsubscribe(p)
        elif t is Pingreq:
            self.send(Pingresp())
        elif t is Disconnect:
            self._on_disconnect(p)
        elif t is Connect:
            # MQTT-3.1.0-2: a second CONNECT is a protocol error.
            self._protocol_violation(_error(ReasonCode.PROTOCOL_ERROR, "second CONNECT on one connection"))
        elif t is Auth:
            self._protocol_violation(_error(ReasonCode.PROTOCOL_ERROR, "AUTH without enhanced authentication"))
        else:
            self._protocol_violation(_error(ReasonCode.PROTOCOL_ERROR, f"unexpected {t.__name__}"))

    def _on_publish(self, p: Publish, now: float) -> None:
        session = self.session
        assert session is not None
        broker = self.broker
        topic = p.topic
        props = p.properties
        if self.protocol_level == 5 and props.topic_alias is not None:
            alias = props.topic_alias
            if alias > broker.limits.topic_alias_maximum:
                self._protocol_violation(_error(ReasonCode.TOPIC_ALIAS_INVALID, f"topic alias {alias} above maximum"))
                return
            if self.alias_in is None:
                self.alias_in = {}
            if topic:
                self.alias_in[alias] = topic
            else:
                topic = self.alias_in.get(alias, "")
                if not topic:
                    self._protocol_violation(_error(ReasonCode.PROTOCOL_ERROR, f"unknown topic alias {alias}"))
                    return
        if p.retain and not broker.limits.retain_available:
            self._protocol_violation(_error(ReasonCode.RETAIN_NOT_SUPPORTED, "retain not available"))
            return
        qos = p.qos
        if qos == 2:
            pid = p.packet_id
            if pid in session.qos2_in:
                # Retransmission of a QoS 2 PUBLISH we already took: do not route again.
                self.send(Pubrec(packet_id=pid))
                return
            if len(session.qos2_in) >= broker.limits.receive_maximum:
                self._protocol_violation(_error(ReasonCode.RECEIVE_MAXIMUM_EXCEEDED, "receive maximum exceeded"))
                return
        if self.security is not None:
            refusal = self._publish_refusal(topic, now)
            if refusal is not None:
                # v5 says why on QoS 1/2; v3 has no negative ack: the message is dropped.
                rc = refusal if self.protocol_level == 5 else ReasonCode.SUCCESS
                if qos == 1:
                    self.send(Puback(packet_id=p.packet_id, reason_code=rc))
                elif qos == 2:
                    self.send(Pubrec(packet_id=p.packet_id, reason_code=rc))
                return
        store = broker.store
        epoch_before = store.write_epoch
        msg = broker.make_message(topic, p.payload, qos, p.retain, props, self.client_id, now)
        # In a cluster the ack also waits for the nodes the message was forwarded to.
        gate = AckGate() if qos and broker.cluster is not None else None
        matched = broker.publish(msg, now, gate=gate)
        if qos == 0:
            return
        rc = ReasonCode.SUCCESS if matched or self.protocol_level != 5 else ReasonCode.NO_MATCHING_SUBSCRIBERS
        if qos == 1:
            ack: Any = Puback(packet_id=p.packet_id, reason_code=rc)
        else:
            broker.qos2_received(session, p.packet_id)
            ack = Pubrec(packet_id=p.packet_id, reason_code=rc)
        self._send_ack(ack, epoch_before, gate if gate is not None and gate.waiting else None)

    def _send_ack(self, ack: Any, epoch_before: int, gate: AckGate | None = None) -> None:
        """Principle 6: acknowledge only once what the acknowledged packet wrote to the
        store is synced (in `sync` durability). Acks leave in the order of the packets
        they answer (MQTT-4.6.0-2), so once one waits, later ones queue behind it."""
        broker = self.broker
        store = broker.store
        wait_for = store.write_epoch if broker.acks_wait_for_sync and store.write_epoch != epoch_before else 0
        if self._pending_acks or wait_for > store.durable_epoch or gate is not None:
            if self._pending_acks is None:
                self._pending_acks = deque()
            self._pending_acks.append((wait_for, gate, ack))
            broker.ack_waiters.add(self)
        else:
            self.send(ack)

    def release_acks(self, durable_epoch: int) -> bool:
        """Send the acks that no longer wait (durable here, acknowledged by the nodes
        they were forwarded to); True when none are left."""
        pending = self._pending_acks
        if pending is None:
            return True
        while pending:
            epoch, gate, ack = pending[0]
            if epoch > durable_epoch or (gate is not None and gate.waiting > 0):
                break
            pending.popleft()
            self.send(ack)
        return not pending

    def _publish_refusal(self, topic: str, now: float) -> int | None:
        """Limits and ACL for one PUBLISH: a reason code to refuse it with, or None."""
        security = self.security
        assert security is not None
        if self._publish_bucket is not None and not self._publish_bucket.take(now):
            # Over publish_rate: slow the reader down instead of refusing (back-pressure).
            security.limits_hit["publish_rate"] += 1
            self._rate_delay = self._publish_bucket.delay_until_available(now)
        if topic.count("/") >= security.settings.max_topic_levels:
            security.limits_hit["max_topic_levels"] += 1
            return ReasonCode.TOPIC_NAME_INVALID
        if security.refuse_during_netsplit("publish"):
            return ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR
        self._refresh_acl()
        if self.acl is not None and not self.acl.can_publish(topic):
            security.denied("publish")
            log.debug("%s: %s may not publish to %r", self.peer, self.client_id, topic)
            return ReasonCode.NOT_AUTHORIZED
        return None

    def _refresh_acl(self) -> None:
        """Rules changed (SIGHUP, file edit, cluster-wide set): recompile this client's."""
        security = self.security
        assert security is not None
        if self.acl_generation != security.acl_generation:
            self.acl = security.client_acl(self.username, self.client_id, self.peer_ip)
            self.acl_generation = security.acl_generation

    def _subscribe_refusal(self, topic_filter: str) -> int | None:
        security = self.security
        session = self.session
        assert security is not None and session is not None
        if topic_filter.count("/") >= security.settings.max_topic_levels:
            security.limits_hit["max_topic_levels"] += 1
            return ReasonCode.TOPIC_FILTER_INVALID
        if topic_filter not in session.subscriptions and len(session.subscriptions) >= security.settings.max_subscriptions_per_client:
            security.limits_hit["max_subscriptions_per_client"] += 1
            return ReasonCode.QUOTA_EXCEEDED
        if security.refuse_during_netsplit("subscribe"):
            return ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR
        self._refresh_acl()
        if self.acl is not None and not self.acl.can_subscribe(topic_filter):
            security.denied("subscribe")
            log.debug("%s: %s may not subscribe to %r", self.peer, self.client_id, topic_filter)
            return ReasonCode.NOT_AUTHORIZED
        return None

    def _on_pubrel(self, p: Pubrel) -> None:
        session = self.session
        assert session is not None
        if p.packet_id in session.qos2_in:
            self.broker.qos2_released(session, p.packet_id)
            self.send(Pubcomp(packet_id=p.packet_id))
        else:
            self.send(Pubcomp(packet_id=p.packet_id, reason_code=ReasonCode.PACKET_IDENTIFIER_NOT_FOUND))

    def _on_ack(self, packet_id: int, now: float) -> None:
        session = self.session
        assert session is not None
        if self.broker.release_inflight(session, packet_id):
            self._fill_window(now)

    def _on_pubrec(self, p: Pubrec, now: float) -> None:
        session = self.session
        assert session is not None
        entry = session.inflight.get(p.packet_id)
        if entry is None:
            if self.protocol_level == 5:
                self.send(Pubrel(packet_id=p.packet_id, reason_code=ReasonCode.PACKET_IDENTIFIER_NOT_FOUND))
            return
        if p.reason_code >= 0x80:
            # The receiver refused the message: the exchange ends here.
            self.broker.release_inflight(session, p.packet_id)
            self._fill_window(now)
            return
        if entry.state != "pubrel":
            self.broker.mark_pubrel(session, p.packet_id, entry)
        self.send(Pubrel(packet_id=p.packet_id))

    def _on_subscribe(self, p: Subscribe, now: float) -> None:
        session = self.session
        assert session is not None
        sub_id = p.properties.subscription_identifiers[0] if p.properties.subscription_identifiers else None
        codes: list[int] = []
        retained: list[Delivery] = []
        epoch_before = self.broker.store.write_epoch
        for sub in p.subscriptions:
            refusal = self._subscribe_refusal(sub.topic_filter) if self.security is not None else None
            if refusal is not None:
                codes.append(refusal)
                continue
            code, found = self.broker.subscribe(session, sub, sub_id, now)
            codes.append(code)
            retained.extend(found)
        self._send_ack(Suback(packet_id=p.packet_id, reason_codes=tuple(codes)), epoch_before)
        for d in retained:
            self.deliver(d, now)

    def _on_unsubscribe(self, p: Unsubscribe) -> None:
        session = self.session
        assert session is not None
        epoch_before = self.broker.store.write_epoch
        codes = tuple(
            ReasonCode.SUCCESS if self.broker.unsubscribe(session, f) else ReasonCode.NO_SUBSCRIPTION_EXISTED
            for f in p.topic_filters
        )
        self._send_ack(Unsuback(packet_id=p.packet_id, reason_codes=codes), epoch_before)

    def _on_disconnect(self, p: Disconnect) -> None:
        session = self.session
        assert session is not None
        if p.reason_code != ReasonCode.DISCONNECT_WITH_WILL:
            self.will = None  # MQTT-3.14.4-3: a normal DISCONNECT discards the will
        expiry = p.properties.session_expiry_interval
        if expiry is not None:
            if session.expiry_interval == 0 and expiry != 0:
                # MQTT-3.14.2-2: a 0 expiry from CONNECT cannot be raised on DISCONNECT.
                self._protocol_violation(_error(ReasonCode.PROTOCOL_ERROR, "session expiry raised on DISCONNECT"))
                return
            self.broker.set_expiry(session, expiry)
        self.closing = True


# Protocol violations that are a configured limit biting, counted per limit.
_LIMIT_BY_REASON = {
    ReasonCode.PACKET_TOO_LARGE: "max_packet_size",
    ReasonCode.TOPIC_ALIAS_INVALID: "topic_alias_maximum",
    ReasonCode.RECEIVE_MAXIMUM_EXCEEDED: "receive_maximum",
}


def _error(code: int, message: str) -> MQTTError:
    return RemoteProtocolError(message, code)


def _handoff_is_noop(handoffs: Any, client_id: str, clean_start: bool, persistent: bool) -> bool:
    """Whether the CONNECT can be answered without awaiting the session handoff."""
    return handoffs is not None and handoffs.connect_is_local(client_id, clean_start, persistent)
