#!/usr/bin/env python3
"""Measure the membership targets of issue 4 with the simulator and print them.

    python scripts/sim/targets.py            # all scenarios (a few CPU minutes)
    python scripts/sim/targets.py --only c   # one scenario

Scenarios (LAN preset unless noted):
  a  1,000 nodes, 60 s, 5 % loss, 2 broadcasts/s, 3 crashes: broadcast p99 <= 2.5 s,
     100 % reach, bandwidth <= 25 KB/s per node, speed vs real time
  b  the same with 10 % loss: broadcast p99 <= 3 s
  c  100 nodes, 120 s, 5 % loss, 5 crashes: crash-to-dead median <= 8 s, no false dead
  c3 scenario c with suspicion_mult 3 (LAN's 4 puts the minimum timeout at 8 s)
  d  1,000 nodes, 60 s, 5 % loss, no broadcasts: steady-state speed
  e  1,000 nodes, 20 s, 5 % loss, 20 broadcasts/s: bandwidth under heavy dissemination
  l  100 nodes, 120 s, 5 % loss, 10 % slow members: false suspicions, Lifeguard on/off
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from simulation.membership import SimParams, Simulation  # noqa: E402

SCENARIOS: dict[str, dict] = {
    "a": dict(nodes=1000, seconds=60, loss=0.05, broadcasts_per_s=2, crash=3, crash_at=10),
    "b": dict(nodes=1000, seconds=60, loss=0.10, broadcasts_per_s=2, crash=3, crash_at=10),
    "c": dict(nodes=100, seconds=120, loss=0.05, crash=5, crash_at=10),
    "c3": dict(nodes=100, seconds=120, loss=0.05, crash=5, crash_at=10, overrides={"suspicion_mult": 3}),
    "d": dict(nodes=1000, seconds=60, loss=0.05),
    "e": dict(nodes=1000, seconds=20, loss=0.05, broadcasts_per_s=20),
    "l-on": dict(nodes=100, seconds=120, loss=0.05, stall=0.1, lifeguard=True),
    "l-off": dict(nodes=100, seconds=120, loss=0.05, stall=0.1, lifeguard=False),
}

KEYS = (
    "cpu_s", "cpu_speed_x", "wall_s", "bandwidth_per_node_Bps", "stream_bandwidth_per_node_Bps", "broadcast_coverage", "broadcast_p50_s",
    "broadcast_p99_s", "crash_dead_coverage", "crash_to_dead_median_s", "crash_to_dead_max_s", "false_dead",
    "false_suspicions",
)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", action="append", help="scenario name (repeatable); l runs l-on and l-off")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", help="also write all summaries to this file")
    args = p.parse_args()
    names = list(SCENARIOS)
    if args.only:
        names = [n for n in names if n in args.only or n.split("-")[0] in args.only]
    results = {}
    for name in names:
        params = SimParams(seed=args.seed, **SCENARIOS[name])
        summary = Simulation(params).run().summary()
        results[name] = summary
        print(name, json.dumps({k: summary[k] for k in KEYS}), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
