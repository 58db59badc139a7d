"""The node's Prometheus metrics, read from the broker's plain counters at scrape time
(the hot path only ever does `int += 1`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mesh.metrics import Metrics

if TYPE_CHECKING:
    from mesh.node import Node


def node_metrics(node: "Node") -> Metrics:
    m = Metrics()
    broker = node.broker
    stats = broker.stats
    m.gauge_callback("meshd_connections", "clients connected now", lambda: broker.client_count())
    m.counter_callback("meshd_connections_total", "client connections accepted", lambda: stats.connections_total)
    m.gauge_callback("meshd_sessions", "sessions held (connected and persistent offline)", lambda: len(broker.sessions))
    m.gauge_callback("meshd_subscriptions", "subscriptions held", lambda: broker.subscription_count())
    m.gauge_callback("meshd_retained_messages", "retained messages held", lambda: len(broker.retained))
    m.counter_callback(
        "meshd_messages_received_total", "PUBLISH packets received from clients, by QoS",
        lambda: {str(q): n for q, n in enumerate(stats.messages_in)}, ("qos",),
    )
    m.counter_callback(
        "meshd_messages_sent_total", "PUBLISH packets sent to clients, by QoS",
        lambda: {str(q): n for q, n in enumerate(stats.messages_out)}, ("qos",),
    )
    m.counter_callback("meshd_bytes_received_total", "bytes read from client connections", lambda: stats.bytes_in)
    m.counter_callback("meshd_bytes_sent_total", "bytes written to client connections", lambda: stats.bytes_out)
    m.counter_callback(
        "meshd_messages_dropped_total", "messages dropped, by reason",
        lambda: {
            "queue_full": stats.dropped_queue_full,
            "slow_consumer": stats.dropped_slow_consumer,
            "expired": stats.dropped_expired,
            "too_large_for_client": stats.dropped_too_large,
        },
        ("reason",),
    )
    m.counter_callback("meshd_protocol_errors_total", "connections closed for breaking the protocol", lambda: stats.protocol_errors)
    m.gauge_callback("meshd_uptime_seconds", "seconds since the node started", node.uptime)
    return m
