"""A meshd node: listeners, HTTP API, timers and `$SYS`, around one Broker.

Task tree (one nursery per layer, so shutdown can go in order):

    run_node ── signal receiver
     └ Node.serve ── connections nursery (client reader and writer tasks; an idle
                  │                     plain-TCP client has none: it waits in the
                  │                     ParkingLot, mesh/parking.py)
                  └ services nursery: TCP listener, parking lot, WebSocket listener,
                                      HTTP API, broker timers, $SYS publisher

Shutdown (SIGINT/SIGTERM or `request_shutdown()`): the services stop (no new
connections), every client gets DISCONNECT 0x8B (v5) and its outbox flushed, and the
connections get `shutdown_timeout` seconds to finish before they are cancelled;
sockets still waiting for their CONNECT are closed at once.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import math
import random
import signal
import socket
from typing import Any, Callable

import trio
from trio_websocket import WebSocketRequest, serve_websocket, wrap_server_stream

from clock import Clock, TrioClock
from mesh import __version__
from mesh.api import build_router
from mesh.http_api import serve_http
from mesh.node_metrics import node_metrics
from mesh.broker import Broker, BrokerLimits
from mesh.config import ConfigError, HostPort, Settings, resolve_node_id
from mesh.connection import ClientConnection
from mesh.parked import ParkedConnection
from mesh.streams import SocketByteStream
from mesh.parking import ParkingLot
from mqtt import ReasonCode
from mesh.sys_topics import SysPublisher
from mesh.doorbell import Doorbell
from mesh.ws import WebSocketByteStream, accept_mqtt
from gossip.service import GossipService
from mesh.config_sync import ConfigSync
from mesh.security import Security
from mesh.tls import accept_tls, peer_common_name
from routing.cluster import Cluster
from routing.port import MeshPort
from routing.table import RouteTable
from gossip.trace import NullTraceWriter, TraceWriter
from netsplit.detector import detector_for
from netsplit.monitor import PartitionMonitor
from netsplit.view import PartitionView
from gossip.config import preset as gossip_preset
from session_store.rocks import RocksStore, StoreOpenError

log = logging.getLogger("meshd.node")


def _bind_error(key: str, addr: HostPort, exc: OSError) -> ConfigError:
    if exc.errno == errno.EADDRINUSE:
        return ConfigError(key, f"address {addr} is already in use")
    if exc.errno == errno.EADDRNOTAVAIL:
        return ConfigError(key, f"address {addr} is not available on this machine")
    return ConfigError(key, f"cannot listen on {addr}: {exc.strerror or exc}")


_ACCEPT_CAPACITY_ERRNOS = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS}
ACCEPT_BATCH = 64
# batch/off durability: commit ticks per `durability_batch_ms` window (see _commit_loop).
COMMIT_TICKS_PER_WINDOW = 2


def _first_oserror(exc: BaseException) -> OSError | None:
    if isinstance(exc, OSError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _first_oserror(inner)
            if found is not None:
                return found
    return None


class Node:
    def __init__(self, settings: Settings, node_id: str | None = None, *, clock: Clock | None = None) -> None:
        self.settings = settings
        self.clock: Clock = clock if clock is not None else TrioClock()
        self.node_id = node_id or resolve_node_id(settings)
        # netsplits: lost members are retried for reconnect_dead_for; the monitor detects partitions
        gossip_config = gossip_preset(settings.gossip_preset).with_(reconnect_dead_for=settings.reconnect_dead_for)
        partition_view = PartitionView(detector_for(self.node_id, gossip_config), clock=self.clock)
        self.security = Security(settings, clock=self.clock, in_minority=partition_view.in_minority)
        store_path = os.path.join(settings.data_dir, "sessions")
        self._store_dirty = Doorbell()
        try:
            self.store = RocksStore(store_path, on_dirty=self._store_dirty.ring)
        except StoreOpenError as exc:
            raise ConfigError("data_dir", str(exc)) from None
        recovered = self.store.load()
        # Every start is a new route epoch, so peers never mistake fresh route
        # versions for old news (routing.table).
        self.route_epoch = int(recovered.meta.get("route_epoch", 0)) + 1
        self.store.put_meta("route_epoch", self.route_epoch)
        self.started_at = self.clock.wall()
        self.trace: TraceWriter | NullTraceWriter = (
            TraceWriter(os.path.join(settings.data_dir, "traces"), self.node_id) if settings.trace else NullTraceWriter()
        )
        self.gossip = GossipService(
            node_id=self.node_id,
            bind_host=settings.gossip.host,
            bind_port=settings.gossip.port,
            seeds=[(a.host, a.port) for a in settings.seed],
            cluster_name=settings.cluster_name,
            cluster_key=settings.cluster_key,
            mdns=settings.mdns,
            trace=self.trace,
            config=gossip_config,
            advertise_host=settings.gossip_advertise,
            clock=self.clock,
            partitions=partition_view,
        )
        self.partitions = PartitionMonitor(partition_view, self.gossip, self.trace, clock=self.clock)
        # The broker and the cluster share the mesh port (route answers, forwards, route
        # changes): built first, so neither is wired into the other after the fact.
        self.mesh = MeshPort(RouteTable(self.node_id, self.route_epoch), self.gossip)
        self._timers_changed = Doorbell()
        self.broker = Broker(BrokerLimits.from_settings(settings), node_id=self.node_id, store=self.store, clock=self.clock,
                             mesh=self.mesh, on_timer_change=self._timers_changed.ring)
        self.broker.restore(recovered, self.started_at)
        self.cluster = Cluster(
            node_id=self.node_id, port=self.mesh, broker=self.broker, store=self.store, gossip=self.gossip,
            trace=self.trace, cluster_name=settings.cluster_name, clock=self.clock, rng=random.Random(),
            hold_period=settings.netsplit_hold, held_max_messages=settings.held_max_messages,
            held_max_age=settings.held_max_age, recovered_meta=recovered.meta,
        )
        self.config_sync = ConfigSync(
            node_id=self.node_id, clock=self.clock, broker=self.broker, gossip=self.gossip, store=self.store,
            trace=self.trace, recovered_meta=recovered.meta, security=self.security,
        )
        self.sys = SysPublisher(broker=self.broker, clock=self.clock, interval=settings.sys_interval, uptime=self.uptime,
                                gossip=self.gossip, cluster=self.cluster, partitions=self.partitions)
        self.ports: dict[str, int] = {}
        self._shutdown = trio.Event()
        self._connections: trio.Nursery | None = None  # set by serve(): every client task runs here
        self._lot: ParkingLot | None = None  # set by serve(): idle plain-TCP clients wait here

    def request_shutdown(self) -> None:
        self._shutdown.set()

    def uptime(self) -> float:
        return self.clock.wall() - self.started_at

    async def serve(self, *, task_status: trio.TaskStatus[dict[str, int]] = trio.TASK_STATUS_IGNORED) -> None:
        s = self.settings
        async with trio.open_nursery() as connections:
            self._connections = connections
            lot = self._lot = ParkingLot(self.clock)
            async with trio.open_nursery() as services:
                services.start_soon(lot.run)
                self.ports["gossip"] = await self._start_gossip(services, s.gossip)
                await services.start(self.cluster.run)
                services.start_soon(self.partitions.run)
                if s.mqtt is not None:
                    listeners = await self._open_listeners("mqtt", s.mqtt)
                    self.ports["mqtt"] = listeners[0].socket.getsockname()[1]
                    services.start_soon(self._serve_tcp, listeners, connections)
                if s.ws is not None:
                    self.ports["ws"] = await self._start_ws(services, connections, s.ws)
                if s.mqtts is not None:
                    listeners = await self._open_listeners("mqtts", s.mqtts)
                    self.ports["mqtts"] = listeners[0].socket.getsockname()[1]
                    services.start_soon(self._serve_tls, listeners, connections, self._handle_mqtts)
                if s.wss is not None:
                    listeners = await self._open_listeners("wss", s.wss)
                    self.ports["wss"] = listeners[0].socket.getsockname()[1]
                    services.start_soon(self._serve_tls, listeners, connections, self._handle_wss)
                if s.http is not None:
                    self.ports["http"] = await self._start_http(services, s.http)
                services.start_soon(self._timer_loop)
                services.start_soon(self.security.watch_files)
                services.start_soon(self._commit_loop)
                services.start_soon(self.sys.run)
                log.info(
                    "node %s (meshd %s) listening: %s",
                    self.node_id, __version__,
                    ", ".join(f"{name} {getattr(s, name).host}:{port}" for name, port in self.ports.items()),
                )
                for line in self.security.startup_warnings([getattr(s, n).host for n in ("mqtt", "ws", "mqtts", "wss") if getattr(s, n) is not None]):
                    log.warning("%s", line)
                task_status.started(dict(self.ports))
                await self._shutdown.wait()
                log.info("shutting down: leaving the cluster, closing listeners")
                if self._has_peers():
                    with trio.move_on_after(min(2.0, s.shutdown_timeout)):
                        await self.gossip.leave()
                services.cancel_scope.cancel()
            clients = self.broker.client_count()
            self.broker.close_all(ReasonCode.SERVER_SHUTTING_DOWN)
            for conn in lot.stop():  # parked before their CONNECT
                conn.on_lot_closed()
            log.info("disconnected %d clients (0x8B server shutting down)", clients)
            connections.cancel_scope.deadline = self.clock.now() + s.shutdown_timeout
        with trio.CancelScope(shield=True):
            await self._commit_pending()
        self.store.close()
        self.trace.close()
        log.info("node %s stopped", self.node_id)

    async def _open_listeners(self, key: str, addr: HostPort) -> list[trio.SocketListener]:
        try:
            return await trio.open_tcp_listeners(addr.port, host=addr.host)
        except OSError as exc:
            raise _bind_error(key, addr, exc) from exc

    async def _serve_tcp(self, listeners: list[trio.SocketListener], connections: trio.Nursery) -> None:
        async with trio.open_nursery() as nursery:
            for listener in listeners:
                nursery.start_soon(self._accept_tcp, listener, connections)

    async def _accept_tcp(self, listener: trio.SocketListener, connections: trio.Nursery) -> None:
        """trio.serve_listeners without a task per connection: each client is a bare
        socket.socket in a SocketByteStream, parked in the lot until its CONNECT comes
        (answered there, usually, with no task at all)."""
        settings = self.settings
        lot = self._lot
        assert lot is not None
        async with listener:
            # Accept on a plain socket (a dup of the listener's), up to ACCEPT_BATCH
            # clients per wake-up: one trip through the scheduler per batch, not per client.
            raw = socket.socket(fileno=os.dup(listener.socket.fileno()))
            raw.setblocking(False)
            tcp = raw.family in (socket.AF_INET, socket.AF_INET6)
            if tcp:
                # Linux copies TCP_NODELAY from the listener to each accepted socket: one
                # setsockopt here instead of one per client (checked on the first client).
                raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            nodelay_inherited: bool | None = None
            accept = raw.accept
            broker = self.broker
            security = self.security
            timeout = settings.connect_timeout
            try:
                while True:
                    for _ in range(ACCEPT_BATCH):
                        try:
                            sock, addr = accept()
                        except BlockingIOError:
                            break
                        except OSError as exc:
                            if exc.errno not in _ACCEPT_CAPACITY_ERRNOS:
                                raise
                            # Out of file descriptors or memory: wait for some to free, as trio does.
                            log.error("accept failed (%s); retrying in 0.1 s", os.strerror(exc.errno))
                            await trio.sleep(0.1)
                            break
                        if tcp and not nodelay_inherited:
                            if nodelay_inherited is None:
                                nodelay_inherited = bool(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
                            if not nodelay_inherited:
                                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                        host = str(addr[0]) if isinstance(addr, tuple) else ""
                        peer = f"{host}:{addr[1]}" if isinstance(addr, tuple) else "?"
                        conn = ParkedConnection(broker, SocketByteStream(sock), peer, clock=self.clock, lot=lot,
                                                nursery=connections, connect_timeout=timeout, security=security,
                                                peer_ip=host)
                        conn.park_new()
                    else:
                        await trio.lowlevel.checkpoint()  # a full batch: let others run, then go on
                        continue
                    await trio.lowlevel.wait_readable(raw)
            finally:
                raw.close()

    async def _serve_tls(self, listeners: list[trio.SocketListener], connections: trio.Nursery, handler: Any) -> None:
        await trio.serve_listeners(handler, listeners, handler_nursery=connections)

    async def _handle_mqtts(self, stream: trio.SocketStream) -> None:
        host, peer = _peer_of(stream)
        assert self.security.tls_context is not None
        tls = await accept_tls(stream, self.security.tls_context, timeout=self.settings.connect_timeout)
        if tls is not None:
            await self._run_connection(tls, peer, "mqtts", host, peer_common_name(tls))

    async def _handle_wss(self, stream: trio.SocketStream) -> None:
        host, peer = _peer_of(stream)
        assert self.security.tls_context is not None
        tls = await accept_tls(stream, self.security.tls_context, timeout=self.settings.connect_timeout)
        if tls is None:
            return
        cn = peer_common_name(tls)
        async with trio.open_nursery() as nursery:
            request = await wrap_server_stream(nursery, tls, max_message_size=self.settings.max_packet_size + 16)
            ws = await accept_mqtt(request, self.settings.ws_path)
            if ws is not None:
                await self._run_connection(WebSocketByteStream(ws), peer, "wss", host, cn)
            nursery.cancel_scope.cancel()

    async def _run_connection(self, stream: Any, peer: str, transport: str, peer_ip: str = "", cert_cn: str | None = None) -> None:
        conn = ClientConnection(self.broker, stream, peer, transport, clock=self.clock, connect_timeout=self.settings.connect_timeout,
                                security=self.security, peer_ip=peer_ip, cert_cn=cert_cn, nursery=self._connections)
        await conn.run()

    async def _start_ws(self, services: trio.Nursery, connections: trio.Nursery, addr: HostPort) -> int:
        path = self.settings.ws_path

        async def handler(request: WebSocketRequest) -> None:
            ws = await accept_mqtt(request, path)
            if ws is None:
                return
            remote = request.remote
            host = str(getattr(remote, "address", remote))
            peer = f"{host}:{getattr(remote, 'port', '')}"
            await self._run_connection(WebSocketByteStream(ws), peer, "ws", host)

        try:
            server = await services.start(
                lambda task_status: serve_websocket(
                    handler, addr.host, addr.port, None,
                    handler_nursery=connections,
                    max_message_size=self.settings.max_packet_size + 16,
                    connect_timeout=self.settings.connect_timeout,
                    disconnect_timeout=2,
                    task_status=task_status,
                )
            )
        except BaseException as exc:
            oserror = _first_oserror(exc)
            if oserror is None:
                raise
            raise _bind_error("ws", addr, oserror) from exc
        return server.port

    def _has_peers(self) -> bool:
        return any(m["id"] != self.node_id and m["state"] in ("alive", "suspect") for m in self.gossip.members())

    async def _start_gossip(self, services: trio.Nursery, addr: HostPort) -> int:
        try:
            return await services.start(self.gossip.run)
        except BaseException as exc:
            oserror = _first_oserror(exc)
            if oserror is None:
                raise
            raise _bind_error("gossip", addr, oserror) from exc

    async def _start_http(self, services: trio.Nursery, addr: HostPort) -> int:
        router = build_router(self, node_metrics(self))
        try:
            return await services.start(serve_http, router, addr.host, addr.port)
        except BaseException as exc:
            oserror = _first_oserror(exc)
            if oserror is None:
                raise
            raise _bind_error("http", addr, oserror) from exc

    async def _timer_loop(self) -> None:
        broker = self.broker
        while True:
            deadline = broker.next_deadline()
            self._timers_changed.clear()
            # The broker's deadlines are wall times (session expiry outlives a restart).
            delay = math.inf if deadline is None else max(0.0, deadline - self.clock.wall())
            with trio.move_on_after(delay):
                await self._timers_changed.wait()
            broker.handle_timers(self.clock.wall())

    async def _commit_loop(self) -> None:
        """Group commit: one store batch per round, written off the Trio thread.

        sync: commit as soon as there is work; acks wait for it (principle 6).
        batch: acks do not wait; a change reaches the disk (synced) within
        `durability_batch_ms` of being made, which bounds what a crash can lose.  The
        loop ticks every half window on a fixed grid; each tick writes the delivery
        changes made before the previous tick, while those of the last half window wait
        for the next one (`SessionStore.take_batch(hold=1)`, where the rule and the
        bound are spelled out): a delivery acknowledged before its deadline is never
        written, one that lives longer is written once, at most a window after its
        change.  off: same rhythm, no fsync."""
        mode = self.settings.durability
        tick = 0.0 if mode == "sync" else self.settings.durability_batch_ms / 1000 / COMMIT_TICKS_PER_WINDOW
        hold = 0 if mode == "sync" else COMMIT_TICKS_PER_WINDOW - 1
        store = self.store
        while True:
            await self._store_dirty.wait()
            self._store_dirty.clear()
            due = self.clock.now() + tick
            while store.has_pending():
                if tick:
                    # Changes made while a batch was written wait for the next tick; the
                    # grid does not drift by the time the writes take.
                    await trio.sleep_until(due)
                    due = max(due + tick, self.clock.now())
                # A batch once taken must reach the disk: shutdown must not cancel it midway.
                with trio.CancelScope(shield=True):
                    await self._commit_once(hold)

    async def _commit_pending(self) -> None:
        while self.store.has_pending():
            await self._commit_once()

    async def _commit_once(self, hold: int = 0) -> None:
        store = self.store
        batch, epoch = store.take_batch(hold)
        if len(batch):
            await _in_worker_thread(functools.partial(store.write_batch, batch, sync=self.settings.durability != "off"))
            store.stats.count(batch)
        if epoch > store.durable_epoch:
            store.mark_durable(epoch)
            self.broker.on_durable()


def _peer_of(stream: trio.SocketStream) -> tuple[str, str]:
    try:
        host, port = stream.socket.getpeername()[:2]
        return str(host), f"{host}:{port}"
    except OSError:
        return "", "?"


async def _run_until_signal(settings: Settings) -> None:
    node = Node(settings)
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
        async with trio.open_nursery() as nursery:
            await nursery.start(node.serve)

            async def watch_signals() -> None:
                async for signum in signals:
                    log.info("received %s", signal.Signals(signum).name)
                    if signum == signal.SIGHUP:
                        # Re-read the password file and the ACL; keep running.
                        await trio.to_thread.run_sync(node.security.reload)
                        continue
                    node.request_shutdown()
                    return

            nursery.start_soon(watch_signals)
            await node._shutdown.wait()


def run_node(settings: Settings) -> int:
    """Run a node until SIGINT/SIGTERM; 0 on a clean stop. Raises ConfigError for
    settings that cannot work (e.g. a port in use)."""
    try:
        trio.run(_run_until_signal, settings)
    except BaseExceptionGroup as group:
        config_errors = [e for e in _flatten(group) if isinstance(e, ConfigError)]
        if config_errors:
            raise config_errors[0] from None
        raise
    return 0


def _flatten(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        out: list[BaseException] = []
        for inner in exc.exceptions:
            out.extend(_flatten(inner))
        return out
    return [exc]


async def _in_worker_thread(fn: Callable[[], Any]) -> Any:
    """`trio.to_thread.run_sync` for the committer, at half its cost per call: no
    limiter, no per-call thread renaming (two /proc writes). Callers shield it."""
    token = trio.lowlevel.current_trio_token()
    done = trio.Event()
    result: list[Any] = []

    def deliver(outcome: Any) -> None:
        result.append(outcome)
        token.run_sync_soon(done.set)

    trio.lowlevel.start_thread_soon(fn, deliver)
    await done.wait()
    return result[0].unwrap()
