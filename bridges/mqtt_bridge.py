"""The Trio driver of an MQTT bridge: one connection to the remote broker at a time.

Egress: the cache queue's durable records, in order, published on the remote under
`remote_prefix` with their QoS, at most `inflight` unacknowledged; a record leaves the
queue when the remote acknowledged it (PUBACK / PUBCOMP; QoS 0 once written). After a
reconnect the queue is sent again from its head, so what was unanswered is sent again
(at least once, order kept per publisher).

Ingress: the `ingress` filters subscribed on the remote (as one shared subscription
per cluster unless `ingress_shared = false`, with No Local on v5 plain subscriptions);
each message is published here under `local_prefix` and then acknowledged to the
remote. Loop prevention: `bridges.loops`.

A lost or refused connection is retried after `bridges.backoff.Backoff`'s delay; the
reason is kept for the API (`status.last_error`).
"""

from __future__ import annotations

import logging
import random
import ssl
from typing import Protocol

import trio

from bridges.backoff import Backoff
from bridges.committer import Committer
from bridges.config import BridgeConfig
from bridges.connect import describe, open_stream
from bridges.loops import ORIGIN_PROPERTY, EchoFilter
from bridges.mqtt_client import (
    Arrived,
    ClientConnection,
    ClientProtocolError,
    Connected,
    ConnectRefused,
    Delivered,
    Event,
    Refused,
    ServerDisconnected,
    Subscribed,
)
from bridges.queue import CacheQueue
from bridges.status import BridgeStatus
from clock import Clock
from mqtt import Properties, ReasonCode
from oplog import Event as LogEvent, log_event

log = logging.getLogger("meshd.bridges")


class IngressSink(Protocol):
    """Where ingress messages go: the local broker."""

    def publish_ingress(self, bridge_id: str, topic: str, payload: bytes, qos: int, retain: bool,
                        properties: Properties) -> None: ...


class BridgeDown(Exception):
    """The connection ended (the reason is the message)."""


# What ends one connection (and is retried after the backoff), as opposed to a bug.
CONNECTION_ERRORS = (OSError, trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError,
                     ClientProtocolError, BridgeDown, ssl.SSLError)


def _first(group: BaseExceptionGroup[BaseException]) -> BaseException:
    first = group.exceptions[0]
    return _first(first) if isinstance(first, BaseExceptionGroup) else first


def _reason(code: int) -> str:
    try:
        return f"0x{code:02X} {ReasonCode(code).name.lower().replace('_', ' ')}"
    except ValueError:
        return f"0x{code:02X}"


