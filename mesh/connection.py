"""One MQTT client connection's I/O: bytes from the stream into the machine, events to
the broker (`mesh.client.Client`), deliveries through the machine back to the stream.

No task per message: one reader task (`run`) per connection, for life on TLS and
WebSocket streams; a plain-TCP client in a node is a `mesh.parked.ParkedConnection`,
which gives its task up while idle.

`write` appends to the outbox; the first write into an empty outbox starts a writer
task (in the node's connection nursery) that flushes the whole outbox in one `send_all`
per round, coalescing writes per scheduler tick, and ends once the outbox is empty.
Plain TCP clients in a node ask the node's `mesh.flusher.Flusher` instead, which sends
for all of them from one task (a writer task only for a socket that does not keep up).

The read side's one deadline is the machine's (the CONNECT timeout, then keep alive
from the last bytes received). When the reader's cancel scope fires, the reader asks
the machine whether time ran out, and else parks (idle) or reads on in a fresh scope.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

import trio

from clock import Clock
from mesh.client import OUTBOX_LIMIT, Client, _persistent, server_settings
from mesh.streams import READ_SIZE, ByteStream
from hooks.registry import PendingPublish
from mqtt import Connect, Publish, ReasonCode, Subscribe

if TYPE_CHECKING:
    from mesh.broker import Broker
    from mesh.security import Security

__all__ = ["ClientConnection", "OUTBOX_LIMIT", "LOST"]

log = logging.getLogger("meshd.connection")

FLUSH_ON_CLOSE_TIMEOUT = 2.0
# `_idle_since` of a connection not read from yet, or parked: one float for all of them
# (a float of its own per idle client is 32 bytes of heap).
NEVER_READ = -math.inf
LOST = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)  # the peer is gone


class ClientConnection(Client):
    __slots__ = ("stream", "_nursery", "_reader_scope", "_writing", "_writer_done", "_idle_since", "_outbox",
                 "_outbox_bytes")
    # TLS and WebSocket streams: the reader's cancel scope follows the machine's deadline
    # on every read, so it fires only when time ran out (their receive is not cancelled
    # for nothing). A parked connection's scope fires anyway once a second (mesh.parked).
    scope_follows_reads = True

    def __init__(self, broker: "Broker", stream: ByteStream, peer: str | int, transport: str = "tcp", *, clock: Clock,
                 connect_timeout: float = 10.0, security: "Security | None" = None, peer_ip: str = "",
                 cert_cn: str | None = None, nursery: trio.Nursery | None = None) -> None:
        super().__init__(broker, clock, server_settings(broker, connect_timeout), peer, transport,
                         security=security, peer_ip=peer_ip, cert_cn=cert_cn)
        self.stream = stream
        self._nursery = nursery  # where writer and reader tasks start
        self._reader_scope: trio.CancelScope | None = None
        # True while a writer task (or the final flush) owns the outbox: a write then
        # only appends; otherwise the write starts a writer.
        self._writing = False
        self._writer_done: trio.Event | None = None  # made only when close waits for a writer
        self._idle_since = NEVER_READ  # clock.now() of the last read
        self._outbox: list[bytes] | None = None  # what `write` collected for the writer
        self._outbox_bytes = 0

    # ---------------------------------------------------------------- output

    def write(self, data: bytes) -> None:
        outbox = self._outbox
        if outbox is None:
            self._outbox = [data]  # made per burst: an idle client holds no list
        else:
            outbox.append(data)
        self._outbox_bytes += len(data)
        if not self._writing:
            self._writing = True
            self._start_writing()

    def _start_writing(self) -> None:
        """The outbox got its first bytes: have them sent (a writer task here; plain TCP
        in a node asks the node's flusher, `mesh.parked`)."""
        assert self._nursery is not None
        self._nursery.start_soon(self._writer)

    def _done_writing(self) -> None:
        """The outbox was sent: the next write starts another round, unless a close
        waits to send what is left (it owns the outbox from now on)."""
        if self._writer_done is None:
            self._writing = False
        else:
            self._writer_done.set()

    def _take_outbox(self) -> bytes:
        """Everything written and not yet sent, as one buffer; the outbox is empty after."""
        outbox = self._outbox
        self._outbox = None
        self._outbox_bytes = 0
        if not outbox:
            return b""
        return outbox[0] if len(outbox) == 1 else b"".join(outbox)

    def _stop(self) -> None:
        if self._reader_scope is not None:
            self._reader_scope.cancel()

    async def _writer(self) -> None:
        """Flush the outbox until it is empty, then end (started by `write`)."""
        try:
            while data := self._take_outbox():
                self.broker.stats.bytes_out += len(data)
                await self.stream.send_all(data)
        except Exception as exc:
            # Runs in the node's nursery: a failed send ends this connection, never the node.
            if not isinstance(exc, LOST):
                log.exception("%s: writer failed", self.peer)
            log.debug("%s: send failed: %s", self.peer, exc)
            self._take_outbox()  # lost with the connection
            self.close()
        finally:
            self._done_writing()

    async def _final_flush(self) -> None:
        """Wait for a running writer, then send what is left (e.g. a DISCONNECT)."""
        with trio.move_on_after(FLUSH_ON_CLOSE_TIMEOUT):
            if self._writing:
                self._writer_done = trio.Event()
                await self._writer_done.wait()
            self._writing = True  # from now on nothing starts a writer
            data = self._take_outbox()
            if data:
                try:
                    await self.stream.send_all(data)
                    self.broker.stats.bytes_out += len(data)
                except LOST:
                    pass  # the peer is gone: what was left has no one to reach

    def _start(self) -> None:
        assert self._nursery is not None
        self._nursery.start_soon(self.run)

    # ------------------------------------------------------------------- run

    async def run(self) -> None:
        """The reader task: from CONNECT (unless answered while parked) until the
        connection ends, or until it parks (idle, plain TCP in a node)."""
        if self._nursery is None:
            async with trio.open_nursery() as nursery:  # writers run in a nursery of our own
                self._nursery = nursery
                await self.run()
            return
        parked = False
        try:
            while not self.closing:
                # Work read and left pending when the last scope fired starts in a scope
                # with no deadline (`_read_loop` sets it after the work): one already past
                # its deadline would fire again before the work could begin, for good.
                with trio.CancelScope(deadline=math.inf if self.awaits_work else self._scope_deadline()) as scope:
                    self._reader_scope = scope
                    await self._read_loop(scope)
                    return
                self._reader_scope = None
                if self.closing:
                    return
                now = self.clock.now()
                timeout = self.machine.handle_timer(now)
                if timeout is not None:
                    if timeout.during_connect:
                        log.info("%s: no CONNECT in time; closing", self.peer)
                        self.closing = True
                    else:
                        # The client.disconnected line says keep_alive_timeout.
                        log.debug("%s: %s keep alive timeout (%.0f s)", self.peer, self.client_id, self.machine.keep_alive * 1.5)
                        self.close(ReasonCode.KEEP_ALIVE_TIMEOUT)
                    return
                if self._park(now):
                    parked = True
                    return
                # Not due, not idle (or the lot is closed): read on in a fresh scope.
        except* LOST as group:
            log.debug("%s: connection lost: %s", self.peer, group.exceptions[0])
        except* Exception:
            # A bug in one connection must not take the listener (or the node) down.
            log.exception("%s: connection failed", self.peer)
        finally:
            self._reader_scope = None
            if not parked:
                self.release_slot()
                with trio.CancelScope(shield=True):
                    if self.session is not None:
                        self.log_disconnected()
                        self.broker.connection_lost(self, self.clock.wall(), publish_will=True)
                    await self._final_flush()
                    await self.stream.aclose()

    def _scope_deadline(self) -> float:
        """When the reader's scope fires (a parkable connection: also when it may park)."""
        return self.machine.deadline

    def _park(self, now: float) -> bool:
        """Give up the reader task (idle): True when parked (only `mesh.parked` parks)."""
        return False

    async def _read_loop(self, scope: trio.CancelScope) -> None:
        """Handle what is buffered, then read and handle until the connection ends. The
        scope may fire meanwhile (see `run`): nothing read is lost then, as a read is a
        checkpoint only before the bytes are taken."""
        machine = self.machine
        clock = self.clock
        stats = self.broker.stats
        receive = self.stream.receive_some
        follow = self.scope_follows_reads
        while True:
            # Work read earlier and not yet done goes first: it may be here again after
            # the scope fired (below), with more packets read behind it.
            if self._rare is not None and self.awaits_work:  # what few clients have: something to await
                if scope.cancel_called:
                    # The scope fired before this could start (its deadline passed while
                    # the reader waited to run; setting it again does not undo that), so
                    # a checkpoint in the work would cut it off half-taken. Leave the
                    # scope: `run` handles the timers, and the work, still pending, starts
                    # whole in a fresh scope.
                    await trio.lowlevel.checkpoint()
                # The work bounds its own waits (hooks, handoff budget, a SUBSCRIBE's
                # filters): no deadline cuts it off; closing the connection still does.
                scope.deadline = math.inf
                if self.pending_publish is not None:
                    await self._publish_hooked(*self.pending_publish)
                elif self.pending_subscribe is not None:
                    await self._subscribe_sliced(self.pending_subscribe)
                elif self.pending_connect is not None and not await self._handshake(self.pending_connect):
                    return
                # Busy until now, not idle: a parkable reader's deadline counts from here
                # (from before the work it could be past already, the next work cut off).
                self._idle_since = clock.now()
                scope.deadline = self._scope_deadline()
            if self._handle_input(clock.wall()):
                return
            rare = self._rare is not None
            if rare and self.awaits_work:
                continue
            if follow:
                scope.deadline = machine.deadline
            if rare and self._rate_delay:
                # publish_rate: read nothing more from this client until the PUBLISH
                # that went over the rate has earned its token.
                await trio.sleep(self._rate_delay)
                self._rate_delay = 0.0
                assert self._publish_bucket is not None
                self._publish_bucket.take(clock.now())
            data = await receive(READ_SIZE)
            if not data:
                return
            stats.bytes_in += len(data)
            self._idle_since = now = clock.now()
            machine.receive_data(data, now)

    def _handle_input(self, now: float) -> bool:
        """`handle_events` for what was read (plain TCP in a node: its writes sent at
        the end, `mesh.parked`)."""
        return self.handle_events(now)

    async def _publish_hooked(self, p: Publish, pending: PendingPublish) -> None:
        """A PUBLISH whose message.publish chain awaits: the rest of the chain, then
        routed and acknowledged; the reader reads nothing more meanwhile, so order holds."""
        self.pending_publish = None
        self.route_publish(p, await self.broker.hooks.finish_publish(pending), self.clock.wall())

    async def _subscribe_sliced(self, p: Subscribe) -> None:
        """A big SUBSCRIBE, a slice of its filters per step with a checkpoint between
        (gossip answers its probes meanwhile); the reader reads nothing more until the
        SUBACK is out, so order holds. A SUBSCRIBE cut off between slices was left
        half-taken, and the packets read with it in the machine of a connection that then
        parked waiting for bytes that never came: `_read_loop` starts it only in a scope
        that has not fired, and with no deadline."""
        self.pending_subscribe = None
        for _ in self.subscribe_steps(p, self.clock.wall()):
            await trio.sleep(0)

    async def _handshake(self, c: Connect) -> bool:
        """The CONNECT's steps (`mesh.client`), awaiting where a step must: the password
        hash in a thread (scrypt costs ~0.1 s of CPU), the session claimed cluster-wide."""
        self.pending_connect = None
        if self.security is not None and self.security.at_capacity():
            await self.security.wait_for_slot()
        if not self.admit():
            return False
        security = self.security
        if security is not None and security.needs_hashing(c.username):
            # The client.authenticate chain, with the password file's KDF, off the Trio thread.
            result = await trio.to_thread.run_sync(self.authenticate_now, c)
        else:
            result = self.authenticate_now(c)
        if not self.authorize(c, result):
            return False
        mesh = self.broker.mesh
        if mesh is not None:
            # Claim the client id cluster-wide; take the session over from the node
            # that holds it (bounded by the handoff budget, below the CONNECT timeout).
            if await mesh.prepare_connect(c.client_id, c.clean_start, _persistent(c)) == "superseded":
                # A newer CONNECT for this id won elsewhere: this one is taken over.
                self.write(self.machine.accept(session_present=False))
                self.close(ReasonCode.SESSION_TAKEN_OVER)
                return False
        self.open_session(c, self.clock.wall())
        self._idle_since = self.clock.now()
        return True
