"""The transport under GossipService: best-effort datagrams plus reliable streams.

Two narrow interfaces (memberlist's ``Transport``): ``DatagramTransport`` carries
SWIM's UDP packets, ``StreamTransport`` every node-to-node stream (push-pull, and the
mesh links through ``GossipService.open_member_stream`` and its stream handlers: route
sync, forwarding, handoff and held replay reach the network only through it).
``Transport`` is both, plus an address and a lifetime.

Two implementations: ``NetTransport`` here is UDP + TCP on one port (``TlsStreams``
wraps its streams, or any others, in mutually verified TLS);
``gossip.memory_network.MemoryNetwork`` hands out in-memory transports with latency,
bandwidth, loss, resets and partitions, for driving real nodes under
``trio.testing.MockClock`` in virtual time. Sealing with the cluster key is above the
transport (``GossipService``), so both carry the same frames.
"""

from __future__ import annotations

import logging
import socket
import ssl
from dataclasses import dataclass
from typing import Awaitable, Callable, NoReturn, Protocol, Sequence

import trio

log = logging.getLogger("meshd.transport")

Addr = tuple[str, int]
StreamHandler = Callable[[trio.abc.Stream], Awaitable[None]]


class DatagramTransport(Protocol):
    """Best-effort packets (SWIM's probes and piggybacked broadcasts)."""

    async def send_packet(self, data: bytes, addr: Addr) -> None:
        """Send one datagram; it may be lost or arrive out of order."""

    async def receive_packet(self) -> tuple[bytes, Addr]:
        """The next datagram that arrived, and who sent it."""

    def receive_packet_nowait(self) -> tuple[bytes, Addr] | None:
        """A datagram that has arrived already, or None: no wait and no checkpoint, so
        a reader takes what queued up while its loop was busy in one step."""


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

    def receive_packet_nowait(self) -> tuple[bytes, Addr] | None:
        return None  # by default: one datagram per `receive_packet`


class NetTransport(Transport):
    """UDP datagrams and TCP streams sharing one port number."""

    def __init__(self, sock: trio.socket.SocketType, listeners: list[trio.SocketListener], family: int,
                 raw: socket.socket | None = None) -> None:
        self.sock = sock
        self._raw = raw  # the same socket, non-blocking, for `receive_packet_nowait`
        self.listeners = listeners
        self.family = family
        host, port = sock.getsockname()[:2]
        self.address = (host, port)

    @classmethod
    async def bind(cls, host: str, port: int) -> "NetTransport":
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        # with port 0 the UDP pick may be taken on TCP: try a few times
        for _attempt in range(20):
            raw = socket.socket(family, socket.SOCK_DGRAM)
            sock = trio.socket.from_stdlib_socket(raw)  # (made non-blocking)
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
                return cls(sock, listeners, family, raw)
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

    def receive_packet_nowait(self) -> tuple[bytes, Addr] | None:
        raw = self._raw
        if raw is None:
            return None
        while True:
            try:
                data, addr = raw.recvfrom(65536)
            except BlockingIOError:
                return None
            except OSError:
                continue  # e.g. ICMP port unreachable reported on the socket: keep reading
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


@dataclass(frozen=True)
class StreamTls:
    """TLS for node-to-node streams. Nodes are peers: each side presents its
    certificate and verifies the other's against the cluster's CA (both contexts
    require a certificate; host names are not checked, since nodes reach each other
    at gossip addresses and a certificate from the cluster's CA is what makes a peer
    a member). Datagrams are not covered: they stay sealed by the cluster key."""

    server: ssl.SSLContext
    client: ssl.SSLContext
    handshake_timeout: float = 10.0


class TlsStreams(StreamTransport):
    """Every stream of `inner`, both ways, in TLS: a stream is handed out (or to the
    handler) only after a handshake that verified the peer's certificate."""

    def __init__(self, inner: StreamTransport, tls: StreamTls) -> None:
        self.inner = inner
        self.tls = tls
        # hosts whose refusal was logged at warning: once each until one succeeds, so a
        # misconfigured node retrying every few seconds does not flood the log
        self._refused: set[str] = set()

    async def open_stream(self, addr: Addr) -> trio.abc.Stream:
        raw = await self.inner.open_stream(addr)
        stream = trio.SSLStream(raw, self.tls.client, server_side=False)
        failure = await self._handshake(stream)
        if failure is not None:
            message = f"TLS handshake with {addr[0]}:{addr[1]} failed: {failure}"
            self._note_refusal(addr[0], message)
            await trio.aclose_forcefully(raw)
            raise ConnectionError(message)
        self._refused.discard(addr[0])
        return stream

    async def serve_streams(self, handler: StreamHandler) -> NoReturn:
        async def accept(raw: trio.abc.Stream) -> None:
            stream = trio.SSLStream(raw, self.tls.server, server_side=True)
            failure = await self._handshake(stream)
            peer = _peer_name(raw)
            if failure is not None:
                self._note_refusal(peer.rsplit(":", 1)[0], f"refused a node-to-node stream from {peer}: {failure}")
                await trio.aclose_forcefully(raw)
                return
            self._refused.discard(peer.rsplit(":", 1)[0])
            await handler(stream)

        await self.inner.serve_streams(accept)

    async def _handshake(self, stream: trio.SSLStream[trio.abc.Stream]) -> str | None:
        """None when the handshake completed, else why it did not."""
        with trio.move_on_after(self.tls.handshake_timeout):
            try:
                await stream.do_handshake()
                return None
            except trio.BrokenResourceError as exc:
                cause = exc.__cause__
                said = [str(x) for x in (getattr(cause, "reason", None), getattr(cause, "verify_message", None)) if x]
                return ": ".join(said) or str(cause or exc)
            except trio.ClosedResourceError:
                return "closed"
        return f"no TLS handshake within {self.tls.handshake_timeout:g} s"

    def _note_refusal(self, key: str, message: str) -> None:
        if key in self._refused:
            log.debug("%s", message)
        else:
            self._refused.add(key)
            log.warning("%s", message)


def _peer_name(stream: trio.abc.Stream) -> str:
    sock = getattr(stream, "socket", None)
    if sock is not None:
        try:
            host, port = sock.getpeername()[:2]
            return f"{host}:{port}"
        except (OSError, ValueError, TypeError):
            return "?"
    peer = getattr(stream, "peer", None)  # an in-memory stream knows its peer's address
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else "?"
