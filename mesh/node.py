"""A meshd node at run time: listeners, HTTP API, timers and `$SYS`, around one Broker.
Its parts are built by `mesh.compose.build_node`; this module runs them.

Task tree (one nursery per layer, so shutdown can go in order):

    run_node (mesh.run) ── signal receiver
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
import math
import os
import socket
import sys
from typing import Any, Awaitable, Callable, Protocol, Sequence, TypeVar, cast

import outcome
import trio
from trio_websocket import WebSocketRequest, serve_websocket, wrap_server_stream

import faults
from clock import Clock
from gossip.trace import NullTraceWriter, TraceWriter
from mesh import __version__
from mesh.broker import Broker
from mesh.config import ConfigError, HostPort, Settings
from mesh.connection import ClientConnection
from mesh.doorbell import Doorbell
from mesh.flusher import Flusher
from mesh.http_api import Router, serve_http
from mesh.parked import ParkedConnection
from mesh.parking import ParkingLot
from mesh.ready import remove_ready_file, write_ready_file
from mesh.security import Security
from mesh.streams import ByteStream, SocketByteStream
from mesh.tls import accept_tls, peer_common_name
from mesh.ws import WebSocketByteStream, accept_mqtt
from mqtt import ReasonCode
from session_store.store import SessionStore

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
WRITE_RETRY_S = 1.0  # a failed store write is tried again after this (the batch is kept)


def _first_oserror(exc: BaseException) -> OSError | None:
    if isinstance(exc, OSError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _first_oserror(inner)
            if found is not None:
                return found
    return None


class Runnable(Protocol):
    """A part with a task of its own (partition monitor, $SYS publisher)."""

    async def run(self) -> None: ...


class Startable(Protocol):
    """A part whose task reports when it is ready (the cluster)."""

    async def run(self, *, task_status: trio.TaskStatus[None] = ...) -> None: ...


class NodeGossip(Protocol):
    async def run(self, *, task_status: trio.TaskStatus[int] = ...) -> None: ...
    async def leave(self, timeout: float = ...) -> None: ...
    def has_peers(self) -> bool: ...


# Runs one blocking store write (`SessionStore.write_batch`) and waits for it: off the
# Trio thread in a node (`_in_worker_thread`), inline in the cluster simulator.
WriteRunner = Callable[[Callable[[], None]], Awaitable[None]]


class Node:
    """The running shell around parts built by `mesh.compose.build_node`: it opens the
    listeners, runs every part's task in order and shuts them down in order."""

    def __init__(
        self,
        *,
        settings: Settings,
        node_id: str,
        clock: Clock,
        started_at: float,
        security: Security,
        store: SessionStore,
        store_dirty: Doorbell,
        trace: TraceWriter | NullTraceWriter,
        gossip: NodeGossip,
        partitions: Runnable,
        broker: Broker,
        timers_changed: Doorbell,
        cluster: Startable,
        sys: Runnable,
        ports: dict[str, int],
        api: Router,
        run_write: WriteRunner | None = None,
        services: Sequence[Runnable] = (),
    ) -> None:
        self.settings = settings
        self.node_id = node_id
        self.clock = clock
        self.started_at = started_at  # wall time (the API and $SYS count uptime from it)
        self.security = security
        self.store = store
        self._store_dirty = store_dirty  # rung by the store: the committer has work
        self.trace = trace
        self.gossip = gossip
        self.partitions = partitions
        self.broker = broker
        self._timers_changed = timers_changed  # rung by the broker: an earlier deadline
        self.cluster = cluster
        self.sys = sys
        self.ports = ports  # filled in as the listeners bind (the API shows them)
        self.api = api
        self._run_write: WriteRunner = run_write if run_write is not None else _in_worker_thread
        self.services = tuple(services)  # more parts' tasks (the bridges), run beside the others
        self._shutdown = trio.Event()
        self._connections: trio.Nursery | None = None  # set by serve(): every client task runs here
        self._lot: ParkingLot | None = None  # set by serve(): idle plain-TCP clients wait here

    def request_shutdown(self) -> None:
        self._shutdown.set()

    async def shutdown_requested(self) -> None:
        await self._shutdown.wait()

    async def serve(self, *, task_status: trio.TaskStatus[dict[str, int]] = trio.TASK_STATUS_IGNORED) -> None:
        s = self.settings
        remove_ready_file(s.ready_file)
        async with trio.open_nursery() as connections:
            self._connections = connections
            flusher = Flusher()
            lot = self._lot = ParkingLot(self.clock, flusher)
            async with trio.open_nursery() as services:
                services.start_soon(lot.run)
                services.start_soon(flusher.run)
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
                for service in self.services:
                    services.start_soon(service.run)
                log.info(
                    "node %s (meshd %s) listening: %s",
                    self.node_id, __version__,
                    ", ".join(f"{name} {getattr(s, name).host}:{port}" for name, port in self.ports.items()),
                )
                mqtt_listeners = {n: (getattr(s, n).host, port) for n, port in self.ports.items() if n in ("mqtt", "ws", "mqtts", "wss")}
                for line in self.security.startup_warnings(mqtt_listeners):
                    log.warning("%s", line)
                write_ready_file(s.ready_file, self.node_id, __version__, self.ports)
                task_status.started(dict(self.ports))
                await self._shutdown.wait()
                log.info("shutting down: leaving the cluster, closing listeners")
                if self.gossip.has_peers():
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
        remove_ready_file(s.ready_file)
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
        socket descriptor in a SocketByteStream, parked in the lot until its CONNECT comes
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
            # The C accept under socket.accept: (descriptor, address), with no socket
            # object per client (its family/type properties alone cost ~2 µs per accept).
            accept: Callable[[], tuple[int, Any]] = getattr(raw, "_accept")
            broker = self.broker
            security = self.security
            timeout = settings.connect_timeout
            try:
                while True:
                    for _ in range(ACCEPT_BATCH):
                        try:
                            fd, addr = accept()
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
                            sock = socket.socket(fileno=fd)
                            if nodelay_inherited is None:
                                nodelay_inherited = bool(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
                            if not nodelay_inherited:
                                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                            sock.detach()
                        # Interned: clients behind one address (a NAT, a load balancer)
                        # share one string instead of holding a copy each (~60 bytes).
                        host = sys.intern(str(addr[0])) if isinstance(addr, tuple) else ""
                        peer: str | int = int(addr[1]) if isinstance(addr, tuple) else "?"  # a port: host:port when asked
                        conn = ParkedConnection(broker, SocketByteStream(fd, accepted=True), peer, clock=self.clock, lot=lot,
                                                nursery=connections, connect_timeout=timeout, security=security,
                                                peer_ip=host)
                        conn.park_new()
                    else:
                        await trio.lowlevel.checkpoint()  # a full batch: let others run, then go on
                        continue
                    await trio.lowlevel.wait_readable(raw)
            finally:
                raw.close()

    async def _serve_tls(self, listeners: list[trio.SocketListener], connections: trio.Nursery,
                         handler: Callable[[trio.SocketStream], Awaitable[None]]) -> None:
        await trio.serve_listeners(handler, listeners, handler_nursery=connections)

    async def _handle_mqtts(self, stream: trio.SocketStream) -> None:
        host, peer = _peer_of(stream)
        assert self.security.tls_context is not None
        tls = await accept_tls(stream, self.security.tls_context, timeout=self.settings.connect_timeout)
        if tls is not None:
            # SSLStream reads what ssl.SSLObject.read returns: bytes (typed bytes | bytearray).
            await self._run_connection(cast(ByteStream, tls), peer, "mqtts", host, peer_common_name(tls))

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

    def serve_client_stream(self, stream: ByteStream, peer: str, transport: str = "memory") -> None:
        """Serve one client connection on a stream that came from somewhere other than
        this node's listeners (the cluster simulator's in-memory clients): the same
        `ClientConnection` path as a TLS or WebSocket client, in the node's connection
        nursery.  Only while `serve()` runs."""
        if self._connections is None:
            raise RuntimeError("the node is not serving")
        self._connections.start_soon(self._run_connection, stream, peer, transport)

    async def _run_connection(self, stream: ByteStream, peer: str, transport: str, peer_ip: str = "", cert_cn: str | None = None) -> None:
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

    async def _start_gossip(self, services: trio.Nursery, addr: HostPort) -> int:
        try:
            return await services.start(self.gossip.run)
        except BaseException as exc:
            oserror = _first_oserror(exc)
            if oserror is None:
                raise
            raise _bind_error("gossip", addr, oserror) from exc

    async def _start_http(self, services: trio.Nursery, addr: HostPort) -> int:
        try:
            return await services.start(serve_http, self.api, addr.host, addr.port)
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
                await self._commit_once(hold)

    async def _commit_pending(self) -> None:
        while self.store.has_pending():
            await self._commit_once()

    async def _commit_once(self, hold: int = 0) -> None:
        store = self.store
        batch, epoch = store.take_batch(hold)
        if len(batch):
            # BUGGIFY skip-sync: written without a sync, yet acknowledged as durable.
            sync = self.settings.durability != "off" and not faults.SKIP_SYNC
            await self._write_until_done(functools.partial(store.write_batch, batch, sync=sync))
            store.stats.count(batch)
        if epoch > store.durable_epoch:
            store.mark_durable(epoch)
            self.broker.on_durable()


    async def _write_until_done(self, write: Callable[[], None]) -> None:
        """A full or failing disk does not end the node: the batch is kept, the store
        says why (`write_failed`: a replica tells its owners so, which replace it) and
        the write is tried again every second; what waits for durability waits. At
        shutdown the error ends the node, as before."""
        store = self.store
        while True:
            try:
                # A batch once taken must reach the disk: shutdown must not cancel a write
                # midway (a kill may cancel the wait between two attempts: that batch was
                # never durable, so nothing waiting for it was acknowledged).
                with trio.CancelScope(shield=True):
                    await self._run_write(write)
            except Exception as exc:
                if self._shutdown.is_set():
                    raise
                if store.write_failed is None:
                    log.error("session store write failed (trying again every second; acknowledgements wait): %s", exc)
                store.write_failed = str(exc) or type(exc).__name__
                await trio.sleep(WRITE_RETRY_S)
                continue
            if store.write_failed is not None:
                log.warning("session store writes again")
                store.write_failed = None
            return


def _peer_of(stream: trio.SocketStream) -> tuple[str, str]:
    try:
        host, port = stream.socket.getpeername()[:2]
        return str(host), f"{host}:{port}"
    except OSError:
        return "", "?"


T = TypeVar("T")


async def _in_worker_thread(fn: Callable[[], T]) -> T:
    """`trio.to_thread.run_sync` for the committer, at half its cost per call: no
    limiter, no per-call thread renaming (two /proc writes). Callers shield it."""
    token = trio.lowlevel.current_trio_token()
    done = trio.Event()
    result: list[outcome.Outcome[T]] = []

    def deliver(finished: outcome.Outcome[T]) -> None:
        result.append(finished)
        token.run_sync_soon(done.set)

    trio.lowlevel.start_thread_soon(fn, deliver)
    await done.wait()
    return result[0].unwrap()
