"""Issue 6: throughput across two meshd nodes against the same load on one node.

`run(workdir, quick, qos)` measures the fan-in (10 publishers on bench/in/NNN -> 1
subscriber on bench/in/+) twice, each on fresh processes and data dirs:

- single: one meshd, everything connected to it (the `fanin-qos*` scenario);
- cross: a 3-node cluster on 127.0.0.1 (A, B and an idle member C), publishers on node
  A, the subscriber on node B, so every message is forwarded over A's mesh link to B.
  Before publishing it waits until A's /api/v1/members shows every node alive and,
  after the subscription on B, until A's /api/v1/routes lists the filter with node B.

Every node is pinned to the broker core like the single node: the cluster gets the
same CPU budget, so the ratio is the cost of forwarding, not the gain of a second core.
Broker CPU is summed over all nodes (C's gossip included).
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import brokers
import loadgen

PUBLISHERS = 10
SUB_FILTER = "bench/in/+"
WINDOW = {0: 5000, 1: 500}
READY_TIMEOUT = 20.0


def node_flags(node_id: str, http: int, gossip: int, seed: int | None) -> list[str]:
    flags = ["--node-id", node_id, "--http", f"127.0.0.1:{http}", "--gossip", f"127.0.0.1:{gossip}",
             "--gossip-preset", "local"]
    return flags + (["--seed", f"127.0.0.1:{seed}"] if seed else [])


def start_pair(workdir: Path, pin: bool = True) -> tuple[brokers.RunningBroker, brokers.RunningBroker, int]:
    """Nodes A and B (B seeded with A), both alive in A's view; returns them and A's HTTP port."""
    (a, b), http_a = start_nodes(workdir, ("A", "B"), pin)
    return a, b, http_a


def start_nodes(workdir: Path, names: tuple[str, ...], pin: bool = True) -> tuple[list[brokers.RunningBroker], int]:
    """The first node, then the others seeded with it, all alive in the first's view;
    returns them and the first's HTTP port."""
    meshd = brokers.BROKERS["meshd"]
    http_a, gossip_a = brokers.free_port(), brokers.free_port()
    nodes = [brokers.start(meshd, workdir / names[0], pin=pin, extra=node_flags(names[0], http_a, gossip_a, None))]
    try:
        for name in names[1:]:
            nodes.append(brokers.start(meshd, workdir / name, pin=pin,
                                       extra=node_flags(name, brokers.free_port(), brokers.free_port(), gossip_a)))
        wait_for(lambda: _alive(http_a) >= set(names), "every member alive on " + names[0])
    except BaseException:
        for node in reversed(nodes):
            node.stop()
        raise
    return nodes, http_a


def _get(http: int, path: str) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{http}{path}", timeout=2.0) as r:
        return json.load(r)


def _alive(http: int) -> set[str]:
    return {m["id"] for m in _get(http, "/api/v1/members")["members"] if m["state"] == "alive"}


def _route_to(http: int, topic_filter: str, node: str) -> bool:
    return any(r["filter"] == topic_filter and node in r["nodes"] for r in _get(http, "/api/v1/routes")["routes"])


def wait_for_route(http: int, node: str, topic_filter: str = SUB_FILTER) -> float:
    """Until node `http`'s route table sends `topic_filter` to `node`; the seconds it took."""
    return wait_for(lambda: _route_to(http, topic_filter, node), f"the route {topic_filter} -> {node}")


def wait_for(check: Any, what: str, timeout: float = READY_TIMEOUT) -> float:
    """Poll `check()` every 20 ms until true; return the seconds it took."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            if check():
                return time.monotonic() - t0
        except OSError:
            pass  # the API may not listen yet
        time.sleep(0.02)
    raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")


def run(workdir: Path, quick: bool, qos: int) -> dict[str, Any]:
    duration = 2.0 if quick else 4.0
    args = dict(publishers=PUBLISHERS, subscribers=1, qos=qos, topics="per-publisher",
                duration=duration, window=WINDOW[qos])
    out: dict[str, Any] = {}
    single = brokers.start(brokers.BROKERS["meshd"], workdir / "single")
    try:
        out["single"] = loadgen.throughput(single.port, single.pid, tag="s", **args)
        if not single.alive():
            raise RuntimeError("the single node exited during the run")
    finally:
        single.stop()
    nodes, http_a = start_nodes(workdir / "cluster", ("A", "B", "C"))
    a, b = nodes[0], nodes[1]
    try:
        # subscribe on B first (throughput opens subscribers first), then wait for the route
        out["cross"] = loadgen.throughput(a.port, [n.pid for n in nodes], sub_port=b.port, tag="x",
                                          before_publish=lambda: wait_for_route(http_a, "B"), **args)
        if not all(n.alive() for n in nodes):
            raise RuntimeError("a node exited during the run")
    finally:
        for n in reversed(nodes):
            n.stop()
    out["cluster_nodes"] = len(nodes)
    for k in ("msgs_per_s", "msgs_per_cpu_s", "cpu_us_per_msg"):
        out[f"single_{k}"] = out["single"][k]
        out[f"cross_{k}"] = out["cross"][k]
    out["ratio"] = _ratio(out["cross_msgs_per_s"], out["single_msgs_per_s"])
    out["cpu_ratio"] = _ratio(out["cross_msgs_per_cpu_s"], out["single_msgs_per_cpu_s"])
    out["lost"] = out["cross"]["lost"]
    out["single_lost"] = out["single"]["lost"]
    out["puback_missing"] = out["cross"]["puback_missing"]
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None
