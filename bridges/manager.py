"""The node's bridges: which exist, their queues, their drivers, and the two ways in.

- `on_publish(message)`: the `message.publish` hook (registered by the node only while
  some bridge has egress filters, so a node without bridges pays nothing). For every
  bridge whose `egress` filters match, the message goes into that bridge's cache queue;
  for QoS >= 1 the call returns only once the queue's write is durable, so the
  publisher's PUBACK means "queued on disk". A message that came in through a bridge
  is never sent out again (`bridges.loops`).
- `enqueue(bridge_id, ...)` and `webhook_target(...)`: what rule actions send through
  (`bridges.actions`).

Bridges come from the node's `[[bridges]]` tables (`configure`) and from cluster
config registers `bridge/<id>` (`apply_cluster`: set through the API on any node, the
same on every node; a register wins over the file's table of the same id; an empty
value deletes). Each node bridges what its own clients publish: the hook runs where
the PUBLISH arrived, never for a message forwarded from another node.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
from dataclasses import dataclass, replace
from typing import Callable, Mapping, Protocol

import trio

from bridges.committer import Committer, WriteRunner, in_thread
from bridges.config import BridgeConfig, BridgeConfigError, parse_bridge
from bridges.connect import tls_context
from bridges.http_bridge import HttpBridge
from bridges.loops import came_through_bridge
from bridges.mqtt_bridge import IngressSink, MqttBridge
from bridges.queue import CacheQueue, parse_record_key, queue_prefix
from bridges.status import BridgeStatus
from bridges.store import QueueStore
from clock import Clock
from mqtt import topic_matches

log = logging.getLogger("meshd.bridges")

EXPIRE_EVERY = 1.0  # seconds between age checks of the queues


class PublishedMessage(Protocol):
    """A message at the message.publish hook, as egress reads it."""

    @property
    def topic(self) -> str: ...
    @property
    def payload(self) -> bytes: ...
    @property
    def qos(self) -> int: ...
    @property
    def retain(self) -> bool: ...
    @property
    def publisher(self) -> str | None: ...


class Driver(Protocol):
    status: BridgeStatus

    def wake(self) -> None: ...
    async def run(self) -> None: ...


@dataclass
class Bridge:
    config: BridgeConfig
    source: str  # "file" | "cluster" | "webhook"
    queue: CacheQueue
    driver: Driver
    scope: trio.CancelScope | None = None


class UnknownBridge(KeyError):
    pass


def http_body(message: PublishedMessage, node_id: str, wall: float) -> bytes:
    """The JSON an `http` bridge POSTs for one message."""
    body: dict[str, object] = {"topic": message.topic, "qos": message.qos, "retain": message.retain,
                               "clientid": message.publisher, "node": node_id, "timestamp": round(wall, 3)}
    try:
        body["payload"] = message.payload.decode("utf-8")
    except UnicodeDecodeError:
        import base64

        body["payload"] = base64.b64encode(message.payload).decode()
        body["payload_encoding"] = "base64"
    return json.dumps(body, separators=(",", ":")).encode()


class BridgeManager:
    def __init__(self, *, node_id: str, clock: Clock, rng: random.Random, store: QueueStore, ingress: IngressSink,
                 run_write: WriteRunner = in_thread, on_egress_change: Callable[[bool], None] | None = None) -> None:
        self.node_id = node_id
        self.clock = clock
        self._rng = rng
        self.ingress = ingress
        self.committer = Committer(store, run_write=run_write)
        self.committer.listeners.append(self._wake_all)
        self._on_egress_change = on_egress_change
        self._egress_on = False
        self._bridges: dict[str, Bridge] = {}
        self._file: dict[str, BridgeConfig] = {}
        self._cluster: dict[str, BridgeConfig | None] = {}  # None: deleted cluster-wide
        self._nursery: trio.Nursery | None = None
        self._egress: tuple[Bridge, ...] = ()
        # What the disk held at start, by bridge id; handed to a bridge's queue when it is made.
        self._recovered: dict[str, list[tuple[int, bytes]]] = {}
        for key, value in store.items():
            parsed = parse_record_key(key)
            if parsed is not None:
                self._recovered.setdefault(parsed[0], []).append((parsed[1], value))

    # ------------------------------------------------------------------ configuration

    def configure(self, configs: list[BridgeConfig]) -> None:
        """The node's own `[[bridges]]` (at build time)."""
        for config in configs:
            self._file[config.id] = config
        self._reconcile()

    def apply_cluster(self, bridge_id: str, text: str) -> None:
        """A cluster register `bridge/<id>` won: its JSON table, or "" (deleted)."""
        if text:
            try:
                self._cluster[bridge_id] = parse_bridge(json.loads(text))
            except (BridgeConfigError, ValueError) as exc:
                log.error("ignoring cluster bridge %s: %s", bridge_id, exc)
                return
        else:
            self._cluster[bridge_id] = None
        try:
            self._reconcile()
        except BridgeConfigError as exc:  # checked by the node that took it; this node cannot use it
            log.error("cannot apply cluster bridge %s here: %s", bridge_id, exc)

    def configs(self) -> dict[str, tuple[BridgeConfig, str]]:
        """Every bridge in effect: id -> (config, source)."""
        out = {bid: (c, "file") for bid, c in self._file.items()}
        for bid, config in self._cluster.items():
            if config is None:
                out.pop(bid, None)
            else:
                out[bid] = (config, "cluster")
        return out

    def _reconcile(self) -> None:
        wanted = self.configs()
        for bid in [b for b, bridge in self._bridges.items() if bridge.source != "webhook" and b not in wanted]:
            self._remove(bid)
        for bid, (config, source) in wanted.items():
            current = self._bridges.get(bid)
            if current is None or current.config != config:
                self._start(config, source)
            else:
                current.source = source
        self._egress_changed()

    def _start(self, config: BridgeConfig, source: str) -> None:
        """Make (or remake, with a changed config) one bridge; its queue is kept
        unless the type changed (an http queue holds JSON bodies, an mqtt one messages)."""
        tls = tls_context(config)  # BridgeConfigError on a bad bundle: before anything changes
        old = self._bridges.pop(config.id, None)
        if old is not None and old.scope is not None:
            old.scope.cancel()
        if old is not None and old.config.type == config.type:
            queue = old.queue
            queue.max_bytes = config.queue_max_bytes
            queue.max_age = config.queue_max_age_s
        else:
            if old is not None:
                self._drop_queue(old)
            queue = CacheQueue(config.id, max_bytes=config.queue_max_bytes, max_age=config.queue_max_age_s,
                               writes=self.committer)
            queue.restore(self._recovered.pop(config.id, []))
        rng = random.Random(self._rng.getrandbits(64))
        driver: Driver
        if config.type == "mqtt":
            driver = MqttBridge(config, node_id=self.node_id, queue=queue, committer=self.committer, clock=self.clock,
                                rng=rng, ingress=self.ingress, tls=tls)
        else:
            driver = HttpBridge(config, queue=queue, committer=self.committer, clock=self.clock, rng=rng, tls=tls)
        bridge = Bridge(config, source, queue, driver)
        self._bridges[config.id] = bridge
        if self._nursery is not None:
            self._nursery.start_soon(self._run_bridge, bridge)
        log.info("bridge %s (%s %s) configured from %s: egress %s, ingress %s", config.id, config.type, config.url,
                 source, list(config.egress), list(config.ingress))

    def _remove(self, bridge_id: str) -> None:
        bridge = self._bridges.pop(bridge_id, None)
        if bridge is None:
            return
        if bridge.scope is not None:
            bridge.scope.cancel()
        self._drop_queue(bridge)
        log.info("bridge %s removed (%d queued messages discarded)", bridge_id, len(bridge.queue))

    def _drop_queue(self, bridge: Bridge) -> None:
        bridge.queue.clear()
        self.committer.delete_prefix(queue_prefix(bridge.config.id))

    def _egress_changed(self) -> None:
        self._egress = tuple(b for b in self._bridges.values() if b.config.egress)
        on = bool(self._egress)
        if on != self._egress_on:
            self._egress_on = on
            if self._on_egress_change is not None:
                self._on_egress_change(on)

    @property
    def egress_on(self) -> bool:
        return self._egress_on

    # ------------------------------------------------------------------ running

    async def run(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self.committer.run)
                nursery.start_soon(self._expire_loop)
                # Records of bridges that no longer exist: gone with them.
                for bid in list(self._recovered):
                    self.committer.delete_prefix(queue_prefix(bid))
                self._recovered.clear()
                for bridge in list(self._bridges.values()):
                    nursery.start_soon(self._run_bridge, bridge)
        finally:
            # A stop writes what is pending and releases the database (and its lock) for the next start.
            self._nursery = None
            with trio.CancelScope(shield=True):
                while self.committer.has_pending():
                    await self.committer.commit_once()
            self.committer.store.close()

    async def _run_bridge(self, bridge: Bridge) -> None:
        with trio.CancelScope() as scope:
            bridge.scope = scope
            await bridge.driver.run()
        bridge.driver.status.state = "stopped"

    async def _expire_loop(self) -> None:
        while True:
            await trio.sleep(EXPIRE_EVERY)
            wall = self.clock.wall()
            for bridge in list(self._bridges.values()):
                bridge.queue.expire(wall)

    def _wake_all(self) -> None:
        for bridge in self._bridges.values():
            bridge.driver.wake()

    # ------------------------------------------------------------------ the ways in

    async def on_publish(self, message: PublishedMessage) -> None:
        """The message.publish hook: queue for every matching egress bridge; for QoS >= 1
        return once durable. Passes the message on unchanged (returns None)."""
        if came_through_bridge(message.publisher):
            return None
        topic = message.topic
        queued = False
        wall = self.clock.wall()
        for bridge in self._egress:
            if any(topic_matches(f, topic) for f in bridge.config.egress):
                payload = message.payload if bridge.config.type == "mqtt" else http_body(message, self.node_id, wall)
                bridge.queue.append(topic, payload, message.qos, message.retain, wall)
                queued = True
        if queued and message.qos:
            await self.committer.durable(self.committer.write_epoch)
        return None

    async def enqueue(self, bridge_id: str, topic: str, payload: bytes, qos: int, retain: bool = False) -> None:
        """One message into bridge `bridge_id`'s queue (a rule's bridge action); for
        QoS >= 1 once durable. UnknownBridge when there is no such bridge here."""
        bridge = self._bridges.get(bridge_id)
        if bridge is None or bridge.source == "webhook":
            raise UnknownBridge(bridge_id)
        bridge.queue.append(topic, payload, qos, retain, self.clock.wall())
        if qos:
            await self.committer.durable(self.committer.write_epoch)

    def webhook_target(self, url: str, headers: Mapping[str, str], timeout_s: float) -> str:
        """The id of the HTTP target a webhook action POSTs through (made on first use;
        one per url and headers). BridgeConfigError for a bad url or header."""
        digest = hashlib.sha1(json.dumps([url, sorted(headers.items())]).encode()).hexdigest()[:10]
        bridge_id = f"webhook-{digest}"
        config = parse_bridge({"id": bridge_id, "type": "http", "url": url, "headers": dict(headers),
                               "timeout_s": timeout_s})
        current = self._bridges.get(bridge_id)
        if current is None:
            self._start(config, "webhook")
        elif current.config.timeout_s != timeout_s:
            self._start(replace(current.config, timeout_s=min(current.config.timeout_s, timeout_s)), "webhook")
        return bridge_id

    async def post(self, target: str, body: bytes) -> None:
        """Queue one webhook body for `target` (durably: at-least-once)."""
        bridge = self._bridges.get(target)
        if bridge is None:
            raise UnknownBridge(target)
        bridge.queue.append("", body, 1, False, self.clock.wall())
        await self.committer.durable(self.committer.write_epoch)

    # ------------------------------------------------------------------ reading

    def ids(self) -> list[str]:
        return sorted(self._bridges)

    def describe(self, bridge_id: str) -> dict[str, object] | None:
        bridge = self._bridges.get(bridge_id)
        if bridge is None:
            return None
        queue = bridge.queue
        oldest = queue.oldest_at()
        return {
            "id": bridge_id, "type": bridge.config.type, "url": bridge.config.url, "source": bridge.source,
            "node": self.node_id,
            "config": bridge.config.as_table(),
            "status": bridge.driver.status.as_dict(),
            "metrics": {
                "queued": len(queue), "queued_bytes": queue.bytes,
                "oldest_age_s": None if oldest is None else round(max(0.0, self.clock.wall() - oldest), 3),
                "sent_total": queue.sent_total, "dropped_total": queue.dropped_total,
                "dropped": dict(queue.dropped),
            },
        }

    def queued(self) -> dict[str, int]:
        return {bid: len(b.queue) for bid, b in self._bridges.items()}

    def sent(self) -> dict[str, int]:
        return {bid: b.queue.sent_total for bid, b in self._bridges.items()}

    def dropped(self) -> dict[str, int]:
        return {bid: b.queue.dropped_total for bid, b in self._bridges.items()}

    def connected(self) -> dict[str, int]:
        return {bid: int(b.driver.status.state == "connected") for bid, b in self._bridges.items()}
