#!/usr/bin/env python3
"""New-topic route lookup at 1,000,000 and 1,000 routes, two structures side by side.

    python scripts/bench/route_lookup.py                 # 1,000,000 vs 1,000 routes
    python scripts/bench/route_lookup.py --routes 20000  # quicker

The route table of node 0 of a 10-node mesh, built as `route_scale.py` builds it (the
same filters, wildcards included), and the same routes in a `routing.trie.TopicTrie`
(the structure the table used before `routing.topic_index.TopicIndex`). Per lookup:
CPU µs of `frozenset(index.match(topic))`, what `RouteTable.match_nodes` does for a
topic its memo does not hold, over topics drawn from the table's own filters; best of
`--reps` passes, the four measurements interleaved in each pass so load hits them alike.
Measured twice: right after the build, and once the kernel's khugepaged has moved the
index's big slot vector onto the 2 MB pages `routing.huge_pages` asked for (a node's
steady state a minute after its table last grew; `--wait-huge 0` skips it).
Prints one JSON line (with the load average) and the ratios.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts" / "bench"))

import native  # noqa: E402
from route_scale import build, cpu_per_call, topic_of  # noqa: E402
from routing.table import RouteTable  # noqa: E402
from routing.trie import TopicTrie  # noqa: E402


def as_trie(table: RouteTable) -> TopicTrie[str]:
    trie: TopicTrie[str] = TopicTrie()
    for origin, state in table.remote.items():
        for f in state.filters:
            trie.add(f, origin)
    return trie


def lookup(index: Any) -> Callable[[str], frozenset[str]]:
    def once(topic: str) -> frozenset[str]:
        return frozenset(index.match(topic))
    return once


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--routes", type=int, default=1_000_000)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--wait-huge", type=float, default=120.0, help="seconds to wait for the 2 MB pages (0: do not)")
    args = p.parse_args(argv)
    rng = random.Random(args.seed)
    big, big_sample = build(args.routes, 10)
    small, small_sample = build(1000, 10)
    big_trie, small_trie = as_trie(big), as_trie(small)
    gc.collect()
    gc.freeze()
    big_topics = [topic_of(f) for f in big_sample]
    small_topics = [topic_of(f) for f in small_sample]
    rng.shuffle(big_topics)
    rng.shuffle(small_topics)
    for t in big_topics[:2000]:
        assert sorted(big.trie.match(t)) == sorted(big_trie.match(t)), t
    out: dict[str, Any] = {"routes": args.routes, "compiled": native.status().compiled}
    out.update(measure(big, small, big_trie, small_trie, big_topics, small_topics, args.reps, ""))
    if args.wait_huge > 0:
        slots = 8 * len(getattr(big.trie, "_slots", ()))
        deadline = time.monotonic() + args.wait_huge
        while huge_kb() * 1024 < 0.9 * slots and time.monotonic() < deadline:
            time.sleep(2)
        out["huge_kb"], out["slot_kb"] = huge_kb(), slots // 1024
        out.update(measure(big, small, big_trie, small_trie, big_topics, small_topics, args.reps, "huge_"))
    with open("/proc/loadavg") as f:
        out["loadavg"] = float(f.read().split()[0])
    print(json.dumps(out))
    for prefix in ("", "huge_"):
        if f"{prefix}index_ratio" in out:
            print(f"{'on 2 MB pages: ' if prefix else 'right after the build: '}TopicIndex {out[prefix + 'index_big_us']} vs "
                  f"{out[prefix + 'index_small_us']} us ({out[prefix + 'index_ratio']}x); TopicTrie "
                  f"{out[prefix + 'trie_big_us']} vs {out[prefix + 'trie_small_us']} us ({out[prefix + 'trie_ratio']}x)")
    return 0


def huge_kb() -> int:
    with open("/proc/self/smaps_rollup") as f:
        return sum(int(line.split()[1]) for line in f if line.startswith("AnonHugePages:"))


def measure(big: RouteTable, small: RouteTable, big_trie: TopicTrie[str], small_trie: TopicTrie[str],
            big_topics: list[str], small_topics: list[str], reps: int, prefix: str) -> dict[str, Any]:
    runs: dict[str, list[float]] = {k: [] for k in ("index_big", "index_small", "trie_big", "trie_small")}
    for _ in range(reps):
        runs["index_big"].append(cpu_per_call(lookup(big.trie), big_topics))
        runs["index_small"].append(cpu_per_call(lookup(small.trie), small_topics))
        runs["trie_big"].append(cpu_per_call(lookup(big_trie), big_topics))
        runs["trie_small"].append(cpu_per_call(lookup(small_trie), small_topics))
    best = {k: min(v) for k, v in runs.items()}
    out: dict[str, Any] = {f"{prefix}{k}_us": round(v, 3) for k, v in best.items()}
    out[f"{prefix}index_ratio"] = round(best["index_big"] / best["index_small"], 2)
    out[f"{prefix}trie_ratio"] = round(best["trie_big"] / best["trie_small"], 2)
    out[f"{prefix}runs_us"] = {k: [round(x, 3) for x in v] for k, v in runs.items()}
    return out


if __name__ == "__main__":
    raise SystemExit(main())
