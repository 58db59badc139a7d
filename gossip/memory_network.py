"""An in-memory network for whole nodes in virtual time (memberlist's ``MockNetwork``,
TigerBeetle's packet simulator): the same ``Transport`` a node binds, with the faults of
a real network, deterministic under ``trio.testing.MockClock`` and a seeded RNG.

Every link (a directed pair of hosts) has a latency with jitter, a datagram loss rate,
a bandwidth and a stream reset rate: the network's defaults, or ``set_link``'s. On
streams, like TCP:

- bytes arrive in order, after the link's latency; a write of n bytes takes
  n / bandwidth of virtual time on the link (streams of one link share it);
- a writer waits while ``stream_window`` bytes are sent and not yet read (a reader
  that does not read, or a partition, pushes back on the writer);
- a partition (``cut``, one way or both; ``down``) holds the bytes of an open stream
  in the blocked direction, as TCP keeps retransmitting them, and they flow again,
  in order, one latency after the heal; a connect across it hangs (SYNs go
  unanswered) until the heal or ``syn_timeout``, so callers' connect timeouts run;
- a reset (``reset(a, b)``, the link's ``reset`` rate) breaks both ends: each one's
  next or pending call raises BrokenResourceError;
- a transport closed as by a crash closes its streams as a kernel closes a dead
  process's sockets (``kernel_close``): a FIN behind what it had sent where it had read
  everything sent to it (the peer reads EOF: a crash is not always an error to the
  peer), a reset where bytes to it were unread.

Datagrams obey the same cuts. One task (``run``) delivers everything, from one heap of
(time, seq, item): no task per packet, byte or stream.
"""

from __future__ import annotations

import dataclasses
import errno
import heapq
import math
import random
from collections import deque
from typing import NoReturn, Sequence

import trio

from clock import Clock, TrioClock

from .transport import Addr, StreamHandler, Transport


@dataclasses.dataclass(frozen=True)
class LinkSpec:
    """How one direction between two hosts behaves."""

    latency: float = 0.002  # one-way seconds
    jitter: float = 0.5  # each delay is latency * (1 +- jitter), uniform
    loss: float = 0.0  # probability that a datagram is lost
    bandwidth: float = math.inf  # stream bytes per second
    reset: float = 0.0  # probability that one stream write resets its connection


