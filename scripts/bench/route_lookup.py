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
Prints one JSON line (with the load average) and the two ratios.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
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
    runs: dict[str, list[float]] = {k: [] for k in ("index_big", "index_small", "trie_big", "trie_small")}
    for _ in range(args.reps):
        runs["index_big"].append(cpu_per_call(lookup(big.trie), big_topics))
        runs["index_small"].append(cpu_per_call(lookup(small.trie), small_topics))
        runs["trie_big"].append(cpu_per_call(lookup(big_trie), big_topics))
        runs["trie_small"].append(cpu_per_call(lookup(small_trie), small_topics))
    best = {k: min(v) for k, v in runs.items()}
    with open("/proc/loadavg") as f:
        load = float(f.read().split()[0])
    out = {"routes": args.routes, "compiled": native.status().compiled, **{f"{k}_us": round(v, 3) for k, v in best.items()},
           "index_ratio": round(best["index_big"] / best["index_small"], 2),
           "trie_ratio": round(best["trie_big"] / best["trie_small"], 2),
           "runs_us": {k: [round(x, 3) for x in v] for k, v in runs.items()}, "loadavg": load}
    print(json.dumps(out))
    print(f"TopicIndex: {best['index_big']:.2f} vs {best['index_small']:.2f} us ({out['index_ratio']}x); "
          f"TopicTrie: {best['trie_big']:.2f} vs {best['trie_small']:.2f} us ({out['trie_ratio']}x); load {load}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
