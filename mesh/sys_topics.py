"""`$SYS/broker/...` topics: the broker's own numbers, published retained every
`sys_interval` seconds (Mosquitto's names where they exist), and `$SYS/mesh/...`: the
cluster as this node sees it. And, as a built-in user of the client.connected and
client.disconnected hook points, one message per event on
`$SYS/brokers/<node>/clients/<client id>/connected|disconnected` (EMQX's topics; JSON,
not retained)."""

from __future__ import annotations

import json
from typing import Callable, Mapping, Protocol

import trio

BUILTIN_PRIORITY = 1000  # as the password file and the ACL (mesh.security)

from clock import Clock
from hooks import HookPoint, Hooks
from hooks.points import ClientInfo
from gossip.swim import MemberInfo
from mesh import __version__
from mesh.node_metrics import BrokerCounts, retained_counts
from mqtt import EMPTY_PROPERTIES, Properties
from session_store.model import Message


class SysBroker(BrokerCounts, Protocol):
    """The broker, as `$SYS` reads it (the counts `/metrics` reads too) and publishes through it."""

    @property
    def node_id(self) -> str: ...
    def make_message(self, topic: str, payload: bytes, qos: int, retain: bool, properties: Properties,
                     publisher: str | None, now: float) -> Message: ...
    def publish(self, msg: Message, now: float, *, internal: bool = False) -> int: ...
    def has_subscribers(self, topic: str) -> bool: ...


class MemberList(Protocol):
    def members(self) -> list[MemberInfo]: ...


class RouteCount(Protocol):
    def route_count(self) -> int: ...


class ForwardCounts(Protocol):
    """The cluster, as `$SYS/mesh` reads it."""

    @property
    def table(self) -> RouteCount: ...
    @property
    def forwarded_out(self) -> int: ...
    @property
    def forwarded_in(self) -> int: ...


class PartitionView(Protocol):
    def snapshot(self) -> Mapping[str, object]: ...


def sys_values(broker: SysBroker, uptime_s: float) -> list[tuple[str, str]]:
    stats = broker.stats
    return [
        ("$SYS/broker/version", f"meshd {__version__}"),
        ("$SYS/broker/node", broker.node_id),
        ("$SYS/broker/uptime", f"{int(uptime_s)} seconds"),
        ("$SYS/broker/clients/connected", str(broker.client_count())),
        ("$SYS/broker/clients/total", str(len(broker.sessions))),
        ("$SYS/broker/messages/received", str(sum(stats.messages_in))),
        ("$SYS/broker/messages/sent", str(sum(stats.messages_out))),
        ("$SYS/broker/messages/dropped", str(stats.dropped_queue_full + stats.dropped_slow_consumer)),
        ("$SYS/broker/bytes/received", str(stats.bytes_in)),
        ("$SYS/broker/bytes/sent", str(stats.bytes_out)),
        ("$SYS/broker/subscriptions/count", str(broker.subscription_count())),
        ("$SYS/broker/retained messages/count", str(retained_counts(broker.retained)[0])),
    ]


def mesh_values(gossip: MemberList, cluster: ForwardCounts, partitions: PartitionView) -> list[tuple[str, str]]:
    """`$SYS/mesh/...`: the cluster as this node sees it."""
    alive = [m["id"] for m in gossip.members() if m["state"] == "alive"]
    return [
        ("$SYS/mesh/members", json.dumps(sorted(alive))),
        ("$SYS/mesh/members/count", str(len(alive))),
        ("$SYS/mesh/routes/count", str(cluster.table.route_count())),
        ("$SYS/mesh/messages/forwarded", str(cluster.forwarded_out)),
        ("$SYS/mesh/messages/received", str(cluster.forwarded_in)),
        ("$SYS/mesh/partitions", json.dumps(partitions_value(partitions.snapshot()))),
    ]


def partitions_value(snapshot: Mapping[str, object]) -> dict[str, object]:
    """`$SYS/mesh/partitions`: the API's cluster view without the member list."""
    return {k: v for k, v in snapshot.items() if k not in ("members", "node_id")}


class SysPublisher:
    """Publishes `$SYS` retained through the broker, every `interval` seconds from the
    first round at start-up (0: never)."""

    def __init__(self, *, broker: SysBroker, clock: Clock, interval: float, uptime: Callable[[], float],
                 gossip: MemberList, cluster: ForwardCounts, partitions: PartitionView,
                 hooks: Hooks | None = None) -> None:
        self.broker = broker
        self.clock = clock
        self.interval = interval
        self.uptime = uptime
        self.gossip = gossip
        self.cluster = cluster
        self.partitions = partitions
        if hooks is not None and interval > 0:
            hooks.add(HookPoint.CLIENT_CONNECTED, self._on_connected, BUILTIN_PRIORITY, "builtin/sys")
            hooks.add(HookPoint.CLIENT_DISCONNECTED, self._on_disconnected, BUILTIN_PRIORITY, "builtin/sys")

    def _on_connected(self, _value: None, client: ClientInfo) -> None:
        topic = self._event_topic(client, "connected")
        if topic is not None:
            self._client_event(topic, client, {"proto_ver": client.protocol_level, "transport": client.transport})

    def _on_disconnected(self, _value: None, client: ClientInfo, reason: str) -> None:
        topic = self._event_topic(client, "disconnected")
        if topic is not None:
            self._client_event(topic, client, {"reason": reason})

    def _event_topic(self, client: ClientInfo, event: str) -> str | None:
        """The event's topic if a session here would receive it, else None: it is not
        retained, so with no one to receive it nothing is built (asked per CONNECT)."""
        client_id = client.client_id
        if "+" in client_id or "#" in client_id:
            return None  # not a topic name level
        broker = self.broker
        topic = f"$SYS/brokers/{broker.node_id}/clients/{client_id}/{event}"
        return topic if broker.has_subscribers(topic) else None

    def _client_event(self, topic: str, client: ClientInfo, extra: dict[str, object]) -> None:
        broker = self.broker
        now = self.clock.wall()
        body = {"clientid": client.client_id, "username": client.username, "peer": client.peer, "node": client.node,
                "ts": int(now * 1000), **extra}
        broker.publish(broker.make_message(topic, json.dumps(body).encode(), 0, False, EMPTY_PROPERTIES, None, now),
                       now, internal=True)

    def values(self) -> list[tuple[str, str]]:
        return sys_values(self.broker, self.uptime()) + self.mesh_values()

    def mesh_values(self) -> list[tuple[str, str]]:
        return mesh_values(self.gossip, self.cluster, self.partitions)

    def publish_once(self) -> None:
        broker = self.broker
        now = self.clock.wall()
        for topic, value in self.values():
            broker.publish(broker.make_message(topic, value.encode(), 0, True, EMPTY_PROPERTIES, None, now), now, internal=True)

    async def run(self) -> None:
        if self.interval <= 0:
            return
        while True:
            self.publish_once()
            await trio.sleep(self.interval)
