#!/usr/bin/env python3
"""The gossip simulator at a thousand and more nodes (issue 27).

    python scripts/bench/gossip_scale.py                          # 1,000 and 5,000 nodes, 5 % loss
    python scripts/bench/gossip_scale.py --nodes 1000 --seconds 30
    python scripts/bench/gossip_scale.py --nodes 50 --seconds 3 --smoke

Each size runs `meshd simulate` (real `Swim` machines in virtual time, one process,
one core) from a converged view with `--loss` packet loss and user broadcasts from
random nodes, in a child process of its own, and reads its `summary.json`: virtual
seconds per CPU second of the simulator (`cpu_speed_x`; per wall second too, which
the other load on the machine moves), the broadcasts' dissemination to every live
node (p50, p99, coverage), false deaths, and the child's peak resident memory (every
node holds the whole membership: memory grows with the square of the size).

One JSON line per size goes to scripts/bench/results/gossip_scale.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).resolve().parent / "results"
KEEP = ("nodes", "virtual_s", "wall_s", "speed_x", "cpu_s", "cpu_speed_x", "events", "packets", "broadcasts",
        "broadcast_coverage", "broadcast_p50_s", "broadcast_p99_s", "broadcast_max_s", "false_dead",
        "false_suspicions", "bandwidth_per_node_Bps")


def run_one(nodes: int, seconds: float, loss: float, broadcasts_per_s: float, seed: int, preset: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="meshd-gossip-scale-") as out:
        cmd = [sys.executable, "-m", "mesh.cli", "simulate", "--nodes", str(nodes), "--seconds", str(seconds),
               "--loss", str(loss), "--broadcasts-per-s", str(broadcasts_per_s), "--seed", str(seed),
               "--preset", preset, "--out", out, "--no-progress"]
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        with open("/proc/loadavg") as f:
            load = float(f.read().split()[0])
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        output = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
        if os.waitstatus_to_exitcode(status) != 0:
            raise RuntimeError(f"simulate --nodes {nodes} failed: {output[-2000:]}")
        summary = json.loads((Path(out) / "summary.json").read_text())
    res = {k: summary.get(k) for k in KEEP}
    res.update({"loss": loss, "preset": preset, "seed": seed, "broadcasts_per_s": broadcasts_per_s,
                "max_rss_mb": round(usage.ru_maxrss / 1024, 1), "loadavg_before": load})
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", default="1000,5000", help="comma-separated cluster sizes")
    p.add_argument("--seconds", type=float, default=20.0, help="virtual seconds per run")
    p.add_argument("--loss", type=float, default=0.05)
    p.add_argument("--broadcasts-per-s", type=float, default=2.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--preset", default="lan", choices=("lan", "wan", "local"))
    p.add_argument("--smoke", action="store_true", help="write nothing under results/ (CI: that it runs)")
    args = p.parse_args(argv)
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip() or "?"
    for n in (int(x) for x in args.nodes.split(",")):
        res = run_one(n, args.seconds, args.loss, args.broadcasts_per_s, args.seed, args.preset)
        res["ts"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        res["commit"] = commit
        line = json.dumps(res)
        if not args.smoke:
            RESULTS.mkdir(exist_ok=True)
            with open(RESULTS / "gossip_scale.jsonl", "a") as f:
                f.write(line + "\n")
        print(line)
        print(f"{n:,} nodes, {args.loss:.0%} loss: {res['cpu_speed_x']}x virtual seconds per CPU second "
              f"({res['speed_x']}x per wall second, load {res['loadavg_before']:.1f}); broadcasts to every node: "
              f"p50 {res['broadcast_p50_s']} s, p99 {res['broadcast_p99_s']} s, coverage {res['broadcast_coverage']}; "
              f"false dead {res['false_dead']}; peak RSS {res['max_rss_mb']:,} MB", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
