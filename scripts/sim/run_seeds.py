#!/usr/bin/env python3
"""The long run of the cluster simulator: many seeds, in parallel over the cores,
resumable and bounded.

    scripts/sim/run_seeds.py --seeds 10000 --results sim-results.jsonl

Each finished seed appends one JSON line to the results file (`seed`, `line` as
`meshd simulate --cluster` prints it, `prop` of the violation or null, `counts`,
`wall_s`); a seed already in the file is not run again, so an interrupted run goes on
where it stopped.  `--max-minutes` bounds the wall time (the seeds under way finish;
the rest wait for the next run).  At the end: one line per violation, and the totals.
A violating seed replays alone with `meshd simulate --cluster --seed N --seeds 1` and
the same --nodes/--clients/--seconds (and --replicas/--crash).

Issue 20's long run is the CI cluster (CI runs its seeds 1-50 in
tests/simulation/test_cluster_sim.py) over 10,000 seeds, niced beside other work:

    nice -n 10 scripts/sim/run_seeds.py --nodes 3 --clients 6 --seconds 15 \
        --seeds 10000 --seed 1 --results sim-10k.jsonl --max-minutes 60

run again (the same command) until it prints `10000 seeds, V violations`.

Like the CLI, the script runs itself again with PYTHONHASHSEED=0 (set order inside
the nodes follows string hashing), so a seed here gives the same result as there.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(job: tuple[int, int, int, float, tuple[str, ...], int, bool]) -> dict[str, object]:
    from simulation.cluster_sim import run_seed
    from simulation.schedule import SimSpec

    seed, nodes, clients, seconds, buggify, replicas, crash = job
    started = time.perf_counter()  # the script's own timing, outside the simulation
    result = run_seed(SimSpec(nodes, clients, seconds, seed, replicas=replicas, crash=crash), buggify=buggify)
    return {"seed": seed, "line": result.line(), "prop": result.violation.prop if result.violation else None,
            "counts": result.counts, "wall_s": round(time.perf_counter() - started, 3)}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=10_000, help="how many seeds (default 10000)")
    p.add_argument("--seed", type=int, default=1, help="the first seed (default 1)")
    p.add_argument("--nodes", type=int, default=5)
    p.add_argument("--clients", type=int, default=20)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--buggify", action="append", default=[], metavar="FAULT")
    p.add_argument("--replicas", type=int, default=1, help="session_replicas of every node (default 1)")
    p.add_argument("--crash", action="store_true", help="one node crashes for good in every seed (the survival property)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes (default: one per core)")
    p.add_argument("--results", default="sim-results.jsonl", help="JSON Lines file, appended to and resumed from")
    p.add_argument("--max-minutes", type=float, default=None, help="stop starting seeds after this long")
    args = p.parse_args(argv)
    if os.environ.get("PYTHONHASHSEED") != "0":
        os.execve(sys.executable, [sys.executable, __file__, *argv], {**os.environ, "PYTHONHASHSEED": "0"})
    sys.path.insert(0, str(ROOT))
    results = Path(args.results)
    done: dict[int, dict[str, object]] = {}
    if results.exists():
        for line in results.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                done[int(record["seed"])] = record
    todo = [s for s in range(args.seed, args.seed + args.seeds) if s not in done]
    print(f"{len(done)} seeds already in {results}, {len(todo)} to run on {args.jobs} processes", file=sys.stderr)
    deadline = time.monotonic() + args.max_minutes * 60 if args.max_minutes else None
    jobs = ((s, args.nodes, args.clients, args.seconds, tuple(args.buggify), args.replicas, args.crash) for s in todo)
    started = time.monotonic()
    ran = 0
    with results.open("a") as out, multiprocessing.get_context("fork").Pool(args.jobs, maxtasksperchild=200) as pool:
        for record in pool.imap_unordered(_run, jobs, chunksize=1):
            out.write(json.dumps(record) + "\n")
            out.flush()
            done[int(record["seed"])] = record  # type: ignore[arg-type]
            ran += 1
            if record["prop"] is not None:
                print(record["line"], file=sys.stderr, flush=True)
            if ran % 100 == 0:
                rate = ran / (time.monotonic() - started) * 60
                print(f"{ran}/{len(todo)} seeds, {rate:.0f} seeds/min", file=sys.stderr, flush=True)
            if deadline is not None and time.monotonic() > deadline:
                print("--max-minutes reached: stopping (run again to resume)", file=sys.stderr)
                pool.terminate()
                break
    wanted = range(args.seed, args.seed + args.seeds)
    finished = [done[s] for s in wanted if s in done]
    bad = [r for r in finished if r["prop"] is not None]
    for r in sorted(bad, key=lambda r: int(r["seed"])):  # type: ignore[arg-type]
        print(r["line"])
    elapsed = time.monotonic() - started
    print(f"{len(finished)} seeds, {len(bad)} violations"
          + (f" ({ran} run now in {elapsed:.0f} s wall on {args.jobs} processes)" if ran else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
