#!/usr/bin/env python3
"""Synthetic gossip traces for `meshd report`: many nodes, many events, known answers.

    python scripts/bench/gen_traces.py OUT_DIR --nodes 1000 --rows 10000000

Writes ``OUT_DIR/<node>.jsonl`` in the trace contract (gossip/trace.py, compact JSON
like TraceWriter) and ``OUT_DIR/../expected.json`` with the dissemination answers computed
here from the same random draws, so a report can be checked against the truth.

Shape: every node starts at 0; events (broadcast, route_add, route_del, config_set)
come from random origins at a steady rate and reach each alive node after a
gamma-distributed delay growing with the hop count; a small share of deliveries is
lost. A few nodes crash (``node_crash``, sim) and are suspected, then declared dead,
with those membership updates gossiped like any event; a few live nodes are falsely
declared dead and refute; one node detects and heals a partition. Live nodes stop at
the end.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

S = 1_000_000
KINDS = ("broadcast", "route_add", "route_del", "config_set")


def _line(ts: int, node: str, kind: str, subject: str, origin: str, ots: int, eid: str, hops: int) -> str:
    return (
        f'{{"ts_us":{ts},"node":"{node}","kind":"{kind}","subject":"{subject}","origin":"{origin}",'
        f'"origin_ts_us":{ots},"event_id":"{eid}","hops":{hops},"incarnation":null,"sim":true}}\n'
    )


def _nearest_rank(delays_us: np.ndarray, alive: int, bp: int) -> float | None:
    rank = (bp * alive + 9999) // 10000
    if rank > len(delays_us):
        return None
    return float(np.sort(delays_us)[rank - 1]) / S


def generate(out: Path, nodes: int, rows: int, seed: int = 1, crashes: int = 5,
             false_positives: int = 3, loss: float = 0.0005) -> dict:
    """Write the trace set; return the expected answers."""
    rng = np.random.default_rng(seed)
    out.mkdir(parents=True, exist_ok=True)
    names = [f"n{i:04d}" for i in range(nodes)]
    files = [open(out / f"{n}.jsonl", "w", encoding="utf-8") for n in names]
    buffers: list[list[str]] = [[] for _ in names]
    events_wanted = max(1, rows // nodes)
    interval_us = 100_000  # one event every 100 ms
    end_us = (events_wanted + 50) * interval_us
    crash_at = {int(i): int(t) for i, t in zip(
        rng.choice(nodes, size=min(crashes, nodes // 2), replace=False),
        rng.integers(end_us // 10, end_us // 2, size=min(crashes, nodes // 2)),
    )}
    alive_until = np.full(nodes, np.iinfo(np.int64).max, dtype=np.int64)
    for i, t in crash_at.items():
        alive_until[i] = t
    expected: dict = {"events": {}, "crashes": {}, "false_positives": []}

    def flush(force: bool = False) -> None:
        for i, buf in enumerate(buffers):
            if buf and (force or len(buf) > 2000):
                files[i].write("".join(buf))
                buf.clear()

    def spread(eid: str, kind: str, subject: str, origin: int, t0: int, skip: int | None = None) -> None:
        alive = alive_until > t0
        hops = 1 + rng.poisson(1.5, size=nodes)
        delay = (rng.gamma(shape=hops, scale=40_000.0)).astype(np.int64) + 1
        seen = alive & (rng.random(nodes) >= loss) & (t0 + delay < alive_until)
        if skip is not None:
            seen[skip] = False  # the falsely accused never hears its own death
        hops[origin], delay[origin], seen[origin] = 0, 0, True
        o = names[origin]
        for i in np.flatnonzero(seen):
            buffers[i].append(_line(t0 + int(delay[i]), names[i], kind, subject, o, t0, eid, int(hops[i])))
        d = delay[seen]
        n_alive = int(alive.sum())
        expected["events"][eid] = {
            "kind": kind, "alive": n_alive, "observed": int(seen.sum()),
            **{k: _nearest_rank(d, n_alive, bp) for k, bp in
               (("t50_s", 5000), ("t90_s", 9000), ("t99_s", 9900), ("t100_s", 10000))},
        }

    for i, n in enumerate(names):
        buffers[i].append(_line(0, n, "node_start", n, n, 0, f"{n}:start", 0))
    pending_crash = sorted((t, i) for i, t in crash_at.items())
    fp_at = set(int(x) for x in rng.choice(np.arange(10, events_wanted - 10), size=false_positives, replace=False)) if events_wanted > 30 else set()
    for e in range(events_wanted):
        t0 = (e + 1) * interval_us
        while pending_crash and pending_crash[0][0] <= t0:
            tc, victim = pending_crash.pop(0)
            v = names[victim]
            buffers[victim].append(_line(tc, v, "node_crash", v, v, tc, f"{v}:crash", 0))
            det = int(rng.choice(np.flatnonzero(alive_until > tc)))
            spread(f"suspect:{v}", "member_suspect", v, det, tc + 1_500_000)
            spread(f"dead:{v}", "member_dead", v, det, tc + 6_500_000)
            expected["crashes"][v] = tc
        origin = int(rng.choice(np.flatnonzero(alive_until > t0)))
        spread(f"e{e}", KINDS[e % len(KINDS)], f"t/{e % 97}", origin, t0)
        if e in fp_at:
            live = np.flatnonzero(alive_until > t0 + 10 * S)
            victim, accuser = (int(x) for x in rng.choice(live, size=2, replace=False))
            spread(f"fp{e}", "member_dead", names[victim], accuser, t0 + 5_000, skip=victim)
            spread(f"refute{e}", "member_alive", names[victim], victim, t0 + 300_000)
            expected["false_positives"].append(
                {"member": names[victim], "declared_by": names[accuser], "ts_us": t0 + 5_000})
        if e % 200 == 0:
            flush()
    p = names[0] if alive_until[0] > end_us else names[1]
    pi = names.index(p)
    buffers[pi].append(_line(end_us // 2, p, "member_suspect", names[-1], p, end_us // 2, f"{p}:psus", 0))
    buffers[pi].append(_line(end_us // 2 + 2 * S, p, "partition_detected", names[-1], p, end_us // 2 + 2 * S, f"{p}:pd", 0))
    buffers[pi].append(_line(end_us // 2 + 9 * S, p, "partition_healed", names[-1], p, end_us // 2 + 9 * S, f"{p}:ph", 0))
    for i, n in enumerate(names):
        if alive_until[i] > end_us:
            buffers[i].append(_line(end_us, n, "node_stop", n, n, end_us, f"{n}:stop", 0))
    flush(force=True)
    for f in files:
        f.close()
    return expected


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--crashes", type=int, default=5)
    ap.add_argument("--false-positives", type=int, default=3)
    args = ap.parse_args(argv)
    t = time.perf_counter()
    expected = generate(args.out, args.nodes, args.rows, args.seed, args.crashes, args.false_positives)
    path = args.out.parent / "expected.json"
    path.write_text(json.dumps(expected) + "\n")
    size = sum(f.stat().st_size for f in args.out.iterdir())
    print(f"gen_traces: {args.nodes} nodes, {len(expected['events'])} events, "
          f"{size / 1e9:.2f} GB in {time.perf_counter() - t:.1f} s -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
