"""The scenarios, in one table. Adding one is adding an entry to `SCENARIOS`.

A scenario has a name, a one-line description, the metrics the summary table shows
(each with whether higher is better) and `run(port, broker_pid, quick)`, which drives
the load generator against a freshly started broker and returns a dict of measurements
(the JSON line of that run holds all of them, not only the shown ones).

A scenario that needs its own meshd processes (other flags, a fresh data dir per
measurement, two nodes) sets `own_brokers(workdir, quick)` instead: it runs for meshd
only, starts and stops what it needs itself and reports meshd against meshd (issue 3:
persistent/clean sessions in `persistence.py`; issue 6: two nodes/one in `cluster.py`).
"""

from __future__ import annotations

import resource

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import cluster
import loadgen
import persistence
import rules

RunFn = Callable[[int, int, bool], dict[str, Any]]  # (port, broker pid, quick) -> measurements


@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    higher_is_better: bool | None  # None: a setting shown for reference (no arrow)
    fmt: str = "{:,.0f}"


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    run: RunFn | None
    metrics: tuple[Metric, ...]
    # the metric of the target ratio: "meshd must beat amqtt by 3x" on this one
    headline: str = "msgs_per_s"
    tags: tuple[str, ...] = field(default=())
    # meshd-only scenarios that start their own nodes: (scratch dir, quick) -> measurements
    own_brokers: Callable[[Path, bool], dict[str, Any]] | None = None


THROUGHPUT_METRICS = (
    Metric("msgs_per_s", "delivered msg/s", True),
    Metric("msgs_per_cpu_s", "delivered msg per broker CPU-second", True),
    Metric("lost", "lost", False),
    Metric("cpu_us_per_msg", "broker CPU µs/msg", False, "{:.1f}"),
    Metric("broker_cpu_pct", "broker CPU %", False),
    Metric("gen_cpu_pct", "generator CPU %", False),
)
LATENCY_METRICS = (
    Metric("p50_us", "p50 µs", False),
    Metric("p99_us", "p99 µs", False),
    Metric("max_us", "max µs", False),
    Metric("lost", "lost", False),
)
IDLE_METRICS = (
    Metric("connects_per_s", "connects/s", True),
    Metric("kb_per_conn", "KB per idle connection", False, "{:.2f}"),
    Metric("connected", "connected", True),
    Metric("cpu_us_per_connect", "broker CPU µs per connect", False, "{:.0f}"),
    Metric("broker_cpu_pct", "broker CPU % while connecting", False),
    Metric("gen_cpu_pct", "generator CPU % while connecting", False),
)


# run.py --smoke: every scenario as a short check that it works (a fraction of a second
# of load, 200 idle connections); its figures mean nothing.
SMOKE = False
SMOKE_IDLE_CONNECTIONS = 200


# idle-50000 adds these (idle-5000 keeps the rows its older results were tabled with):
# the node's resident memory next to the other brokers', and how many clients the file
# limit let the run ask for.
IDLE_SCALE_METRICS = IDLE_METRICS + (
    Metric("rss_after_kb", "broker RSS with every client connected, KB", False, "{:,.0f}"),
    Metric("requested", "connections asked for (capped by the file limit)", None),
)


def _duration(quick: bool) -> float:
    if SMOKE:
        return 0.3
    return 2.0 if quick else 4.0


# Lag windows (messages the slowest subscriber may be behind): QoS 1 stays under the
# brokers' per-session queue limits (meshd 1000; amqtt and our Mosquitto config have none);
# QoS 0 gets more room to ride out scheduling stalls on a shared machine.
QOS0_WINDOW = 5000
QOS1_WINDOW = 500
FANOUT_WINDOW = 1000  # x 100 subscribers = 100,000 deliveries in flight at most


def _throughput(publishers: int, subscribers: int, qos: int, topics: str = "one", window: int | None = None) -> RunFn:
    def run(port: int, pid: int, quick: bool) -> dict[str, Any]:
        return loadgen.throughput(port, pid, publishers=publishers, subscribers=subscribers, qos=qos,
                                  topics=topics, duration=_duration(quick),
                                  window=window or (QOS1_WINDOW if qos else QOS0_WINDOW))
    return run


