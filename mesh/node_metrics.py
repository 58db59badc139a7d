"""The node's Prometheus metrics, read from the broker's plain counters at scrape time
(the hot path only ever does `int += 1`).

`node_metrics` is given each part of the node as a Protocol of the counters it
renders and nothing else."""

from __future__ import annotations

from typing import Callable, Mapping, Protocol, Sized

from gossip.swim import MemberInfo
from mesh.broker import BrokerStats
from mesh.metrics import Metrics
from session_store.store import StoreStats


class RetainedCounts(Protocol):
    def __len__(self) -> int: ...
    def count_under(self, first_level: str) -> int: ...


def retained_counts(retained: RetainedCounts) -> tuple[int, int]:
    """(users', `$SYS`) retained messages: the broker's own `$SYS` topics are not
    messages anyone published, so they are counted apart."""
    own = retained.count_under("$SYS")
    return len(retained) - own, own


class BrokerCounts(Protocol):
    @property
    def stats(self) -> BrokerStats: ...
    @property
    def sessions(self) -> Sized: ...
    @property
    def retained(self) -> RetainedCounts: ...
    def client_count(self) -> int: ...
    def subscription_count(self) -> int: ...


class StoreCounts(Protocol):
    @property
    def stats(self) -> StoreStats: ...


class GossipCounts(Protocol):
    def members(self) -> list[MemberInfo]: ...
    @property
    def stats(self) -> Mapping[str, float]: ...
    @property
    def malformed_by_reason(self) -> Mapping[str, int]: ...


class DetectorCounts(Protocol):
    @property
    def active(self) -> Sized: ...


class PartitionCounts(Protocol):
    @property
    def detector(self) -> DetectorCounts: ...
    @property
    def detected_total(self) -> int: ...
    @property
    def healed_total(self) -> int: ...
    def unreachable(self) -> frozenset[str]: ...


class RouteCounts(Protocol):
    def route_count(self) -> int: ...
    def local_filters(self) -> Sized: ...


class LinkCounts(Protocol):
    @property
    def dropped(self) -> int: ...
    @property
    def sent_batches(self) -> int: ...


class MalformedCount(Protocol):
    @property
    def malformed(self) -> int: ...


class HandoffStatsView(Protocol):
    @property
    def taken(self) -> int: ...
    @property
    def given(self) -> int: ...
    @property
    def failed(self) -> int: ...
    @property
    def superseded(self) -> int: ...
    @property
    def kicked(self) -> int: ...
    @property
    def merged_in(self) -> int: ...
    @property
    def merged_out(self) -> int: ...
    @property
    def durations_ms(self) -> list[float]: ...


class ClaimsView(Protocol):
    @property
    def claims(self) -> Sized: ...


class HandoffCounts(Protocol):
    @property
    def stats(self) -> HandoffStatsView: ...
    @property
    def register(self) -> ClaimsView: ...


class HeldCounts(Protocol):
    @property
    def members(self) -> Sized: ...
    @property
    def held_total(self) -> int: ...
    @property
    def replayed(self) -> int: ...
    @property
    def dropped_full(self) -> int: ...
    @property
    def dropped_aged(self) -> int: ...
    def counts(self) -> Mapping[str, int]: ...


class ClusterCounts(Protocol):
    @property
    def table(self) -> RouteCounts: ...
    @property
    def links(self) -> Mapping[str, LinkCounts]: ...
    @property
    def inbound(self) -> MalformedCount: ...
    @property
    def handoffs(self) -> HandoffCounts: ...
    @property
    def held(self) -> HeldCounts: ...
    @property
    def routes_of_gone_ignored(self) -> int: ...
    @property
    def pulled_snapshot_filters(self) -> int: ...
    @property
    def pulled_delta_changes(self) -> int: ...
    @property
    def forwarded_out(self) -> int: ...
    @property
    def forwarded_in(self) -> int: ...
    @property
    def malformed_items(self) -> int: ...
    @property
    def replay_duplicates(self) -> int: ...


class SecurityCounts(Protocol):
    @property
    def refused_during_netsplit(self) -> Mapping[str, int]: ...
    @property
    def acl_denied(self) -> Mapping[str, int]: ...
    @property
    def limits_hit(self) -> Mapping[str, int]: ...
    def auth_outcomes(self) -> dict[str, int]: ...


