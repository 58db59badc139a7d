"""The transport under GossipService: best-effort datagrams plus reliable streams.

Two narrow interfaces (memberlist's ``Transport``): ``DatagramTransport`` carries
SWIM's UDP packets, ``StreamTransport`` every node-to-node stream (push-pull, and the
mesh links through ``GossipService.open_member_stream`` and its stream handlers: route
sync, forwarding, handoff and held replay reach the network only through it).
``Transport`` is both, plus an address and a lifetime.

Two implementations: ``NetTransport`` here is UDP + TCP on one port;
``gossip.memory_network.MemoryNetwork`` hands out in-memory transports with latency,
bandwidth, loss, resets and partitions, for driving real nodes under
``trio.testing.MockClock`` in virtual time. Sealing with the cluster key is above the
transport (``GossipService``), so both carry the same frames.
"""

from __future__ import annotations

import socket
from typing import Awaitable, Callable, NoReturn, Protocol, Sequence

import trio

Addr = tuple[str, int]
StreamHandler = Callable[[trio.abc.Stream], Awaitable[None]]


class DatagramTransport(Protocol):
    """Best-effort packets (SWIM's probes and piggybacked broadcasts)."""

    async def send_packet(self, data: bytes, addr: Addr) -> None:
        """Send one datagram; it may be lost or arrive out of order."""

    async def receive_packet(self) -> tuple[bytes, Addr]:
        """The next datagram that arrived, and who sent it."""


class StreamTransport(Protocol):
    """Reliable, ordered byte streams between nodes: the only way node-to-node
    streams reach the network."""

    async def open_stream(self, addr: Addr) -> trio.abc.Stream:
        """A new stream to the node listening at ``addr``. Raises OSError when it
        cannot be reached; a connect across a partition may instead hang until the
        caller's timeout (as a real SYN does), so callers bound it."""

    async def serve_streams(self, handler: StreamHandler) -> NoReturn:
        """Accept streams for ever, each handed to ``handler`` in its own task (the
        handler owns the stream)."""


class Transport(DatagramTransport, StreamTransport, Protocol):
    """Both sides on one address: what GossipService binds (or is given)."""

    address: Addr  # where we are bound (host may be a wildcard for NetTransport)

    async def resolve(self, addrs: Sequence[tuple[str, int]]) -> list[Addr]:
        """The addresses to send to for seeds given by name (by default: as given)."""
        return [(str(h), int(p)) for h, p in addrs]

    def close(self) -> None:
        """Let go of the sockets (a node's last act; by default nothing to do)."""


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