def _latency(qos: int) -> RunFn:
    def run(port: int, pid: int, quick: bool) -> dict[str, Any]:
        return loadgen.latency(port, pid, qos=qos, rate=2000.0, duration=_duration(quick), **_SMOKE_LATENCY if SMOKE else {})
    return run


_SMOKE_LATENCY: dict[str, Any] = {"warmup": 0.1, "drain_s": 0.5}
FD_MARGIN = 500  # descriptors the broker and the generator need besides the clients' sockets


def _idle(count: int) -> RunFn:
    def run(port: int, pid: int, quick: bool) -> dict[str, Any]:
        if SMOKE:
            return loadgen.idle_connections(port, pid, count=SMOKE_IDLE_CONNECTIONS, timeout=10.0, settle=0.1)
        # As many as the file limit lets both ends hold (brokers.raise_fd_limit could not
        # raise it: no CAP_SYS_RESOURCE), recorded as `requested`, and the limit with it.
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        n = min(count, limit - FD_MARGIN)
        result = loadgen.idle_connections(port, pid, count=n, timeout=(30.0 if quick else 60.0) * max(1, n // 5000))
        if n < count:
            result["fd_limit"] = limit
        return result
    return run

PERSIST_METRICS = (
    Metric("batch_ms", "batch window ms (— in sync mode)", None, "{:.0f}"),
    Metric("online_persistent_msgs_per_s", "online, persistent: delivered msg/s", True),
    Metric("online_clean_msgs_per_s", "online, clean: delivered msg/s", True),
    Metric("online_ratio", "online persistent/clean (msg/s)", True, "{:.2f}"),
    Metric("online_persistent.cpu_us_per_msg", "online, persistent: broker CPU µs/msg", False, "{:.1f}"),
    Metric("online_clean.cpu_us_per_msg", "online, clean: broker CPU µs/msg", False, "{:.1f}"),
    Metric("online_cpu_ratio", "online persistent/clean (msg per broker CPU-s)", True, "{:.2f}"),
    Metric("online_persistent.records_written_per_msg", "online, persistent: delivery records written per message", False, "{:.2f}"),
    Metric("online_persistent.broker_cpu_pct", "online, persistent: broker CPU %", False),
    Metric("online_clean.broker_cpu_pct", "online, clean: broker CPU %", False),
    Metric("offline_persistent_publish_per_s", "offline, persistent: publish msg/s (to last PUBACK)", True),
    Metric("offline_clean_publish_per_s", "offline, clean: publish msg/s (nothing kept)", True),
    Metric("publish_ratio", "offline publish persistent/clean", True, "{:.2f}"),
    Metric("offline_persistent.publish_cpu_us_per_msg", "offline, persistent: broker CPU µs/msg published", False, "{:.1f}"),
    Metric("offline_clean.publish_cpu_us_per_msg", "offline, clean: broker CPU µs/msg published", False, "{:.1f}"),
    Metric("drain_per_s", "drain msg/s (reconnect to last message)", True),
    Metric("drain_ratio", "drain / online clean msg/s", True, "{:.2f}"),
    Metric("offline_persistent.drain_cpu_us_per_msg", "drain: broker CPU µs/msg", False, "{:.1f}"),
    Metric("restart_drain_per_s", "after kill -9 and restart: drain msg/s", True),
    Metric("restart_lost", "after kill -9 and restart: lost", False),
    Metric("lost", "lost (all runs)", False),
    Metric("puback_missing", "PUBACKs missing", False),
)
RULE_METRICS = (
    Metric("plain_msgs_per_s", "no rule: delivered msg/s", True),
    Metric("rule_msgs_per_s", "one rule: delivered msg/s", True),
    Metric("ratio", "rule / no rule (msg/s)", True, "{:.2f}"),
    Metric("plain_cpu_us_per_msg", "no rule: broker CPU µs/msg", False, "{:.1f}"),
    Metric("rule_cpu_us_per_msg", "one rule: broker CPU µs/msg", False, "{:.1f}"),
    Metric("cpu_ratio", "rule / no rule (CPU µs/msg)", False, "{:.2f}"),
    Metric("lost", "lost", False),
)
CROSS_METRICS = (
    Metric("single_msgs_per_s", "one node: delivered msg/s", True),
    Metric("cross_msgs_per_s", "A→B: delivered msg/s", True),
    Metric("ratio", "A→B / one node (msg/s)", True, "{:.2f}"),
    Metric("single_cpu_us_per_msg", "one node: broker CPU µs/msg", False, "{:.1f}"),
    Metric("cross_cpu_us_per_msg", "A→B: CPU µs/msg (all nodes)", False, "{:.1f}"),
    Metric("cpu_ratio", "A→B / one node (msg per CPU-s)", True, "{:.2f}"),
    Metric("single.broker_cpu_pct", "one node: broker CPU %", False),
    Metric("cross.broker_cpu_pct", "A→B: CPU % (all nodes)", False),
    Metric("lost", "lost (A→B)", False),
    Metric("puback_missing", "PUBACKs missing (A→B)", False),
)


def _persist(durability: str) -> Callable[[Path, bool], dict[str, Any]]:
    return lambda workdir, quick: persistence.run(workdir, quick, durability)


def _cross(qos: int) -> Callable[[Path, bool], dict[str, Any]]:
    return lambda workdir, quick: cluster.run(workdir, quick, qos)


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("fanin-qos0", "fan-in 10→1, QoS 0 (10 topics, one bench/in/+ subscriber)",
             _throughput(10, 1, 0, "per-publisher"), THROUGHPUT_METRICS, tags=("throughput",)),
    Scenario("fanin-qos1", "fan-in 10→1, QoS 1 (10 topics, one bench/in/+ subscriber)",
             _throughput(10, 1, 1, "per-publisher"), THROUGHPUT_METRICS, tags=("throughput",)),
    Scenario("5to5-qos0", "5 publishers → 5 subscribers on one topic, QoS 0",
             _throughput(5, 5, 0), THROUGHPUT_METRICS, tags=("throughput",)),
    Scenario("5to5-qos1", "5 publishers → 5 subscribers on one topic, QoS 1",
             _throughput(5, 5, 1), THROUGHPUT_METRICS, tags=("throughput",)),
    Scenario("fanout-qos0", "fan-out 1→100 on one topic, QoS 0",
             _throughput(1, 100, 0, window=FANOUT_WINDOW), THROUGHPUT_METRICS, tags=("throughput",)),
    Scenario("latency-qos0", "latency at 2,000 msg/s, 1→1, QoS 0",
             _latency(0), LATENCY_METRICS, headline="p99_us", tags=("latency",)),
    Scenario("latency-qos1", "latency at 2,000 msg/s, 1→1, QoS 1",
             _latency(1), LATENCY_METRICS, headline="p99_us", tags=("latency",)),
    Scenario("idle-5000", "5,000 idle connections (CONNECT, keep alive 0, 200 handshaking at once)",
             _idle(5000), IDLE_METRICS, headline="connects_per_s", tags=("connections",)),
    Scenario("idle-50000", "50,000 idle connections (as idle-5000; clients from 127.0.0.2-4, file limit raised; "
             "fewer where the hard limit stays lower: see `requested`, `fd_limit`)",
             _idle(50000), IDLE_SCALE_METRICS, headline="connects_per_s", tags=("connections",)),
    Scenario("persist-sync", "fan-in 10→1 QoS 1, persistent vs clean session, --durability sync",
             None, PERSIST_METRICS, headline="online_ratio", tags=("persistence",), own_brokers=_persist("sync")),
    Scenario("persist-batch", "fan-in 10→1 QoS 1, persistent vs clean session, --durability batch (window: run.py --durability-batch-ms, default 50 ms as meshd's)",
             None, PERSIST_METRICS, headline="online_ratio", tags=("persistence",), own_brokers=_persist("batch")),
    Scenario("cross-qos0", "fan-in 10→1 QoS 0, publishers on node A, subscriber on node B (3 nodes), vs one node",
             None, CROSS_METRICS, headline="ratio", tags=("cluster",), own_brokers=_cross(0)),
    Scenario("cross-qos1", "fan-in 10→1 QoS 1, publishers on node A, subscriber on node B (3 nodes), vs one node",
             None, CROSS_METRICS, headline="ratio", tags=("cluster",), own_brokers=_cross(1)),
    Scenario("rule-qos0", "fan-in 10→1 QoS 0, JSON payloads, with one rule (3-field SELECT, WHERE on the payload) vs none",
             None, RULE_METRICS, headline="ratio", tags=("rules",), own_brokers=rules.run_rule_scenario),
)}