class StreamCounts(Protocol):
    """The durable streams (`streams.service.StreamService`)."""

    def part_counts(self) -> Mapping[str, tuple[int, int]]: ...
    @property
    def appended(self) -> int: ...
    @property
    def replays_started(self) -> int: ...
    @property
    def pages_served(self) -> int: ...
    @property
    def trimmed_total(self) -> int: ...


def node_metrics(*, broker: BrokerCounts, store: StoreCounts, gossip: GossipCounts, partitions: PartitionCounts,
                 cluster: ClusterCounts, security: SecurityCounts, uptime: Callable[[], float],
                 streams: StreamCounts | None = None) -> Metrics:
    m = Metrics()
    stats = broker.stats
    m.gauge_callback("meshd_connections", "clients connected now", lambda: broker.client_count())
    m.counter_callback("meshd_connections_total", "client connections accepted", lambda: stats.connections_total)
    m.gauge_callback("meshd_sessions", "sessions held (connected and persistent offline)", lambda: len(broker.sessions))
    m.gauge_callback("meshd_subscriptions", "subscriptions held", lambda: broker.subscription_count())
    m.gauge_callback("meshd_retained_messages", "retained messages held (not counting $SYS)",
                     lambda: retained_counts(broker.retained)[0])
    m.gauge_callback("meshd_sys_retained_messages", "the broker's own $SYS retained messages",
                     lambda: retained_counts(broker.retained)[1])
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
            "reserved_topic": stats.dropped_reserved_topic,
        },
        ("reason",),
    )
    m.counter_callback("meshd_protocol_errors_total", "connections closed for breaking the protocol", lambda: stats.protocol_errors)
    m.gauge_callback("meshd_uptime_seconds", "seconds since the node started", uptime)
    store_stats = store.stats
    m.counter_callback("meshd_store_commits_total", "session store write batches committed (synced unless durability is off)",
                       lambda: store_stats.commits)
    m.counter_callback(
        "meshd_store_records_written_total",
        "session store records written, by kind (delivery_put: a queued or inflight message; a delivery acknowledged before its deadline is never written)",
        lambda: {"delivery_put": store_stats.delivery_puts, "delivery_delete": store_stats.delivery_deletes,
                 "other": store_stats.other_records},
        ("kind",),
    )
    m.gauge_callback(
        "meshd_members", "cluster members by state, as this node sees them",
        lambda: _count_states(gossip.members()), ("state",),
    )
    m.gauge_callback("meshd_partitions", "partitions detected and not yet healed", lambda: len(partitions.detector.active))
    m.gauge_callback("meshd_unreachable_members", "members dead in this node's view that did not leave",
                     lambda: len(partitions.unreachable()))
    m.counter_callback("meshd_partitions_detected_total", "partitions detected", lambda: partitions.detected_total)
    m.counter_callback("meshd_partitions_healed_total", "partitions healed", lambda: partitions.healed_total)
    m.gauge_callback("meshd_routes", "cluster route entries (filter, node) held, this node's included", lambda: cluster.table.route_count())
    m.gauge_callback("meshd_routes_local", "route entries this node owns", lambda: len(cluster.table.local_filters()))
    m.counter_callback("meshd_routes_of_gone_members_ignored_total",
                       "route snapshots, deltas and digest entries of members held dead or left, not taken from peers",
                       lambda: cluster.routes_of_gone_ignored)
    m.counter_callback("meshd_route_pull_snapshot_filters_total",
                       "filters of whole route states (snapshots) pulled from peers",
                       lambda: cluster.pulled_snapshot_filters)
    m.counter_callback("meshd_route_pull_delta_changes_total",
                       "route changes pulled from peers' delta logs (what a gap lacked)",
                       lambda: cluster.pulled_delta_changes)
    m.counter_callback("meshd_forwarded_out_total", "messages forwarded to other nodes", lambda: cluster.forwarded_out)
    m.counter_callback("meshd_forwarded_in_total", "messages received from other nodes", lambda: cluster.forwarded_in)
    m.counter_callback("meshd_forward_batches_total", "batches of forwarded messages sent to other nodes (one frame each)",
                       lambda: sum(link.sent_batches for link in cluster.links.values()))
    m.counter_callback(
        "meshd_mesh_dropped_total", "forwards dropped because a link's send queue was full",
        lambda: sum(link.dropped for link in cluster.links.values()),
    )
    m.counter_callback("meshd_mesh_malformed_total", "malformed mesh frames and items dropped",
                       lambda: cluster.malformed_items + cluster.inbound.malformed)
    m.counter_callback("meshd_gossip_malformed_total", "malformed gossip packets dropped",
                       lambda: gossip.stats.get("malformed", 0))
    m.counter_callback("meshd_gossip_malformed_by_reason_total",
                       "malformed gossip input dropped, by reason (not CBOR, bad envelope, wrong shape, ...)",
                       lambda: dict(gossip.malformed_by_reason), ("reason",))
    m.counter_callback("meshd_gossip_sweeps_total", "probe sweeps started (three or more members suspect at once)",
                       lambda: gossip.stats.get("sweeps", 0))
    m.counter_callback("meshd_gossip_stale_verdicts_total",
                       "dead verdicts made across a split (or by a member not known then), taken as suspicions",
                       lambda: gossip.stats.get("stale_verdicts", 0))
    handoffs = cluster.handoffs
    ho = handoffs.stats
    m.counter_callback(
        "meshd_handoffs_total", "session handoffs and ownership conflicts, by outcome",
        lambda: {"taken": ho.taken, "given": ho.given, "fallback": ho.failed, "superseded": ho.superseded,
                 "kicked": ho.kicked, "merged_in": ho.merged_in, "merged_out": ho.merged_out},
        ("outcome",),
    )
    m.gauge_callback("meshd_handoff_duration_ms", "takeover time (CONNECT to session here) over the last 1000, by quantile",
                     lambda: _quantiles(ho.durations_ms), ("quantile",))
    m.gauge_callback("meshd_session_claims", "client ids in the ownership register (tombstones included)",
                     lambda: len(handoffs.register.claims))
    held = cluster.held
    m.gauge_callback("meshd_held_members", "unreachable members whose routes are held", lambda: len(held.members))
    m.gauge_callback("meshd_held_messages", "messages held for unreachable members", lambda: sum(held.counts().values()))
    m.counter_callback("meshd_held_total", "messages held for unreachable members", lambda: held.held_total)
    m.counter_callback("meshd_held_replayed_total", "held messages replayed to members that came back", lambda: held.replayed)
    m.counter_callback("meshd_held_dropped_total", "held messages dropped, by reason",
                       lambda: {"full": held.dropped_full, "aged": held.dropped_aged}, ("reason",))
    m.counter_callback("meshd_replay_duplicates_total", "replayed messages dropped as already taken",
                       lambda: cluster.replay_duplicates)
    m.counter_callback("meshd_refused_during_netsplit_total", "operations refused while partitioned (allow_*_during_netsplit off)",
                       lambda: dict(security.refused_during_netsplit), ("operation",))
    m.counter_callback(
        "meshd_auth_total", "CONNECT authentication decisions, by outcome",
        security.auth_outcomes, ("outcome",),
    )
    m.counter_callback("meshd_acl_denied_total", "publishes and subscriptions refused by the ACL, by action",
                       lambda: dict(security.acl_denied), ("action",))
    m.counter_callback("meshd_limits_hit_total", "times a limit refused, slowed or queued something, by limit",
                       lambda: {**security.limits_hit, "max_inflight": stats.window_full,
                                "max_queued_messages": stats.dropped_queue_full}, ("limit",))
    if streams is not None:
        _stream_metrics(m, streams)
    return m


