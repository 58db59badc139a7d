"""The real gossip driver: the SWIM state machine on UDP + TCP with Trio.

One nursery holds a UDP reader, a timer task, a push-pull TCP server, an
event-loop lag monitor (Lifeguard's local health is fed by our own slowness) and,
when enabled, mDNS discovery.  All protocol decisions live in ``gossip.swim``; this
module only moves bytes, seals them with the cluster key, keeps time and turns the
machine's events into traces and callbacks.
"""

from __future__ import annotations

import logging
import math
import random
import socket
from typing import Awaitable, Callable, Sequence

import trio

from clock import Clock, TrioClock
from oplog import Event, log_event

from . import wire
from .config import GossipConfig, preset as get_preset
from .events import ALIVE, DEAD, LEFT, SUSPECT, BroadcastReceived, MemberChanged, MemberState
from .keyring import OVERHEAD as SEAL_OVERHEAD
from .keyring import DecryptError, Keyring, parse_key
from .mdns import MDNS_PORT, MdnsDiscovery
from .swim import Addr, MemberInfo, Swim, frame_body
from .transport import NetTransport, StreamTls, StreamTransport, TlsStreams, Transport
from .trace import NullTraceWriter, TraceWriter

log = logging.getLogger("meshd.gossip")

_MEMBER_EVENTS = {SUSPECT: Event.MEMBER_SUSPECT, DEAD: Event.MEMBER_DEAD, LEFT: Event.MEMBER_LEFT}

UDP_AAD = b"meshd-gossip-udp"
TCP_AAD = b"meshd-gossip-tcp"
PUSH_PULL_TIMEOUT = 10.0
MAX_INBOUND_STREAMS = 32
LAG_SAMPLE = 0.1
UDP_BURST = 64  # datagrams taken per wake of the UDP reader (see `_udp_reader`)


# Owns a stream whose first frame had a registered type: (stream, that frame's envelope).
StreamOwner = Callable[[trio.abc.Stream, wire.Envelope], Awaitable[None]]