class MqttBridge:
    def __init__(self, config: BridgeConfig, *, node_id: str, queue: CacheQueue, committer: Committer,
                 clock: Clock, rng: random.Random, ingress: IngressSink, tls: ssl.SSLContext | None) -> None:
        self.config = config
        self.node_id = node_id
        self.queue = queue
        self.committer = committer
        self.clock = clock
        self.ingress = ingress
        self.tls = tls
        self.status = BridgeStatus()
        self.backoff = Backoff(config.backoff_min_s, config.backoff_max_s, rng)
        self.echo = EchoFilter()
        self.client_id = config.client_id or f"meshd-{config.id}-{node_id}"[:64]
        self._wakeup = trio.Event()
        self._send_lock = trio.Lock()

    def wake(self) -> None:
        self._wakeup.set()

    async def run(self) -> None:
        cfg = self.config
        while True:
            self.status.state = "connecting"
            self.status.retry_in_s = None
            try:
                await self._session()
                error = "connection closed by the remote"
            except CONNECTION_ERRORS as exc:
                error = describe(exc)
            was_connected = self.status.connected_since is not None
            self.status.failed(error, self.clock.wall())
            if was_connected:
                log_event(log, LogEvent.BRIDGE_DISCONNECTED, bridge=cfg.id, error=error)
            delay = self.backoff.next_delay()
            self.status.retry_in_s = round(delay, 3)
            log.debug("bridge %s: %s; retrying in %.2f s", cfg.id, error, delay)
            await trio.sleep(delay)

    async def _session(self) -> None:
        cfg = self.config
        with trio.fail_after(cfg.timeout_s):
            stream = await open_stream(cfg, self.tls)
        async with stream:
            core = ClientConnection(
                client_id=self.client_id, protocol_level=cfg.protocol_version, keepalive=cfg.keepalive_s,
                clean_start=cfg.clean_start, session_expiry=0 if cfg.clean_start else cfg.session_expiry_s,
                username=cfg.username, password=cfg.password, max_inflight=cfg.inflight,
            )
            await stream.send_all(core.connect(self.clock.now()))
            with trio.fail_after(cfg.timeout_s):
                await self._await_connack(stream, core)
            self.status.state = "connected"
            self.status.connected_since = self.clock.wall()
            self.status.connects_total += 1
            self.backoff.reset()
            log_event(log, LogEvent.BRIDGE_CONNECTED, bridge=cfg.id, url=cfg.url)
            if cfg.ingress:
                await self._send(stream, core.subscribe(self._ingress_filters(), self.clock.now()))
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._sender, stream, core)
                    if cfg.keepalive_s:
                        nursery.start_soon(self._pinger, stream, core)
                    await self._reader(stream, core)  # returns or raises when the connection ends
                    nursery.cancel_scope.cancel()
            except BaseExceptionGroup as group:
                # One task's lost connection ends the others: report that one error.
                # Anything else (a cancellation from outside, a bug) goes on without them.
                lost, rest = group.split(CONNECTION_ERRORS)
                if rest is not None:
                    raise rest from None
                assert lost is not None
                raise _first(lost) from None

    def _ingress_filters(self) -> list[tuple[str, int, bool]]:
        cfg = self.config
        if cfg.ingress_shared:
            return [(f"$share/meshd-{cfg.id}/{f}", 2, False) for f in cfg.ingress]
        return [(f, 2, True) for f in cfg.ingress]

    async def _await_connack(self, stream: trio.abc.Stream, core: ClientConnection) -> None:
        while True:
            data = await stream.receive_some()
            if not data:
                raise BridgeDown("connection closed before CONNACK")
            events, answer = core.receive_data(bytes(data), self.clock.now())
            for event in events:
                if isinstance(event, ConnectRefused):
                    raise BridgeDown(f"remote refused the connection: CONNACK {_reason(event.reason_code)}")
                if isinstance(event, Connected):
                    return

    async def _send(self, stream: trio.abc.Stream, data: bytes) -> None:
        if data:
            async with self._send_lock:
                await stream.send_all(data)

    async def _reader(self, stream: trio.abc.Stream, core: ClientConnection) -> None:
        while True:
            data = await stream.receive_some()
            if not data:
                return
            events, answer = core.receive_data(bytes(data), self.clock.now())
            out = [answer]
            for event in events:
                out.append(self._handle(event, core))
            await self._send(stream, b"".join(out))

    def _handle(self, event: Event, core: ClientConnection) -> bytes:
        queue = self.queue
        if isinstance(event, Delivered):
            queue.ack(event.token)
            self.wake()
        elif isinstance(event, Refused):
            if queue.refuse(event.token):
                self._error(f"remote refused a message: {_reason(event.reason_code)}")
            self.wake()
        elif isinstance(event, Arrived):
            return self._arrived(event, core)
        elif isinstance(event, Subscribed):
            refused = [(f, c) for f, c in zip(self.config.ingress, event.reason_codes) if c >= 0x80]
            if refused:
                self._error("ingress subscription refused: " + ", ".join(f"{f} ({_reason(c)})" for f, c in refused))
        elif isinstance(event, ServerDisconnected):
            raise BridgeDown(f"remote disconnected us: {_reason(event.reason_code)}")
        return b""

    def _arrived(self, event: Arrived, core: ClientConnection) -> bytes:
        p = event.publish
        now = self.clock.now()
        marks = [v for k, v in p.properties.user_properties if k == ORIGIN_PROPERTY]
        if self.node_id in marks or self.echo.is_echo(p.topic, p.payload):
            self.status.echoes_dropped += 1
            return core.accept(p, now)
        props = Properties(user_properties=p.properties.user_properties,
                           content_type=p.properties.content_type,
                           payload_format_indicator=p.properties.payload_format_indicator)
        self.ingress.publish_ingress(self.config.id, self.config.local_prefix + p.topic, p.payload, p.qos,
                                     p.retain, props)
        self.status.received_total += 1
        return core.accept(p, now)

    def _error(self, message: str) -> None:
        self.status.last_error = message
        self.status.last_error_at = self.clock.wall()
        self.status.errors_total += 1
        log.warning("bridge %s: %s", self.config.id, message)

    async def _sender(self, stream: trio.abc.Stream, core: ClientConnection) -> None:
        cfg = self.config
        queue = self.queue
        cursor = 0  # the last sequence number sent on this connection: a new one starts at the head
        marks = ((ORIGIN_PROPERTY, self.node_id),)
        props = Properties(user_properties=marks) if cfg.protocol_version == 5 else None
        while True:
            wakeup = self._wakeup = trio.Event()
            room = core.max_inflight - len(core.inflight_tokens())
            records = queue.unsent(cursor, max(room, 0), self.committer.durable_epoch) if room > 0 else []
            if not records:
                await wakeup.wait()
                continue
            cold = queue.cold_keys(records)
            if cold:
                values = await trio.to_thread.run_sync(self.committer.store.read, cold)
                queue.warm(records, values)
            now = self.clock.now()
            out = []
            sent_qos0 = []
            for record in records:
                cursor = record.seq
                if record.payload is None:  # gone from the disk meanwhile: dropped by the bound
                    continue
                topic = cfg.remote_prefix + record.topic
                out.append(core.publish(record.seq, topic, record.payload, record.qos, record.retain, now, props))
                self.echo.sent(topic, record.payload)
                if record.qos == 0:
                    sent_qos0.append(record.seq)
            await self._send(stream, b"".join(out))
            for seq in sent_qos0:
                queue.ack(seq)

    async def _pinger(self, stream: trio.abc.Stream, core: ClientConnection) -> None:
        while True:
            due = core.ping_due()
            if due is None:
                return
            now = self.clock.now()
            if now >= due:
                await self._send(stream, core.ping(now))
                continue
            await trio.sleep(due - now)
