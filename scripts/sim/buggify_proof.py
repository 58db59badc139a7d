#!/usr/bin/env python3
"""Proof that every checker can fail: each BUGGIFY fault (faults/) is run over 20 seeds
and must be caught by a checker within them; the same seeds run without any fault too.

    scripts/sim/buggify_proof.py                      # 5 nodes, 20 clients, 60 s
    scripts/sim/buggify_proof.py --nodes 3 --clients 6 --seconds 15

Prints, per fault, how many of the seeds caught it, the first seeds with the property
that caught them, and, for the runs without a fault, the seeds that failed (if any:
those are meshd bugs, or open issues). Exit 1 when a fault escapes all its seeds.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=5)
    p.add_argument("--clients", type=int, default=20)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--fault", action="append", default=[], help="only these faults (default: all)")
    args = p.parse_args(argv)
    if os.environ.get("PYTHONHASHSEED") != "0":
        os.execve(sys.executable, [sys.executable, __file__, *argv], {**os.environ, "PYTHONHASHSEED": "0"})
    sys.path.insert(0, str(ROOT))
    from faults import FAULTS
    from simulation.cluster_sim import run_seed
    from simulation.schedule import SimSpec

    # Faults only a run with two session copies and a node crashed for good can show.
    crash_faults = {"ack-before-replica"}

    def spec(fault: str, s: int) -> SimSpec:
        crash = fault in crash_faults
        return SimSpec(args.nodes, args.clients, args.seconds, s, replicas=2 if crash else 1, crash=crash)

    seeds = range(1, args.seeds + 1)
    print(f"{args.nodes} nodes, {args.clients} clients, {args.seconds:g} s, seeds {seeds.start}..{seeds.stop - 1}")
    clean = {s: run_seed(SimSpec(args.nodes, args.clients, args.seconds, s)) for s in seeds}
    failing = [r.line() for r in clean.values() if r.violation is not None]
    print(f"no fault: {len(clean) - len(failing)}/{len(clean)} ok" + "".join(f"\n  {line}" for line in failing), flush=True)
    escaped = 0
    for fault in args.fault or FAULTS:
        caught = []
        for s in seeds:
            result = run_seed(spec(fault, s), buggify=(fault,))
            if result.violation is not None:
                ok = (clean[s] if fault not in crash_faults else run_seed(spec(fault, s))).violation is None
                caught.append((s, result.violation.prop, ok))
        escaped += not caught
        shown = ", ".join(f"{s}:{prop}{'' if ok else '(fails without it too)'}" for s, prop, ok in caught[:8])
        print(f"{fault}: caught by {len(caught)}/{len(seeds)} seeds ({shown})", flush=True)
    return 1 if escaped else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
