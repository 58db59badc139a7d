#!/usr/bin/env python3
"""The cluster route table at a million routes (issue 27), in one process.

    python scripts/bench/route_scale.py                       # 1,000,000 routes over 10 nodes
    python scripts/bench/route_scale.py --routes 20000 --smoke

A table as one node of a 10-node cluster holds it: its own routes and the other nine
nodes' (`routing.table.RouteTable`, the trie behind every publish's lookup), built
from `RouteSnapshot`s as route sync builds it. Each node has routes/nodes distinct
filters; one in five is a wildcard (`+` in the last level, `+` in the middle, `#`).
Measured (CPU seconds of this process, `time.process_time`):

- memory: the process's resident memory before and after building the table (the
  filters' strings included: the table holds them), per route;
- lookup: `RouteTable.match_nodes` per publish, for topics that each match at least
  one route (drawn from the table's own filters), at this size and at 1,000 routes
  built the same way: the trie walk (a topic the per-topic memo does not hold), and
  over 10 topics (the memo's case: a fan-in);
- a new node's pull of the whole table: what route sync does when an empty node asks
  a member for everything (`routes_req` with an empty digest, answered in parts of
  `ROUTES_REPLY_FILTERS` filters): the member's snapshots, the frames encoded and
  decoded as the mesh link does, and the new node's staged snapshots settled a slice
  of `ROUTE_SLICE` filters at a time as the cluster does (the heap frozen out of the
  cyclic collector's full passes after each), without the network
  (`route_convergence.py --join` measures it between real processes); the longest
  slice's CPU is what a node's event loop is held for at most while it applies them.

One JSON line goes to scripts/bench/results/route_scale.jsonl, and the summary to stdout.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from gossip import wire  # noqa: E402
from routing.cluster import ROUTE_SLICE, ROUTES_REPLY_FILTERS  # noqa: E402
from routing.table import RouteSnapshot, RouteTable, digest_to_wire, digest_from_wire  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def node_filters(node: int, count: int) -> list[str]:
    """`count` distinct filters of node `node`: 80 % exact, 20 % wildcards."""
    out = []
    for i in range(count):
        site, dev = i % 1000, i // 1000 * 16 + node
        shape = i % 20
        if shape == 0:
            out.append(f"fleet/{site}/dev/{dev}/+")
        elif shape == 1:
            out.append(f"fleet/{site}/+/{dev}/temp")
        elif shape == 2:
            out.append(f"fleet/{site}/dev/{dev}/#")
        elif shape == 3:
            out.append(f"fleet/+/dev/{dev}/alarm/{site}")
        else:
            out.append(f"fleet/{site}/dev/{dev}/m{shape}")
    return out


def topic_of(topic_filter: str) -> str:
    return topic_filter.replace("+", "dev").replace("#", "temp/1")


def build(routes: int, nodes: int) -> tuple[RouteTable, list[str]]:
    """The table of node 0 (routes/nodes of its own, the rest from 9 snapshots)."""
    per_node = routes // nodes
    table = RouteTable("n0", 1)
    for f in node_filters(0, per_node):
        table.add_local(f)
    sample: list[str] = []
    for n in range(1, nodes):
        filters = node_filters(n, per_node)
        sample.extend(filters[:: max(1, per_node // 2000)])
        table.apply_snapshot(RouteSnapshot(f"n{n}", 1, per_node, frozenset(filters)))
    return table, sample


def rss_kb() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() // 1024


def cpu_per_call(fn: Any, args: list[Any], min_s: float = 0.5) -> float:
    """CPU µs per call of fn over args (cycled until at least min_s of CPU)."""
    calls = 0
    t0 = time.process_time()
    while True:
        for a in args:
            fn(a)
        calls += len(args)
        spent = time.process_time() - t0
        if spent >= min_s:
            return spent / calls * 1e6


def lookups(table: RouteTable, sample: list[str], rng: random.Random) -> dict[str, float]:
    topics = [topic_of(f) for f in sample]
    rng.shuffle(topics)
    assert all(table.match_nodes(t) for t in topics[:100])
    trie = table.trie

    def walk_once(topic: str) -> frozenset[str]:  # what `match_nodes` does for a topic it does not remember
        return frozenset(trie.match(topic))

    walk = cpu_per_call(walk_once, topics)
    memo = cpu_per_call(table.match_nodes, topics[:10])
    matched = sum(len(table.trie.match(t)) for t in topics[:1000]) / min(1000, len(topics))
    return {"lookup_us": walk, "lookup_memo_us": memo, "routes_matched_per_topic": matched}


def pull_whole_table(holder: RouteTable) -> dict[str, float]:
    """An empty node pulls everything from `holder` in parts, as route sync does."""
    new = RouteTable("new", 1)
    frames = nbytes = 0
    longest_slice = 0.0
    t0 = time.process_time()
    while True:
        request = digest_from_wire(digest_to_wire(new.pull_digest()))
        snaps, more = holder.snapshots_newer_than(request, ROUTES_REPLY_FILTERS)
        body = wire.encode_frame_body("routes", "n0", {"snaps": [s.to_wire() for s in snaps], **({"more": True} if more else {})})
        framed = wire.frame(body)  # raises past MAX_FRAME, as the link would
        frames += 1
        nbytes += len(framed)
        reply = wire.decode_frame_body(framed[4:])
        for snap in reply["snaps"]:
            new.stage_snapshot(RouteSnapshot.from_wire(snap))
        while True:
            s0 = time.process_time()
            more = new.settle(ROUTE_SLICE)
            gc.freeze()  # as the cluster's settle task does after each slice
            longest_slice = max(longest_slice, time.process_time() - s0)
            if not more:
                break
        if not reply.get("more"):
            break
    spent = time.process_time() - t0
    assert new.route_count() == holder.route_count(), (new.route_count(), holder.route_count())
    assert len(new.trie) == len(holder.trie) + len(holder.local_filters())
    return {"pull_cpu_s": spent, "pull_frames": frames, "pull_bytes": nbytes,
            "pull_longest_slice_ms": longest_slice * 1000}


def measure(routes: int, nodes: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    gc.collect()
    before = rss_kb()
    t0 = time.process_time()
    table, sample = build(routes, nodes)
    build_s = time.process_time() - t0
    gc.collect()
    after = rss_kb()
    held = table.route_count()
    out: dict[str, Any] = {
        "routes": held, "nodes": nodes, "build_cpu_s": round(build_s, 2), "rss_before_kb": before,
        "rss_after_kb": after, "bytes_per_route": round((after - before) * 1024 / held, 1),
        "trie_nodes": table.trie.node_count(),
    }
    small, small_sample = build(1000, nodes)
    out.update({f"big_{k}": v for k, v in lookups(table, sample, rng).items()})
    out.update({f"small_{k}": v for k, v in lookups(small, small_sample, rng).items()})
    out["lookup_ratio"] = out["big_lookup_us"] / out["small_lookup_us"]
    out.update(pull_whole_table(table))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--routes", type=int, default=1_000_000)
    p.add_argument("--nodes", type=int, default=10)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--smoke", action="store_true", help="write nothing under results/ (CI: that it runs)")
    args = p.parse_args(argv)
    res = measure(args.routes, args.nodes, args.seed)
    res["ts"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    res["commit"] = _commit()
    with open("/proc/loadavg") as f:
        res["loadavg"] = float(f.read().split()[0])
    line = json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in res.items()})
    if not args.smoke:
        RESULTS.mkdir(exist_ok=True)
        with open(RESULTS / "route_scale.jsonl", "a") as f:
            f.write(line + "\n")
    print(line)
    print(f"{res['routes']:,} routes: {res['bytes_per_route']:.0f} bytes per route ({res['rss_after_kb'] - res['rss_before_kb']:,} KB); "
          f"lookup {res['big_lookup_us']:.2f} us vs {res['small_lookup_us']:.2f} us at {1000:,} routes "
          f"({res['lookup_ratio']:.2f}x; memo {res['big_lookup_memo_us']:.2f} us); "
          f"whole table to a new node: {res['pull_cpu_s']:.1f} s CPU, {res['pull_frames']} frames, {res['pull_bytes'] / 1e6:.1f} MB, "
          f"longest slice {res['pull_longest_slice_ms']:.1f} ms CPU")
    return 0 if res["lookup_ratio"] <= 2.0 or args.smoke else 1


def _commit() -> str:
    out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip() or "?"


if __name__ == "__main__":
    raise SystemExit(main())
