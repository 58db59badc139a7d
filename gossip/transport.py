"""The transport under GossipService: best-effort packets plus reliable streams.

Two implementations of one small interface (memberlist's ``Transport`` and
``MockNetwork``): ``NetTransport`` is UDP + TCP on one port; ``MemoryNetwork`` hands
out in-memory transports with latency, loss and partitions, for driving real
GossipService instances under ``trio.testing.MockClock`` in virtual time.
"""

from __future__ import annotations

import heapq
import math
import random
import socket
from typing import Awaitable, Callable, NoReturn, Sequence

import trio
import trio.testing

from clock import Clock, TrioClock

Addr = tuple[str, int]
StreamHandler = Callable[[trio.abc.Stream], Awaitable[None]]


class Transport:
    """What GossipService needs from a network."""

    address: Addr  # where we are bound (host may be a wildcard for NetTransport)

    async def send_packet(self, data: bytes, addr: Addr) -> None:
        raise NotImplementedError

    async def receive_packet(self) -> tuple[bytes, Addr]:
        raise NotImplementedError

    async def open_stream(self, addr: Addr) -> trio.abc.Stream:
        raise NotImplementedError

    async def serve_streams(self, handler: StreamHandler) -> NoReturn:
        raise NotImplementedError

    async def resolve(self, addrs: Sequence[tuple[str, int]]) -> list[Addr]:
        return [(str(h), int(p)) for h, p in addrs]

    def close(self) -> None:
        pass


class NetTransport(Transport):
    """UDP datagrams and TCP streams sharing one port number."""

    def __init__(self, sock: trio.socket.SocketType, listeners: list[trio.SocketListener], family: int) -> None:
        self.sock = sock
        self.listeners = listeners
        self.family = family
        host, port = sock.getsockname()[:2]
        self.address = (host, port)

    @classmethod
    async def bind(cls, host: str, port: int) -> "NetTransport":
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        # with port 0 the UDP pick may be taken on TCP: try a few times
        for _attempt in range(20):
            sock = trio.socket.socket(family, socket.SOCK_DGRAM)
            try:
                await sock.bind((host, port))
                bound = sock.getsockname()[1]
                try:
                    listeners = await trio.open_tcp_listeners(bound, host=host)
                except OSError:
                    if port:
                        raise
                    sock.close()
                    continue
                return cls(sock, listeners, family)
            except BaseException:
                sock.close()
                raise
        raise OSError(f"no free gossip port on {host}")

    async def send_packet(self, data: bytes, addr: Addr) -> None:
        await self.sock.sendto(data, addr)

    async def receive_packet(self) -> tuple[bytes, Addr]:
        while True:
            try:
                data, addr = await self.sock.recvfrom(65536)
            except OSError:
                # e.g. ICMP port unreachable reported on the socket: keep reading
                continue
            return data, (addr[0], addr[1])

    async def open_stream(self, addr: Addr) -> trio.abc.Stream:
        return await trio.open_tcp_stream(addr[0], addr[1])

    async def serve_streams(self, handler: StreamHandler) -> NoReturn:
        await trio.serve_listeners(handler, self.listeners)
        raise AssertionError("serve_listeners returned")  # pragma: no cover

    async def resolve(self, addrs: Sequence[tuple[str, int]]) -> list[Addr]:
        out: list[Addr] = []
        for host, port in addrs:
            try:
                infos = await trio.socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
            except OSError:
                continue
            for family, _, _, _, sa in infos:
                if family == self.family:
                    out.append((str(sa[0]), int(sa[1])))
                    break
        return out

    def close(self) -> None:
        self.sock.close()
        for listener in self.listeners:
            listener.socket.close()


class MemoryNetwork:
    """An in-memory network for GossipService tests in virtual time.

    ``await nursery.start(net.run)`` first: one task delivers every packet after
    its latency (no task per packet).  ``cut(a, b)`` partitions hosts, ``heal()``
    undoes it, ``down(host)`` silences a host as if it were unplugged.
    """

    def __init__(
        self, *, latency: float = 0.002, jitter: float = 0.5, loss: float = 0.0, seed: int = 0,
        rng: random.Random | None = None, clock: Clock | None = None,
    ) -> None:
        self.latency = latency
        self.jitter = jitter
        self.loss = loss
        self.rng = rng if rng is not None else random.Random(seed)
        # deadlines go to trio.move_on_at: the clock must be on Trio's timeline
        self.clock: Clock = clock if clock is not None else TrioClock()
        self.transports: dict[Addr, MemoryTransport] = {}
        self._heap: list[tuple[float, int, Addr, bytes, Addr]] = []
        self._seq = 0
        self._wake = trio.Event()
        self._cuts: list[tuple[frozenset[str], frozenset[str]]] = []
        self.delivered = 0
        self.dropped = 0

    def transport(self, host: str, port: int = 7946) -> "MemoryTransport":
        t = MemoryTransport(self, (host, port))
        self.transports[(host, port)] = t
        return t

    def cut(self, a: Sequence[str], b: Sequence[str]) -> None:
        self._cuts.append((frozenset(a), frozenset(b)))

    def heal(self) -> None:
        self._cuts.clear()

    def reachable(self, src: str, dst: str) -> bool:
        for a, b in self._cuts:
            if (src in a and dst in b) or (src in b and dst in a):
                return False
        return True

    def _delay(self) -> float:
        return self.latency * (1 - self.jitter + 2 * self.jitter * self.rng.random())

    def _send(self, src: Addr, data: bytes, dst: Addr) -> None:
        if not self.reachable(src[0], dst[0]) or (self.loss and self.rng.random() < self.loss):
            self.dropped += 1
            return
        self._seq += 1
        heapq.heappush(self._heap, (self.clock.now() + self._delay(), self._seq, dst, data, src))
        self._wake.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            deadline = self._heap[0][0] if self._heap else math.inf
            self._wake = trio.Event()
            with trio.move_on_at(deadline):
                await self._wake.wait()
            now = self.clock.now()
            while self._heap and self._heap[0][0] <= now:
                _, _, dst, data, src = heapq.heappop(self._heap)
                target = self.transports.get(dst)
                if target is None or target.closed:
                    self.dropped += 1
                    continue
                try:
                    target._inbox_send.send_nowait((data, src))
                    self.delivered += 1
                except trio.WouldBlock:
                    self.dropped += 1  # a full socket buffer drops, too


class MemoryTransport(Transport):
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

    async def open_stream(self, addr: Addr) -> trio.abc.Stream:
        target = self.net.transports.get(addr)
        await trio.sleep(3 * self.net._delay())  # connect and first segment
        if target is None or target.closed or not self.net.reachable(self.address[0], addr[0]):
            raise OSError(f"connect to {addr} failed")
        ours, theirs = trio.testing.memory_stream_pair()
        try:
            target._accept_send.send_nowait(theirs)
        except trio.WouldBlock:
            raise OSError(f"{addr} refused the connection (backlog full)") from None
        return ours

    async def serve_streams(self, handler: StreamHandler) -> NoReturn:
        async with trio.open_nursery() as nursery:
            async for stream in self._accept:
                nursery.start_soon(handler, stream)
        raise AssertionError("accept channel closed")  # pragma: no cover

    def close(self) -> None:
        self.closed = True
