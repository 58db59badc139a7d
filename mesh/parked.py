"""A plain-TCP client connection that waits in the node's `ParkingLot` while idle.

A connected MQTT client is idle nearly all of its life, and a Trio task per idle client
costs ~4 KB. So this connection has no task while parked (`mesh/parking.py`: one epoll
set and one heap of deadlines for all of them). Its CONNECT is usually answered right
where the lot hands it over, with no task at all (`on_readable`). Otherwise, and
whenever a parked client sends, it gets the reader task of `ClientConnection.run`,
which parks it again once nothing was read for `PARK_AFTER` seconds. Parked, it holds
no MQTT decoder either (`ServerConnection.shed`: the next bytes make a new one).
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

import trio

from clock import Clock
from mesh.connection import LOST, NEVER_READ, ClientConnection
from mesh.parking import ParkingLot
from mesh.streams import READ_SIZE, SocketByteStream

if TYPE_CHECKING:
    from mesh.broker import Broker
    from mesh.security import Security

log = logging.getLogger("meshd.connection")

# A parkable reader that read nothing for this long gives up its task. Long enough that
# a busy client never churns between task and lot, short enough that idle ones do not
# hold a task for long.
PARK_AFTER = 1.0


class ParkedConnection(ClientConnection):
    __slots__ = ("_lot", "_heap_at", "_lot_registered")
    scope_follows_reads = False  # the scope fires once a second anyway (PARK_AFTER)

    def __init__(self, broker: "Broker", stream: SocketByteStream, peer: str | int, *, clock: Clock, lot: ParkingLot,
                 nursery: trio.Nursery, connect_timeout: float = 10.0, security: "Security | None" = None,
                 peer_ip: str = "") -> None:
        super().__init__(broker, stream, peer, "tcp", clock=clock, connect_timeout=connect_timeout,
                         security=security, peer_ip=peer_ip, nursery=nursery)
        self._lot = lot
        self._heap_at = math.inf  # owned by the lot
        self._lot_registered = False  # owned by the lot

    def _start_writing(self) -> None:
        flusher = self._lot.flusher
        if flusher is None or not flusher.request(self):
            super()._start_writing()

    def _handle_input(self, now: float) -> bool:
        flusher = self._lot.flusher
        if flusher is None:
            return self.handle_events(now)
        flusher.hold()  # what this input makes us (and others) write leaves when it is handled
        try:
            return self.handle_events(now)
        finally:
            flusher.release()

    def flush_queued(self) -> None:
        """The flusher's turn (`mesh.flusher`): send the outbox with one non-blocking
        write; what the socket does not take now goes to a writer task, which waits."""
        if self._writer_done is not None and not self._writing:
            return  # the final flush took over (it sends what is left itself)
        data = self._take_outbox()
        if data:
            assert isinstance(self.stream, SocketByteStream)
            try:
                sent = self.stream.send_nowait(data)
            except LOST as exc:
                log.debug("%s: send failed: %s", self.peer, exc)
                self._done_writing()
                self.close()
                return
            self.broker.stats.bytes_out += sent
            if sent < len(data):
                self._outbox = [data[sent:]]  # nothing was written meanwhile: the rest goes first
                self._outbox_bytes = len(data) - sent
                assert self._nursery is not None
                self._nursery.start_soon(self._writer)  # it ends the round
                return
        self._done_writing()

    def _stop(self) -> None:
        if self._lot.unpark(self):
            self._start()  # a task to say goodbye and close the socket
        else:
            super()._stop()

    def _scope_deadline(self) -> float:
        if self._lot.stopped or self.session is None:
            return self.machine.deadline
        return min(self.machine.deadline, self._idle_since + PARK_AFTER)

    def _park(self, now: float) -> bool:
        if (now - self._idle_since >= PARK_AFTER and not self._rate_delay and not self.awaits_work
                and self._lot.park(self)):
            self._idle_since = NEVER_READ  # unused while parked (`on_readable` sets it): no float of its own
            self.machine.shed()  # nor a decoder (made again by the next bytes)
            return True
        return False

    def fileno(self) -> int:
        assert isinstance(self.stream, SocketByteStream)
        return self.stream.fileno()

    @property
    def deadline(self) -> float:
        return self.machine.deadline

    def park_new(self) -> None:
        """A just-accepted connection: the CONNECT is often here already (sent right
        after the handshake, which the kernel finished before accept)."""
        self.on_readable()

    def on_readable(self) -> None:
        """The lot: bytes (or EOF) arrived for this parked connection."""
        if self.session is None and not self.closing:
            try:
                if self._connect_inline():
                    return
            except LOST:
                self.closing = True  # reset by the peer: the task closes the socket
            except Exception:
                log.exception("%s: CONNECT failed", self.peer)
                self.closing = True
        self._idle_since = self.clock.now()  # active now: the task reads for PARK_AFTER at least
        self._start()

    def on_deadline(self) -> None:
        """The lot: the CONNECT timeout or keep alive ran out while parked."""
        self._start()  # the task finds its deadline passed and says why

    def on_lot_closed(self) -> None:
        """The node stops: a connection still parked (no CONNECT yet) is closed."""
        self.close()
        self._start()

    def _connect_inline(self) -> bool:
        """Answer a CONNECT from the lot with no task when nothing in it must wait;
        True when done (parked again), False when `run` must go on."""
        lot = self._lot
        stream = self.stream
        assert isinstance(stream, SocketByteStream)
        data = stream.receive_nowait(READ_SIZE)
        if data is None:
            return lot.park(self)  # woken for nothing
        if not data:
            return False  # EOF: the task ends the connection
        self.broker.stats.bytes_in += len(data)
        now = self.clock.now()
        self.machine.receive_data(data, now)
        self._writing = True  # hold writes: they leave below, in one send, without a writer task
        try:
            end = self.handle_events(self.clock.wall())  # the CONNECT and what came with it
        finally:
            self._writing = False
        if end:
            self.closing = True  # the task flushes what is in the outbox, then closes
        if (self.closing or self.pending_connect is not None or self.pending_publish is not None
                or self.pending_subscribe is not None or not self._flush_now() or self._rate_delay):
            return False
        if not lot.park(self):  # `_idle_since` stays NEVER_READ: unused while parked
            return False
        self.machine.shed()  # an idle client holds no decoder either
        return True

    def _flush_now(self) -> bool:
        """Send the outbox as far as the socket takes it now; a writer task sends the
        rest. False when the connection is broken."""
        data = self._take_outbox()
        if not data:
            return True
        assert isinstance(self.stream, SocketByteStream)
        try:
            sent = self.stream.send_nowait(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            log.debug("%s: send failed: %s", self.peer, exc)
            return False
        self.broker.stats.bytes_out += sent
        if sent < len(data):
            self.write(data[sent:])
        return True
