#!/usr/bin/env python3
"""Time `meshd report` on a large synthetic trace set (default 10 M rows, 1,000 nodes).

    python scripts/bench/report_scale.py [--dir /tmp/meshd-scale] [--master local[*]]

Generates the traces once with gen_traces.py (kept in DIR/traces for later runs),
runs the report in a fresh process (JVM start included, as a user would see it),
prints the wall time and each stage's time, checks the per-event coverage times
against the generator's answers, and writes DIR/scale.json. By hand, not in tests.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
STAGE = re.compile(r"meshd report: \[(\d+)/(\d+)\] (.*) \(([\d.]+) s\)")


def _cpu_by_pid(root: int) -> dict[int, float]:
    """CPU seconds (user+sys) of ``root`` and its descendants, from /proc."""
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry)] = int(fields[1])
        cpu[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    tree = {root}
    changed = True
    while changed:
        changed = False
        for pid, ppid in parents.items():
            if ppid in tree and pid not in tree:
                tree.add(pid)
                changed = True
    return {pid: cpu[pid] for pid in tree if pid in cpu}


def check_against_truth(out: Path, expected_path: Path) -> dict[str, int]:
    expected = json.loads(expected_path.read_text())["events"]
    checked = mismatched = 0
    with open(out / "events.csv", newline="") as f:
        for row in csv.DictReader(f):
            want = expected.get(row["event_id"])
            if want is None:
                continue
            checked += 1
            for key in ("t50_s", "t90_s", "t99_s", "t100_s"):
                got = None if row[key] == "" else float(row[key])
                if (got is None) != (want[key] is None) or (
                    got is not None and abs(got - want[key]) > 1e-6
                ):
                    mismatched += 1
                    break
    return {"events_checked": checked, "events_mismatched": mismatched}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=Path("/tmp/meshd-scale"))
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--master", default="local[*]")
    ap.add_argument("--format", default="html,json,csv")
    ap.add_argument("--regen", action="store_true", help="regenerate the traces")
    args = ap.parse_args(argv)

    traces = args.dir / "traces"
    if args.regen or not traces.is_dir():
        subprocess.run(
            [sys.executable, str(HERE / "gen_traces.py"), str(traces),
             "--nodes", str(args.nodes), "--rows", str(args.rows)],
            check=True,
        )
    rows = sum(1 for p in traces.iterdir() for _ in open(p, "rb"))
    out = args.dir / "out"
    cmd = [sys.executable, "-m", "spark_analysis.cli", str(traces), "--out", str(out),
           "--master", args.master, "--format", args.format]
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    stages: dict[str, float] = {}
    # The JVM is not waited for by its parent, so rusage misses it: sample /proc.
    cpu_seen: dict[int, float] = {}
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.5):
            for pid, secs in _cpu_by_pid(proc.pid).items():
                cpu_seen[pid] = max(secs, cpu_seen.get(pid, 0.0))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    assert proc.stderr is not None
    for line in proc.stderr:
        sys.stderr.write(line)
        m = STAGE.search(line)
        if m:
            stages[m.group(3)] = float(m.group(4))
    rc = proc.wait()
    wall = time.perf_counter() - t0
    stop.set()
    sampler.join()
    if rc != 0:
        print(f"report_scale: meshd report failed with exit {rc}", file=sys.stderr)
        return rc
    result = {
        "rows": rows,
        "nodes": args.nodes,
        "master": args.master,
        "wall_s": round(wall, 1),
        "startup_and_exit_s": round(wall - sum(stages.values()), 1),
        # The machine is shared: the 1-minute load average says how much of it we had.
        "load_avg_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "cpu_s": round(sum(cpu_seen.values()), 1),  # report process + JVM, sampled
        "stages_s": stages,
        **check_against_truth(out, args.dir / "expected.json"),
    }
    (args.dir / "scale.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
