"""Bridges in the node: building the `bridges.BridgeManager` from settings, and what the
node shows of it (the `/api/v1/bridges` routes, the `meshd_bridge_*` metrics).

The egress hook is added at `message.publish` only while some bridge has egress filters
(a node without bridges keeps the hot path free of it); ingress messages are published
through the broker as the publisher `$bridge/<id>`, so egress never sends them back.
"""

from __future__ import annotations

import json
import logging
import os
import random
from typing import Awaitable, Callable, Mapping, Protocol

from bridges import BridgeConfig, BridgeConfigError, BridgeManager, parse_bridge
from bridges.committer import WriteRunner, in_thread
from bridges.connect import tls_context
from bridges.loops import ingress_publisher
from bridges.store import MemoryQueueStore, QueueStore, QueueStoreError, RocksQueueStore
from clock import Clock
from hooks import HookPoint, Hooks, Registration
from mesh.cluster_config import Register
from mesh.config import ConfigError, Settings
from mesh.http_api import Request, Response, error_response, json_response
from mesh.metrics import Metrics
from mqtt import Properties
from session_store.model import Message

log = logging.getLogger("meshd.bridges")

Handler = Callable[[Request], Awaitable[Response]]
EGRESS_PRIORITY = -100  # after plugins and rules: what they drop or change is what goes out


class IngressBroker(Protocol):
    def make_message(self, topic: str, payload: bytes, qos: int, retain: bool, properties: Properties,
                     publisher: str | None, now: float) -> Message: ...
    def publish(self, msg: Message, now: float) -> int: ...


class BrokerIngress:
    """Ingress into the local broker (and through it, the cluster)."""

    def __init__(self, broker: IngressBroker, clock: Clock) -> None:
        self.broker = broker
        self.clock = clock

    def publish_ingress(self, bridge_id: str, topic: str, payload: bytes, qos: int, retain: bool,
                        properties: Properties) -> None:
        now = self.clock.wall()
        msg = self.broker.make_message(topic, payload, qos, retain, properties, ingress_publisher(bridge_id), now)
        self.broker.publish(msg, now)


def bridge_configs(settings: Settings) -> list[BridgeConfig]:
    """The node's `[[bridges]]`, checked; ConfigError naming `bridges[<i>].<key>`."""
    configs = []
    seen: set[str] = set()
    for i, table in enumerate(settings.bridges):
        try:
            config = parse_bridge(table)
            tls_context(config)
        except BridgeConfigError as exc:
            raise ConfigError(f"bridges[{i}].{exc.key}", exc.message) from None
        if config.id in seen:
            raise ConfigError(f"bridges[{i}].id", f"{config.id!r} is used by an earlier bridge")
        seen.add(config.id)
        configs.append(config)
    return configs


def build_bridges(settings: Settings, configs: list[BridgeConfig], *, node_id: str, clock: Clock,
                  rng: random.Random, broker: IngressBroker, hooks: Hooks, in_memory: bool = False,
                  run_write: WriteRunner | None = None) -> BridgeManager:
    """The node's bridges (`configs` from `bridge_configs`; queues in
    `<data_dir>/bridges`, or in memory for the simulator), the egress hook wired."""
    store: QueueStore
    if in_memory:
        store = MemoryQueueStore()
    else:
        try:
            store = RocksQueueStore(os.path.join(settings.data_dir, "bridges"))
        except QueueStoreError as exc:
            raise ConfigError("data_dir", str(exc)) from None
    registration: list[Registration] = []
    manager: BridgeManager

    def egress(on: bool) -> None:
        if on and not registration:
            registration.append(hooks.add(HookPoint.MESSAGE_PUBLISH, manager.on_publish, EGRESS_PRIORITY,
                                          name="bridges.egress"))
        elif not on and registration:
            hooks.remove(registration.pop())

    manager = BridgeManager(node_id=node_id, clock=clock, rng=rng, store=store, ingress=BrokerIngress(broker, clock),
                            run_write=run_write or in_thread, on_egress_change=egress)
    manager.configure(configs)
    return manager


class BridgeConfigs(Protocol):
    def set(self, key: str, raw: object) -> Register: ...


def bridge_routes(bridges: BridgeManager, config_sync: BridgeConfigs) -> list[tuple[str, str, Handler]]:
    """GET|POST /api/v1/bridges, GET|DELETE /api/v1/bridges/{id}: each bridge with its
    status and metrics on this node; POST and DELETE change it cluster-wide."""

    async def list_bridges(request: Request) -> Response:
        return json_response({"node_id": bridges.node_id,
                              "bridges": [bridges.describe(bid) for bid in bridges.ids()]})

    async def get_bridge(request: Request) -> Response:
        bid = request.path_params["id"]
        found = bridges.describe(bid)
        if found is None:
            return error_response(404, f"{bid}: no such bridge")
        return json_response(found)

    async def post_bridge(request: Request) -> Response:
        body = request.json()
        if not isinstance(body, dict):
            return error_response(400, "expected a JSON object: the bridge's table (id, type, url, egress, ...)")
        try:
            config = parse_bridge(body)
            tls_context(config)
        except BridgeConfigError as exc:
            return error_response(400, str(exc))
        try:
            config_sync.set(f"bridge/{config.id}", json.dumps(body, sort_keys=True))
        except ConfigError as exc:
            return error_response(400, str(exc))
        return json_response(bridges.describe(config.id), 201)

    async def delete_bridge(request: Request) -> Response:
        bid = request.path_params["id"]
        found = bridges.describe(bid)
        if found is None or found["source"] == "webhook":
            return error_response(404, f"{bid}: no such bridge")
        config_sync.set(f"bridge/{bid}", "")
        return json_response({"deleted": bid})

    return [
        ("GET", "/api/v1/bridges", list_bridges),
        ("POST", "/api/v1/bridges", post_bridge),
        ("GET", "/api/v1/bridges/{id}", get_bridge),
        ("DELETE", "/api/v1/bridges/{id}", delete_bridge),
    ]


def add_bridge_metrics(metrics: Metrics, bridges: BridgeManager) -> None:
    metrics.gauge_callback("meshd_bridge_queued", "messages in a bridge's cache queue", bridges.queued, ("bridge",))
    metrics.counter_callback("meshd_bridge_sent_total", "messages a bridge's target acknowledged", bridges.sent,
                             ("bridge",))
    metrics.counter_callback("meshd_bridge_dropped_total",
                             "messages a bridge dropped (queue full, too old, refused by the target)",
                             bridges.dropped, ("bridge",))
    metrics.gauge_callback("meshd_bridge_connected", "1 while a bridge's target answers", bridges.connected,
                           ("bridge",))


def configure_families(bridges: BridgeManager) -> Mapping[str, Callable[[str, str], None]]:
    """What config sync calls for the `bridge/<id>` registers."""
    return {"bridge": bridges.apply_cluster}