class MemoryNetwork:
    """Hands out `MemoryTransport`s and carries their traffic.

    ``await nursery.start(net.run)`` first. ``cut(a, b)`` partitions hosts (``one_way``:
    only a -> b), ``heal()`` undoes cuts, ``down(host)`` silences a host as if it were
    unplugged (``up`` plugs it back), ``reset(a, b)`` drops the connections between two
    hosts, ``set_link(src, dst, ...)`` overrides one direction's behaviour.
    """

    def __init__(
        self, *, latency: float = 0.002, jitter: float = 0.5, loss: float = 0.0, seed: int = 0,
        rng: random.Random | None = None, clock: Clock | None = None, bandwidth: float = math.inf,
        reset: float = 0.0, stream_window: int = 256 * 1024, syn_timeout: float = 127.0,
        kernel_close: bool = True,
    ) -> None:
        self.default = LinkSpec(latency=latency, jitter=jitter, loss=loss, bandwidth=bandwidth, reset=reset)
        self.stream_window = stream_window
        # Linux gives up a connect after its SYN retries (tcp_syn_retries=6): 127 s.
        self.syn_timeout = syn_timeout
        # What a closed transport (a node stopped or killed) does to its open streams.
        # False: resets them all. True: what a kernel does for a dead process's
        # sockets: an orderly end (FIN) where the dead side had read everything sent to
        # it, so the peer reads EOF, and a reset only where bytes to it were unread. A
        # peer that takes an EOF for a graceful answer is caught only with True.
        self.kernel_close = kernel_close
        self.rng = rng if rng is not None else random.Random(seed)
        # deadlines go to trio.sleep_until/move_on_at: the clock must be on Trio's timeline
        self.clock: Clock = clock if clock is not None else TrioClock()
        self.transports: dict[Addr, MemoryTransport] = {}
        self._links: dict[tuple[str, str], LinkSpec] = {}
        self._link_free_at: dict[tuple[str, str], float] = {}
        self._blocked: set[tuple[str, str]] = set()
        self._down: set[str] = set()
        self._heap: list[tuple[float, int, _Datagram | _Pipe]] = []
        self._seq = 0
        self._wake = trio.Event()
        self._topology_changed = trio.Event()
        self._connections: set[_Connection] = set()
        self._stalled: set[_Pipe] = set()
        self.delivered = 0  # datagrams
        self.dropped = 0  # datagrams
        self.resets = 0  # stream connections reset

    # ------------------------------------------------------------------ the world

    def transport(self, host: str, port: int = 7946) -> MemoryTransport:
        """A transport bound at (host, port); it replaces a closed one there (a restart)."""
        t = MemoryTransport(self, (host, port))
        self.transports[(host, port)] = t
        return t

    def set_link(self, src: str, dst: str, **changes: float) -> LinkSpec:
        """Override the direction src -> dst (fields of `LinkSpec`; the rest keep
        the network's defaults). Streams already open follow it from their next write."""
        spec = dataclasses.replace(self._links.get((src, dst), self.default), **changes)
        self._links[(src, dst)] = spec
        return spec

    def link(self, src: str, dst: str) -> LinkSpec:
        return self._links.get((src, dst), self.default)

    def cut(self, a: str | Sequence[str], b: str | Sequence[str], *, one_way: bool = False) -> None:
        """Block every host of `a` from every host of `b`, both ways unless `one_way`
        (then only a -> b; b -> a stays open). Open streams stall in blocked directions."""
        for src, dst in _pairs(a, b, one_way):
            self._blocked.add((src, dst))
        self._changed()

    def heal(self, a: str | Sequence[str] | None = None, b: str | Sequence[str] | None = None, *,
             one_way: bool = False) -> None:
        """Undo cuts: all of them (and every `down`) with no arguments, else those
        between `a` and `b`. Stalled bytes flow again, in order, one latency later."""
        if a is None or b is None:
            self._blocked.clear()
            self._down.clear()
        else:
            self._blocked.difference_update(_pairs(a, b, one_way))
        self._changed()

    def down(self, host: str) -> None:
        """The host is unplugged: nothing reaches it or leaves it until `up`/`heal`."""
        self._down.add(host)
        self._changed()

    def up(self, host: str) -> None:
        self._down.discard(host)
        self._changed()

    def reachable(self, src: str, dst: str) -> bool:
        return (src, dst) not in self._blocked and src not in self._down and dst not in self._down

    def reset(self, a: str, b: str) -> int:
        """Reset every open stream between hosts a and b (either way): both ends see
        a broken stream. Returns how many were reset."""
        hit = sorted((c for c in self._connections if {c.client[0], c.server[0]} == {a, b}),
                     key=lambda c: c.forward.ident)
        for conn in hit:
            self._reset(conn)
        return len(hit)

    # ------------------------------------------------------------------ the engine

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Deliver datagrams and stream bytes when they are due, for ever."""
        task_status.started()
        while True:
            deadline = self._heap[0][0] if self._heap else math.inf
            self._wake = trio.Event()
            with trio.move_on_at(deadline):
                await self._wake.wait()
            now = self.clock.now()
            while self._heap and self._heap[0][0] <= now:
                item = heapq.heappop(self._heap)[2]
                if isinstance(item, _Pipe):
                    self._deliver(item, now)
                else:
                    self._deliver_datagram(item)

    def _schedule(self, when: float, item: _Datagram | _Pipe) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (when, self._seq, item))
        self._wake.set()

    def _delay(self, spec: LinkSpec) -> float:
        return spec.latency * (1 - spec.jitter + 2 * spec.jitter * self.rng.random())

    def _changed(self) -> None:
        """Cuts or downs changed: wake waiting connects, release stalled streams."""
        self._topology_changed.set()
        self._topology_changed = trio.Event()
        now = self.clock.now()
        for pipe in sorted(self._stalled, key=lambda p: p.ident):  # set order is not seeded
            if pipe.flowing():
                self._stalled.discard(pipe)
                pipe.stalled = False
                # TCP retransmits what the partition swallowed: in order, one latency from now
                resend_at = now + self._delay(self.link(pipe.src[0], pipe.dst[0]))
                pipe.in_flight = deque((max(at, resend_at), data) for at, data in pipe.in_flight)
                pipe.last_arrival = max(pipe.last_arrival, resend_at)
                self._schedule(resend_at, pipe)

    # datagrams

    def _send(self, src: Addr, data: bytes, dst: Addr) -> None:
        spec = self.link(src[0], dst[0])
        if not self.reachable(src[0], dst[0]) or (spec.loss and self.rng.random() < spec.loss):
            self.dropped += 1
            return
        self._schedule(self.clock.now() + self._delay(spec), _Datagram(dst, data, src))

    def _deliver_datagram(self, d: _Datagram) -> None:
        target = self.transports.get(d.dst)
        if target is None or target.closed:
            self.dropped += 1
            return
        try:
            target._inbox_send.send_nowait((d.data, d.src))
            self.delivered += 1
        except trio.WouldBlock:
            self.dropped += 1  # a full socket buffer drops, too

    # streams

    async def _connect(self, src: Addr, dst: Addr) -> MemoryStream:
        """One round trip (SYN, SYN-ACK) to the listener at dst. Across a partition a
        real SYN gets no answer and is retried, so the connect hangs: until the heal,
        or `syn_timeout` (TimeoutError, an OSError). That is why it does not fail at
        once: callers must bound connects with their own timeouts, as they must on
        TCP, and the simulation exercises exactly those timeouts."""
        deadline = self.clock.now() + self.syn_timeout
        while True:
            if self.reachable(src[0], dst[0]) and self.reachable(dst[0], src[0]):
                rtt = self._delay(self.link(src[0], dst[0])) + self._delay(self.link(dst[0], src[0]))
                await trio.sleep(rtt)
                if self.reachable(src[0], dst[0]) and self.reachable(dst[0], src[0]):
                    break
            else:
                with trio.move_on_at(deadline):
                    await self._topology_changed.wait()
            if self.clock.now() >= deadline:
                raise TimeoutError(errno.ETIMEDOUT, f"connect to {dst} timed out")
        target = self.transports.get(dst)
        if target is None or target.closed:
            raise ConnectionRefusedError(errno.ECONNREFUSED, f"connect to {dst} refused")
        self._seq += 1
        conn = _Connection(self, src, dst, self._seq)
        try:
            target._accept_send.send_nowait(conn.server_end)
        except trio.WouldBlock:
            raise ConnectionRefusedError(errno.ECONNREFUSED, f"{dst} refused the connection (backlog full)") from None
        self._connections.add(conn)
        return conn.client_end

    def _transmit(self, pipe: _Pipe, data: bytes | None) -> float:
        """Put `data` (None: the FIN) on the wire; when the writer is done sending it."""
        now = self.clock.now()
        link = (pipe.src[0], pipe.dst[0])
        spec = self.link(*link)
        done = now
        if data:
            if spec.reset and self.rng.random() < spec.reset:
                self._reset(pipe.conn)
                return now
            if spec.bandwidth != math.inf:
                start = max(now, self._link_free_at.get(link, now))
                done = start + len(data) / spec.bandwidth
                self._link_free_at[link] = done
            pipe.pending += len(data)
        arrival = max(done + self._delay(spec), pipe.last_arrival)  # TCP never reorders
        pipe.last_arrival = arrival
        pipe.in_flight.append((arrival, data))
        if not pipe.stalled:
            self._schedule(arrival, pipe)
        return done

    def _deliver(self, pipe: _Pipe, now: float) -> None:
        if pipe.stalled or not pipe.in_flight or pipe.in_flight[0][0] > now:
            return
        if not pipe.flowing():
            pipe.stalled = True  # held until `_changed` finds its way open
            self._stalled.add(pipe)
            return
        while pipe.in_flight and pipe.in_flight[0][0] <= now:
            data = pipe.in_flight.popleft()[1]
            if data is None:
                pipe.eof = True
            elif pipe.reader_closed:
                pipe.pending -= len(data)
            else:
                pipe.buffer += data
        if pipe.in_flight:
            # writes made during a stall have no heap entry of their own: the next
            # one is due when the head is
            self._schedule(pipe.in_flight[0][0], pipe)
        pipe.readable.unpark_all()
        pipe.writable.unpark_all()

    def _reset(self, conn: _Connection) -> None:
        if conn.broken:
            return
        conn.broken = True
        self.resets += 1
        self._connections.discard(conn)
        for pipe in (conn.forward, conn.backward):
            self._stalled.discard(pipe)
            pipe.in_flight.clear()
            pipe.buffer.clear()
            pipe.pending = 0
            pipe.readable.unpark_all()
            pipe.writable.unpark_all()

    def _closed(self, conn: _Connection) -> None:
        if conn.client_end.closed and conn.server_end.closed:
            self._connections.discard(conn)


def _hosts(x: str | Sequence[str]) -> list[str]:
    return [x] if isinstance(x, str) else list(x)


def _pairs(a: str | Sequence[str], b: str | Sequence[str], one_way: bool) -> set[tuple[str, str]]:
    pairs = {(s, d) for s in _hosts(a) for d in _hosts(b)}
    return pairs if one_way else pairs | {(d, s) for s, d in pairs}


class _Datagram:
    __slots__ = ("dst", "data", "src")

    def __init__(self, dst: Addr, data: bytes, src: Addr) -> None:
        self.dst, self.data, self.src = dst, data, src


class _Pipe:
    """One direction of a connection: bytes on their way from src to dst, and those
    arrived and not yet read."""

    __slots__ = ("net", "conn", "src", "dst", "ident", "in_flight", "buffer", "pending", "last_arrival",
                 "eof", "reader_closed", "stalled", "readable", "writable")

    def __init__(self, conn: _Connection, src: Addr, dst: Addr, ident: int) -> None:
        self.net = conn.net
        self.conn = conn
        self.src, self.dst = src, dst
        self.ident = ident  # a stable order for releasing stalled pipes
        self.in_flight: deque[tuple[float, bytes | None]] = deque()  # (arrival, bytes or None: FIN)
        self.buffer = bytearray()
        self.pending = 0  # bytes written and not yet read: the window
        self.last_arrival = -math.inf
        self.eof = False
        self.reader_closed = False
        self.stalled = False
        self.readable = trio.lowlevel.ParkingLot()
        self.writable = trio.lowlevel.ParkingLot()

    def flowing(self) -> bool:
        return self.net.reachable(self.src[0], self.dst[0])


class _Connection:
    def __init__(self, net: MemoryNetwork, client: Addr, server: Addr, seq: int) -> None:
        self.net = net
        self.client, self.server = client, server
        self.broken = False
        self.forward = _Pipe(self, client, server, 2 * seq)
        self.backward = _Pipe(self, server, client, 2 * seq + 1)
        self.client_end = MemoryStream(self, self.forward, self.backward)
        self.server_end = MemoryStream(self, self.backward, self.forward)


class MemoryStream(trio.abc.Stream):
    """One end of an in-memory TCP connection."""

    def __init__(self, conn: _Connection, out: _Pipe, inp: _Pipe) -> None:
        self._conn = conn
        self._out = out
        self._in = inp
        self.closed = False

    @property
    def peer(self) -> Addr:
        return self._out.dst

    def _check(self) -> None:
        if self.closed:
            raise trio.ClosedResourceError("stream closed")
        if self._conn.broken:
            raise trio.BrokenResourceError("connection reset")

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await trio.lowlevel.checkpoint()
        self._check()
        out = self._out
        payload = bytes(data)
        # the window: wait while what is unread would overflow it (one big write
        # into an empty window goes, or it could never be sent)
        while out.pending and out.pending + len(payload) > self._conn.net.stream_window:
            await out.writable.park()
            self._check()
        if out.reader_closed:
            raise trio.BrokenResourceError("the peer closed the stream")
        if not payload:
            return
        done = self._conn.net._transmit(out, payload)
        self._check()  # the write may have reset it
        if done > self._conn.net.clock.now():
            await trio.sleep_until(done)

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()
        self._check()
        while self._out.pending >= self._conn.net.stream_window:
            await self._out.writable.park()
            self._check()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        await trio.lowlevel.checkpoint()
        self._check()
        inp = self._in
        while not inp.buffer and not inp.eof:
            await inp.readable.park()
            self._check()
        n = len(inp.buffer) if max_bytes is None else min(max_bytes, len(inp.buffer))
        data = bytes(inp.buffer[:n])
        del inp.buffer[:n]
        inp.pending -= n
        inp.writable.unpark_all()
        return data

    def read_everything(self) -> bool:
        """Whether every byte sent to this end so far was read (a kernel closing it
        then sends FIN, not RST)."""
        inp = self._in
        return not inp.buffer and all(data is None for _, data in inp.in_flight)

    async def aclose(self) -> None:
        self.close_now()
        await trio.lowlevel.checkpoint()

    def close_now(self) -> None:
        if not self.closed:
            self.closed = True
            if not self._conn.broken:
                self._conn.net._transmit(self._out, None)  # FIN, behind the data
                self._in.reader_closed = True
                self._in.pending -= len(self._in.buffer)
                self._in.buffer.clear()
                self._in.writable.unpark_all()
            for pipe in (self._in, self._out):
                pipe.readable.unpark_all()
                pipe.writable.unpark_all()
            self._conn.net._closed(self._conn)


class MemoryTransport(Transport):
    """One node's address on a `MemoryNetwork`."""

    def __init__(self, net: MemoryNetwork, address: Addr) -> None:
        self.net = net
        self.address = address
        self.closed = False
        self._inbox_send, self._inbox = trio.open_memory_channel[tuple[bytes, Addr]](1024)
        self._accept_send, self._accept = trio.open_memory_channel[trio.abc.Stream](16)

    async def send_packet(self, data: bytes, addr: Addr) -> None:
        self.net._send(self.address, data, addr)
        await trio.lowlevel.checkpoint()

    async def receive_packet(self) -> tuple[bytes, Addr]:
        return await self._inbox.receive()

    def receive_packet_nowait(self) -> tuple[bytes, Addr] | None:
        try:
            return self._inbox.receive_nowait()
        except trio.WouldBlock:
            return None

    async def open_stream(self, addr: Addr) -> trio.abc.Stream:
        return await self.net._connect(self.address, addr)

    async def serve_streams(self, handler: StreamHandler) -> NoReturn:
        async with trio.open_nursery() as nursery:
            async for stream in self._accept:
                nursery.start_soon(handler, stream)
        raise AssertionError("accept channel closed")  # pragma: no cover

    def close(self) -> None:
        """The node is gone (stopped or crashed): its open connections are reset (or
        closed as a kernel closes a dead process's sockets: `kernel_close`), and nothing
        reaches it."""
        self.closed = True
        for conn in sorted(self.net._connections, key=lambda c: c.forward.ident):
            if self.address not in (conn.client, conn.server):
                continue
            mine = conn.client_end if conn.client == self.address else conn.server_end
            if self.net.kernel_close and mine.read_everything():
                mine.close_now()
            else:
                self.net._reset(conn)