def _stream_metrics(m: Metrics, streams: StreamCounts) -> None:
    m.gauge_callback("meshd_stream_messages", "messages this node keeps of each stream (its part)",
                     lambda: {name: c[0] for name, c in streams.part_counts().items()}, ("stream",))
    m.gauge_callback("meshd_stream_bytes", "bytes (keys and records) this node keeps of each stream",
                     lambda: {name: c[1] for name, c in streams.part_counts().items()}, ("stream",))
    m.counter_callback("meshd_stream_appended_total", "messages published through this node kept in a stream",
                       lambda: streams.appended)
    m.counter_callback("meshd_stream_trimmed_total", "stream messages retention removed on this node",
                       lambda: streams.trimmed_total)
    m.counter_callback("meshd_stream_replays_total", "replay subscriptions started on this node",
                       lambda: streams.replays_started)
    m.counter_callback("meshd_stream_pages_served_total", "pages of this node's stream parts read by replays",
                       lambda: streams.pages_served)


def _count_states(members: list[MemberInfo]) -> dict[str, int]:
    out = {"alive": 0, "suspect": 0, "dead": 0, "left": 0}
    for member in members:
        out[member["state"]] = out.get(member["state"], 0) + 1
    return out


def _quantiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)
    return {q: round(ordered[min(len(ordered) - 1, int(float(q) * len(ordered)))], 3) for q in ("0.5", "0.99")}
