"""The scenarios, in one table. Adding one is adding an entry to `SCENARIOS`.

A scenario has a name, a one-line description, the metrics the summary table shows
(each with whether higher is better) and `run(port, broker_pid, quick)`, which drives
the load generator against a freshly started broker and returns a dict of measurements
(the JSON line of that run holds all of them, not only the shown ones).

Issue 3 (RocksDB persistence) and issue 6 (cross-node throughput) will add entries
here: a persistent-session QoS 1 run needs only other client flags; a cross-node run
needs a `brokers` hook that starts two nodes and returns both ports.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import loadgen


@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    higher_is_better: bool
    fmt: str = "{:,.0f}"


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    run: Callable[[int, int, bool], dict[str, Any]]
    metrics: tuple[Metric, ...]
    # the metric of the target ratio: "meshd must beat amqtt by 3x" on this one
    headline: str = "msgs_per_s"
    tags: tuple[str, ...] = field(default=())


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
)


def _duration(quick: bool) -> float:
    return 2.0 if quick else 4.0


# Lag windows (messages the slowest subscriber may be behind): QoS 1 stays under the
# brokers' per-session queue limits (meshd 1000; amqtt and our Mosquitto config have none);
# QoS 0 gets more room to ride out scheduling stalls on a shared machine.
QOS0_WINDOW = 5000
QOS1_WINDOW = 500
FANOUT_WINDOW = 1000  # x 100 subscribers = 100,000 deliveries in flight at most


def _throughput(publishers: int, subscribers: int, qos: int, topics: str = "one", window: int | None = None):  # type: ignore[no-untyped-def]
    def run(port: int, pid: int, quick: bool) -> dict[str, Any]:
        return loadgen.throughput(port, pid, publishers=publishers, subscribers=subscribers, qos=qos,
                                  topics=topics, duration=_duration(quick),
                                  window=window or (QOS1_WINDOW if qos else QOS0_WINDOW))
    return run


def _latency(qos: int):  # type: ignore[no-untyped-def]
    def run(port: int, pid: int, quick: bool) -> dict[str, Any]:
        return loadgen.latency(port, pid, qos=qos, rate=2000.0, duration=_duration(quick))
    return run


def _idle(port: int, pid: int, quick: bool) -> dict[str, Any]:
    return loadgen.idle_connections(port, pid, count=5000, timeout=30.0 if quick else 60.0)


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
             _idle, IDLE_METRICS, headline="connects_per_s", tags=("connections",)),
)}
