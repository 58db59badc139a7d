"""`$SYS/broker/...` topics: the broker's own numbers, published retained every
`sys_interval` seconds (Mosquitto's names where they exist)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from mesh import __version__

if TYPE_CHECKING:
    from mesh.broker import Broker


def sys_values(broker: "Broker", uptime_s: float) -> list[tuple[str, str]]:
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
        ("$SYS/broker/retained messages/count", str(len(broker.retained))),
    ] + mesh_values(broker)


def mesh_values(broker: "Broker") -> list[tuple[str, str]]:
    """`$SYS/mesh/...`: the cluster as this node sees it."""
    cluster = broker.cluster
    if cluster is None:
        return []
    members = cluster.gossip.members()
    alive = [m["id"] for m in members if m["state"] == "alive"]
    out = [
        ("$SYS/mesh/members", json.dumps(sorted(alive))),
        ("$SYS/mesh/members/count", str(len(alive))),
        ("$SYS/mesh/routes/count", str(cluster.table.route_count())),
        ("$SYS/mesh/messages/forwarded", str(cluster.forwarded_out)),
        ("$SYS/mesh/messages/received", str(cluster.forwarded_in)),
    ]
    monitor = getattr(cluster.gossip, "partitions", None)
    if monitor is not None:
        out.append(("$SYS/mesh/partitions", json.dumps(partitions_value(monitor.snapshot()))))
    return out


def partitions_value(snapshot: dict) -> dict:
    """`$SYS/mesh/partitions`: the API's cluster view without the member list."""
    return {k: v for k, v in snapshot.items() if k not in ("members", "node_id")}


def publish_sys(broker: "Broker", uptime_s: float, now: float) -> None:
    from mqtt import EMPTY_PROPERTIES

    for topic, value in sys_values(broker, uptime_s):
        broker.publish(broker.make_message(topic, value.encode(), 0, True, EMPTY_PROPERTIES, None, now), now, internal=True)