class GossipService:
    def __init__(
        self,
        *,
        node_id: str,
        bind_host: str,
        bind_port: int,
        seeds: Sequence[tuple[str, int]],
        cluster_name: str = "meshd",
        cluster_key: str | None = None,
        mdns: bool = True,
        mdns_port: int = MDNS_PORT,
        trace: TraceWriter | NullTraceWriter,
        preset: str = "lan",
        advertise_host: str | None = None,
        config: GossipConfig | None = None,
        seed: int | None = None,
        rng: random.Random | None = None,
        transport: Transport | None = None,
        clock: Clock | None = None,
        stream_tls: StreamTls | None = None,
    ) -> None:
        """``cluster_key``: the shared secret (None: no encryption); the caller resolves
        it (``mesh.config`` reads ``MESHD_CLUSTER_KEY``), this class reads no environment.
        ``stream_tls``: wrap every node-to-node stream (push-pull, mesh links) in TLS
        with mutual certificate verification; frames inside are still sealed with the
        cluster key, and datagrams are sealed by the key only.
        ``rng`` (else one seeded with ``seed``) makes every random choice; ``clock``
        (default: Trio's) is the only time source."""
        self.node_id = node_id
        self.bind_host = bind_host
        self.bind_port = bind_port
        self.seeds = [(str(h), int(p)) for h, p in seeds]
        self.cluster_name = cluster_name
        self.mdns = mdns
        self.mdns_port = mdns_port
        self.trace = trace
        self.config = config if config is not None else get_preset(preset)
        self.advertise_host = advertise_host
        self.keyring: Keyring | None = Keyring([parse_key(cluster_key)]) if cluster_key else None
        self.rng = rng if rng is not None else random.Random(seed)
        self.clock: Clock = clock if clock is not None else TrioClock()
        self.swim: Swim | None = None
        self.port: int | None = None
        self.address: Addr | None = None
        self.decrypt_failures = 0
        self.send_errors = 0
        self.push_pull_failures = 0
        self.loop_lag = 0.0
        self._push_pull: dict[str, tuple[Callable[[], object], Callable[[object], None]]] = {}
        self._broadcast_handlers: dict[str, list[Callable[[str, object], None]]] = {}
        self._member_handlers: list[Callable[[str, MemberState], None]] = []
        self._member_states: dict[str, MemberState] = {}  # the last state logged per member
        self._pending_broadcasts: list[tuple[str, str, object]] = []
        self._given_transport = transport
        self._stream_tls = stream_tls
        self.transport: Transport | None = None  # datagrams (and the bound address)
        # Every node-to-node stream goes through this: push-pull, and the mesh links
        # (open_member_stream, register_stream_handler).
        self.streams: StreamTransport | None = None
        self._nursery: trio.Nursery | None = None
        self._wake = trio.Event()
        self._inbound = trio.CapacityLimiter(MAX_INBOUND_STREAMS)
        self._stream_handlers: dict[str, StreamOwner] = {}

    # ------------------------------------------------------------------ public API

    def members(self) -> list[MemberInfo]:
        """[{"id","address","state","incarnation","last_change_ts_us"}] as this node sees them."""
        return self.swim.members_view() if self.swim is not None else []

    def contact_ages(self) -> dict[str, float]:
        """{member: seconds since its last datagram reached this node}."""
        return self.swim.contact_ages(self.clock.now()) if self.swim is not None else {}

    def broadcast(self, kind: str, key: str, payload: object) -> None:
        """Disseminate ``payload``; a newer broadcast with the same (kind, key) replaces it."""
        if self.swim is None:
            self._pending_broadcasts.append((kind, key, payload))
            return
        self.swim.broadcast(kind, key, payload, self.clock.now())
        self._kick()

    def on_broadcast(self, kind: str, handler: Callable[[str, object], None]) -> None:
        """``handler(origin_node_id, payload)`` for every broadcast of ``kind`` from others."""
        self._broadcast_handlers.setdefault(kind, []).append(handler)

    def on_member_change(self, handler: Callable[[str, MemberState], None]) -> None:
        """``handler(member_id, new_state)`` on every state change of another member."""
        self._member_handlers.append(handler)

    def register_push_pull(self, name: str, get_local: Callable[[], object], merge_remote: Callable[[object], None]) -> None:
        """Ride push-pull anti-entropy: ``get_local()`` is sent, peers' state is merged."""
        self._push_pull[name] = (get_local, merge_remote)

    def register_stream_handler(self, frame_type: str, handler: StreamOwner) -> None:
        """Hand inbound TCP streams on the gossip port whose first frame is of
        ``frame_type`` to ``handler(stream, first_envelope)`` (the mesh links use this).
        The handler owns the stream; frames on it use `seal_frame`/`open_frame`/`read_frame`."""
        self._stream_handlers[frame_type] = handler

    def seal_frame(self, body: bytes) -> bytes:
        """Encrypt (with the cluster key, if any) and length-prefix one TCP frame body."""
        return self._seal_frame(body)

    def open_frame(self, body: bytes) -> bytes | None:
        """Decrypt one TCP frame body; None (and counted) if it fails authentication."""
        return self._open_frame(body)

    def member_address(self, member_id: str) -> tuple[str, int] | None:
        """The gossip address of a member, as this node knows it."""
        if self.swim is None:
            return None
        member = self.swim.members.get(member_id)
        return member.addr if member is not None else None

    async def open_member_stream(self, member_id: str) -> trio.abc.Stream | None:
        """A new stream to a member's gossip port through this node's transport (TCP,
        or the in-memory network in simulation); None while its address is unknown.
        Raises OSError when the member cannot be reached."""
        addr = self.member_address(member_id)
        if addr is None or self.streams is None:
            return None
        return await self.streams.open_stream(addr)

    def member_state(self, member_id: str) -> str | None:
        """This node's view of a member: alive, suspect, dead or left (None: unknown)."""
        if self.swim is None:
            return None
        member = self.swim.members.get(member_id)
        return member.state if member is not None else None

    def alive_members(self) -> list[str]:
        """Ids of the other members currently alive or suspect (reachable as far as we know)."""
        if self.swim is None:
            return []
        return sorted(m.id for m in self.swim.members.values() if m.id != self.node_id and m.state in (ALIVE, SUSPECT))

    def has_peers(self) -> bool:
        """Whether any other member is alive or suspect (cheaper than `alive_members`:
        asked on every CONNECT, it stops at the first one, and at once when alone)."""
        swim = self.swim
        if swim is None or swim.num_members() <= 1:
            return False
        return any(m.id != self.node_id and m.state in (ALIVE, SUSPECT) for m in swim.members.values())

    def join(self, addrs: Sequence[tuple[str, int]]) -> None:
        """Join through more addresses (mDNS discoveries, an operator's command)."""
        if self.swim is not None:
            self.swim.join([(str(h), int(p)) for h, p in addrs], self.clock.now(), remember=False)
            self._kick()

    @property
    def stats(self) -> dict[str, int | float]:
        """The counters, by name (``malformed_by_reason`` has the malformed ones by reason)."""
        out: dict[str, int | float] = {}
        if self.swim is not None:
            out.update((k, v) for k, v in vars(self.swim.stats).items() if isinstance(v, (int, float)))
        out.update(
            decrypt_failures=self.decrypt_failures,
            send_errors=self.send_errors,
            push_pull_failures=self.push_pull_failures,
            loop_lag_s=self.loop_lag,
            health=self.swim.health if self.swim is not None else 0,
        )
        return out

    @property
    def malformed_by_reason(self) -> dict[str, int]:
        """Malformed gossip input dropped, by reason (``wire.WireError.reason``)."""
        return dict(self.swim.stats.malformed_by_reason) if self.swim is not None else {}

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Bind UDP and TCP on the gossip port, report it, run until cancelled."""
        transport = self._given_transport or await NetTransport.bind(self.bind_host, self.bind_port)
        self.transport = transport
        self.streams = TlsStreams(transport, self._stream_tls) if self._stream_tls is not None else transport
        port = transport.address[1]
        self.port = port
        if self.advertise_host:
            host = self.advertise_host
        elif isinstance(transport, NetTransport):
            host = _advertise_guess(self.bind_host)
        else:
            host = transport.address[0]
        self.address = (host, port)
        now = self.clock.now()
        limit = self.config.udp_buffer_size - (SEAL_OVERHEAD if self.keyring is not None else 0)
        self.swim = Swim(
            self.node_id,
            self.address,
            now=now,
            rng=self.rng,
            config=self.config,
            cluster_name=self.cluster_name,
            incarnation=0,
            clock_offset=self.clock.wall() - now,
            packet_limit=limit,
            push_pull_providers=self._push_pull,
        )
        self.trace.emit(ts_us=self._wall_us(), kind="node_start", subject=self.node_id, incarnation=0)
        for kind, key, payload in self._pending_broadcasts:
            self.swim.broadcast(kind, key, payload, now)
        self._pending_broadcasts.clear()
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._udp_reader)
                nursery.start_soon(self._timer_loop)
                nursery.start_soon(self._lag_monitor)
                nursery.start_soon(self.streams.serve_streams, self._serve_stream)
                if self.seeds:
                    seeds = await transport.resolve(self.seeds)
                    if len(seeds) < len(self.seeds):
                        log.warning("some seeds did not resolve: %s", self.seeds)
                    self.swim.join(seeds, self.clock.now())
                if self.mdns:
                    nursery.start_soon(MdnsDiscovery(self, clock=self.clock, rng=self.rng, port=self.mdns_port).run)
                await self._flush()
                task_status.started(port)
        finally:
            self._nursery = None
            transport.close()
            self.trace.emit(ts_us=self._wall_us(), kind="node_stop", subject=self.node_id)
            self.trace.flush()

    async def leave(self, timeout: float = 3.0) -> None:
        """Tell the cluster we are leaving and wait (bounded) until the news went out."""
        if self.swim is None:
            return
        self.swim.leave(self.clock.now())
        await self._flush()
        with trio.move_on_after(timeout):
            while not self.swim.leave_sent:
                await trio.sleep(self.config.gossip_interval / 2)

    # ------------------------------------------------------------------ key rotation

    def install_key(self, key: str) -> None:
        if self.keyring is None:
            raise RuntimeError("no cluster key is set; a keyring cannot be added at run time")
        self.keyring.add(parse_key(key))

    def use_key(self, key: str) -> None:
        assert self.keyring is not None
        self.keyring.use(parse_key(key))

    def remove_key(self, key: str) -> None:
        assert self.keyring is not None
        self.keyring.remove(parse_key(key))

    # ------------------------------------------------------------------ tasks

    async def _udp_reader(self) -> None:
        assert self.swim is not None and self.transport is not None
        transport = self.transport
        while True:
            packet: tuple[bytes, Addr] | None = await transport.receive_packet()
            # Then what else has arrived, up to UDP_BURST, before the answers go out:
            # a socket operation is a scheduling point, and on a node whose loop runs
            # every task once per pass (0.5-1 s of wall time per pass on a starved node
            # taking 100,000 subscriptions) one datagram per pass fell behind the route
            # broadcasts, and probes were answered too late or dropped by the kernel.
            taken = 0
            while packet is not None:
                data, addr = packet
                self._take_packet(data, addr)
                taken += 1
                packet = transport.receive_packet_nowait() if taken < UDP_BURST else None
            await self._flush()

    def _take_packet(self, data: bytes, addr: Addr) -> None:
        assert self.swim is not None
        if self.keyring is not None:
            try:
                data = self.keyring.open(data, UDP_AAD)
            except DecryptError:
                self.decrypt_failures += 1
                return
        self.swim.receive(data, (addr[0], addr[1]), self.clock.now())

    async def _timer_loop(self) -> None:
        assert self.swim is not None
        while True:
            deadline = self.swim.next_timer()
            self._wake = trio.Event()
            with trio.move_on_at(deadline if deadline is not None else math.inf):
                await self._wake.wait()
            self.swim.handle_timer(self.clock.now())
            await self._flush()

    async def _lag_monitor(self) -> None:
        assert self.swim is not None
        samples = 0
        while True:
            samples += 1
            if samples % 10 == 0:
                self.trace.flush()  # keep traces on disk about a second behind
            before = self.clock.now()
            await trio.sleep(LAG_SAMPLE)
            lag = self.clock.now() - before - LAG_SAMPLE
            self.loop_lag = lag
            if lag > 0:
                self.swim.note_loop_lag(lag, self.clock.now())

    def _wall_us(self) -> int:
        return int(self.clock.wall() * 1_000_000)

    def _kick(self) -> None:
        self._wake.set()

    async def _flush(self) -> None:
        swim, transport = self.swim, self.transport
        assert swim is not None and transport is not None
        now = self.clock.now()
        for addr, data in swim.datagrams_to_send(now):
            if self.keyring is not None:
                data = self.keyring.seal(data, UDP_AAD)
            try:
                await transport.send_packet(data, addr)
            except (OSError, OverflowError, ValueError, TypeError):
                self.send_errors += 1
        if self._nursery is not None:
            for addr, body in swim.streams_to_open():
                self._nursery.start_soon(self._push_pull_client, addr, body)
        for ev in swim.events():
            self._dispatch(ev)
        self._kick()

    def _dispatch(self, ev: object) -> None:
        if isinstance(ev, MemberChanged):
            self.trace.emit(
                ts_us=ev.ts_us, kind=f"member_{ev.state}", subject=ev.member, origin=ev.origin,
                origin_ts_us=ev.origin_ts_us, event_id=ev.event_id, hops=ev.hops, incarnation=ev.incarnation,
            )
            if ev.member != self.node_id:
                self._log_member(ev)
                for h in self._member_handlers:
                    _call(h, ev.member, ev.state)
        elif isinstance(ev, BroadcastReceived):
            self.trace.emit(
                ts_us=ev.ts_us, kind="broadcast", subject=ev.key, origin=ev.origin, origin_ts_us=ev.origin_ts_us,
                event_id=ev.event_id, hops=ev.hops, bkind=ev.kind,
            )
            if not ev.local:
                for h in self._broadcast_handlers.get(ev.kind, ()):
                    _call(h, ev.origin, ev.payload)

    def _log_member(self, ev: MemberChanged) -> None:
        """One line per change of another member: joined (first seen), rejoined (back
        after dead or left), alive (a suspicion refuted), suspect, dead, left."""
        before = self._member_states.get(ev.member)
        self._member_states[ev.member] = ev.state
        if ev.state == before:
            return
        if ev.state == ALIVE:
            event = Event.MEMBER_JOINED if before is None else (
                Event.MEMBER_ALIVE if before == SUSPECT else Event.MEMBER_REJOINED)
        else:
            event = _MEMBER_EVENTS[ev.state]
        log_event(log, event, logging.WARNING if ev.state == DEAD else logging.INFO, member=ev.member,
                  address=f"{ev.address[0]}:{ev.address[1]}", incarnation=ev.incarnation, reported_by=ev.origin)

    # ------------------------------------------------------------------ push-pull

    def _seal_frame(self, body: bytes) -> bytes:
        if self.keyring is not None:
            body = self.keyring.seal(body, TCP_AAD)
        return wire.frame(body)

    def _open_frame(self, body: bytes) -> bytes | None:
        if self.keyring is None:
            return body
        try:
            return self.keyring.open(body, TCP_AAD)
        except DecryptError:
            self.decrypt_failures += 1
            return None

    async def _push_pull_client(self, addr: Addr, body: bytes | Callable[[], bytes]) -> None:
        assert self.swim is not None and self.streams is not None
        with trio.move_on_after(PUSH_PULL_TIMEOUT) as scope:
            try:
                stream = await self.streams.open_stream(addr)
            except (OSError, OverflowError, ValueError):
                self.push_pull_failures += 1
                return
            async with stream:
                try:
                    await stream.send_all(self._seal_frame(frame_body(body)))
                    reply = await read_frame(stream)
                except (OSError, trio.BrokenResourceError, wire.WireError, EOFError):
                    self.push_pull_failures += 1
                    return
            opened = self._open_frame(reply)
            if opened is not None:
                self.swim.receive_stream_reply(opened, self.clock.now())
                await self._flush()
        if scope.cancelled_caught:
            self.push_pull_failures += 1

    async def _serve_stream(self, stream: trio.abc.Stream) -> None:
        assert self.swim is not None
        handoff = None
        async with self._inbound:
            handoff = await self._serve_push_pull(stream)
        if handoff is not None:
            handler, envelope = handoff
            async with stream:
                await handler(stream, envelope)

    async def _serve_push_pull(self, stream: trio.abc.Stream) -> tuple[StreamOwner, wire.Envelope] | None:
        """Answer one push-pull exchange, or return the registered handler that owns
        this stream (the caller then runs it outside the push-pull limits)."""
        assert self.swim is not None
        handoff = None
        with trio.move_on_after(PUSH_PULL_TIMEOUT):
            try:
                body = await read_frame(stream)
            except wire.WireError as exc:
                self.swim.count_malformed(exc, None)
                body = None
            except (OSError, trio.BrokenResourceError, EOFError) as exc:
                # a stream that broke off before one whole frame
                self.swim.count_malformed(wire.MalformedPacket(f"stream: {exc!r}", reason="short_stream"), None)
                body = None
            opened = self._open_frame(body) if body is not None else None
            if opened is not None and self._stream_handlers:
                try:
                    envelope = wire.decode_frame_body(opened)
                except wire.WireError:
                    envelope = None
                if envelope is not None and envelope["t"] in self._stream_handlers:
                    handoff = self._stream_handlers[envelope["t"]], envelope
            if opened is not None and handoff is None:
                reply = self.swim.handle_stream(opened, self.clock.now())
                await self._flush()
                if reply is not None:
                    try:
                        await stream.send_all(self._seal_frame(reply))
                    except (OSError, trio.BrokenResourceError):
                        pass
        if handoff is None:
            with trio.CancelScope(shield=True):
                await stream.aclose()
        return handoff


async def _read_exact(stream: trio.abc.ReceiveStream, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = await stream.receive_some(min(65536, n - len(buf)))
        if not chunk:
            raise EOFError("stream closed mid-frame")
        buf += chunk
    return bytes(buf)


async def read_frame(stream: trio.abc.ReceiveStream) -> bytes:
    """One length-prefixed frame body from a TCP stream (still sealed, if a key is set)."""
    n = wire.frame_length(await _read_exact(stream, 4))
    return await _read_exact(stream, n)


def _call(handler: Callable[..., None], *args: object) -> None:
    try:
        handler(*args)
    except Exception:  # a subscriber's bug must not stop membership
        log.exception("gossip handler %r failed", handler)


def _advertise_guess(bind_host: str) -> str:
    """The address others should reach us at when we bind a wildcard address."""
    if bind_host not in ("", "0.0.0.0", "::"):
        return bind_host
    # connect() on a UDP socket only picks a route, it sends nothing: ask which
    # interface would carry LAN multicast (the mDNS group)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(("224.0.0.251", 5353))
        return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"
    finally:
        s.close()
