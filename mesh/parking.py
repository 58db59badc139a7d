"""Idle plain-TCP connections wait here, with no task of their own.

A connected MQTT client is idle nearly all of its life. One Trio task per idle client
costs ~4 KB (the task, its coroutine frames, a cancel scope, trio's epoll waiter
records); Mosquitto pays ~0.7 KB per client. So an idle connection is *parked*: its
socket sits in one `epoll` set of our own (one-shot, re-armed on every park), its read
deadline (CONNECT timeout, then keep alive) in one heap, and one task (`run`) waits on
the epoll descriptor for all of them. When bytes arrive, or a deadline passes, the
connection is unparked and handed back (`on_readable` / `on_deadline`): it answers
synchronously when it can (a CONNECT, usually) or starts its task, which parks it again
once it has been idle for a while.

The lot knows nothing about MQTT: a parked thing needs `fileno()`, a `deadline` (on
the lot's clock, `inf` for none), `_heap_at` (inf) and `_lot_registered` (False) slots
the lot owns, and the two callbacks.
"""

from __future__ import annotations

import heapq
import itertools
import math
import select
from typing import Protocol

import trio

from clock import Clock
from mesh.flusher import Flusher

_ARM = select.EPOLLIN | select.EPOLLONESHOT
_MAX_EVENTS = 512
COMPACT_AT = 256  # stale heap entries below this many are left to expire


class Parkable(Protocol):
    @property
    def deadline(self) -> float: ...

    _heap_at: float
    _lot_registered: bool

    def fileno(self) -> int: ...
    def on_readable(self) -> None: ...
    def on_deadline(self) -> None: ...
    def on_lot_closed(self) -> None: ...


class ParkingLot:
    """Parked connections by file descriptor, and one heap of their deadlines."""

    def __init__(self, clock: Clock, flusher: Flusher | None = None) -> None:
        self._clock = clock  # on Trio's timeline: its deadlines become cancel scopes
        # Where the node's plain-TCP connections (the ones that park here) send from
        # (`mesh.flusher`; None: each starts writer tasks of its own).
        self.flusher = flusher
        self._epoll = select.epoll()
        # Parked connections by descriptor: a list indexed by fd (descriptors are small,
        # dense numbers), 8 bytes a slot where a dict entry costs ~40 (~0.03 KB less per
        # idle client).
        self._parked: list[Parkable | None] = []
        self._count = 0
        # (deadline, tie-break, conn); at most one live entry per conn: the one whose
        # deadline equals conn._heap_at (later deadlines are re-pushed when popped).
        self._heap: list[tuple[float, int, Parkable]] = []
        self._seq = itertools.count()
        # Entries left behind by connections whose deadline went to `inf` while one was
        # in the heap (the CONNECT timeout's, once a client without keep alive is in).
        # They would stay until that deadline passes, ~130 bytes each (the tuple, its
        # float and int): once they are half the heap it is rebuilt without them.
        self._stale = 0
        self._wait_scope: trio.CancelScope | None = None  # while run() waits
        self.stopped = False

    def __len__(self) -> int:
        return self._count

    def _get(self, fd: int) -> Parkable | None:
        parked = self._parked
        return parked[fd] if 0 <= fd < len(parked) else None

    def _take(self, fd: int) -> Parkable | None:
        """The connection parked under `fd`, no longer parked; None if none was."""
        parked = self._parked
        if not 0 <= fd < len(parked):
            return None
        conn = parked[fd]
        if conn is not None:
            parked[fd] = None
            self._count -= 1
        return conn

    def parked(self) -> list[Parkable]:
        """Every connection parked now."""
        return [conn for conn in self._parked if conn is not None]

    def is_parked(self, conn: Parkable) -> bool:
        return self._get(conn.fileno()) is conn

    def park(self, conn: Parkable) -> bool:
        """Park `conn` until its socket is readable or its deadline passes; False when
        the lot is stopped (the caller keeps its task)."""
        if self.stopped:
            return False
        fd = conn.fileno()
        if fd < 0:
            return False
        parked = self._parked
        if fd >= len(parked):
            parked.extend([None] * (fd + 1 - len(parked)))
        if parked[fd] is None:
            self._count += 1
        parked[fd] = conn
        if conn._lot_registered:
            # Parked before: the one-shot registration is still there, disarmed. (It
            # goes when the socket closes; a conn never outlives its socket.)
            self._epoll.modify(fd, _ARM)
        else:
            self._epoll.register(fd, _ARM)
            conn._lot_registered = True
        deadline = conn.deadline
        if deadline < conn._heap_at:
            conn._heap_at = deadline
            heapq.heappush(self._heap, (deadline, next(self._seq), conn))
            scope = self._wait_scope
            if scope is not None and deadline < scope.deadline:
                scope.deadline = deadline  # the waiting loop must wake earlier
        elif deadline == math.inf and conn._heap_at != math.inf:
            conn._heap_at = math.inf  # its entry is stale now (skipped when popped)
            self._stale += 1
            if self._stale > COMPACT_AT and 2 * self._stale > len(self._heap):
                self._compact()
        return True

    def _compact(self) -> None:
        """Drop the heap's stale entries (in place: `run` holds the list)."""
        heap = self._heap
        heap[:] = [entry for entry in heap if entry[2]._heap_at == entry[0]]
        heapq.heapify(heap)
        self._stale = 0

    def unpark(self, conn: Parkable) -> bool:
        """Take `conn` out (e.g. to close it); False when it was not parked. Its one-shot
        registration may still fire once: an event for an fd not parked is ignored."""
        fd = conn.fileno()
        if self._get(fd) is conn:
            self._take(fd)
            return True
        return False

    async def run(self) -> None:
        """Wait for parked sockets and deadlines; hand each over when it is due."""
        epoll = self._epoll
        heap = self._heap
        take = self._take
        while True:
            with trio.CancelScope(deadline=heap[0][0] if heap else math.inf) as scope:
                self._wait_scope = scope
                try:
                    await trio.lowlevel.wait_readable(epoll.fileno())
                except trio.ClosedResourceError:
                    return  # stop() closed the epoll set
            self._wait_scope = None
            while True:
                events = epoll.poll(0, _MAX_EVENTS)
                for fd, _mask in events:
                    conn = take(fd)
                    if conn is not None:
                        conn.on_readable()
                if len(events) < _MAX_EVENTS:
                    break
            self._expire(self._clock.now())

    def _expire(self, now: float) -> None:
        heap = self._heap
        while heap and heap[0][0] <= now:
            at, _, conn = heapq.heappop(heap)
            if conn._heap_at != at:
                continue  # superseded by an earlier entry for the same conn
            conn._heap_at = math.inf
            fd = conn.fileno()
            if self._get(fd) is not conn:
                continue  # active (its task keeps the deadline) or gone
            if conn.deadline <= now:
                self._take(fd)
                conn.on_deadline()
            elif conn.deadline < math.inf:
                conn._heap_at = conn.deadline
                heapq.heappush(heap, (conn.deadline, next(self._seq), conn))

    def stop(self) -> list[Parkable]:
        """No more parking; return what was parked (the caller closes those)."""
        self.stopped = True
        left = self.parked()
        self._parked.clear()
        self._count = 0
        self._heap.clear()
        self._stale = 0
        for conn in left:
            conn._heap_at = math.inf
        trio.lowlevel.notify_closing(self._epoll.fileno())  # a waiting run() gets ClosedResourceError
        self._epoll.close()
        return left
