#!/usr/bin/env python3
"""Where the time of a small `meshd report` goes (issue 26: a 5-node, 60 s trace).

    python scripts/bench/report_small.py [--nodes 5] [--seconds 60] [--runs 3]
        [--master local[*]] [--conf KEY=VALUE ...] [--sim-arg=--crash=1 ...]

Makes the trace once with `meshd simulate` (in DIR/traces), then runs
`meshd report` in a fresh process per run, as a user types it (JVM start
included), with Spark's event log on. Prints per run: wall time, the load
average before and after (the machine is shared), CPU seconds of the report
process and of its JVM, and from the event log the JVM start (process start to
the SparkContext), the time inside Spark jobs (union of job intervals) and outside
them (planning, Python, rendering, exit), and the number of jobs, stages, tasks and
SQL executions. By hand, not in tests.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.append(str(HERE))  # appended: scripts/bench/streams.py must not hide the package

from report_scale import STAGE, _cpu_by_pid  # noqa: E402  (sibling script)


def _intervals_union(spans: list[tuple[int, int]]) -> int:
    total, cur_s, cur_e = 0, None, None
    for s, e in sorted(spans):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def event_log_figures(log: Path, started_ms: float) -> dict[str, object]:
    """Jobs, stages, tasks and the time spent inside jobs, from one event log."""
    app_start = app_end = None
    jobs: dict[int, list[int]] = {}
    stages = tasks = sql = 0
    task_run_ms = 0
    with open(log, encoding="utf-8") as f:
        for line in f:
            e = json.loads(line)
            kind = e["Event"]
            if kind == "SparkListenerApplicationStart":
                app_start = e["Timestamp"]
            elif kind == "SparkListenerApplicationEnd":
                app_end = e["Timestamp"]
            elif kind == "SparkListenerJobStart":
                jobs[e["Job ID"]] = [e["Submission Time"], e["Submission Time"]]
            elif kind == "SparkListenerJobEnd":
                jobs[e["Job ID"]][1] = e["Completion Time"]
            elif kind == "SparkListenerStageCompleted":
                stages += 1
            elif kind == "SparkListenerTaskEnd":
                tasks += 1
                task_run_ms += (e.get("Task Metrics") or {}).get("Executor Run Time", 0)
            elif kind.endswith("SparkListenerSQLExecutionStart"):
                sql += 1
    in_jobs = _intervals_union([(s, e) for s, e in jobs.values()]) / 1e3
    span = ((app_end or app_start or 0) - (app_start or 0)) / 1e3
    return {
        "jvm_start_s": round((app_start - started_ms) / 1e3, 2) if app_start else None,
        "app_span_s": round(span, 2),
        "in_jobs_s": round(in_jobs, 2),
        "outside_jobs_in_app_s": round(span - in_jobs, 2),
        "task_run_s": round(task_run_ms / 1e3, 2),
        "jobs": len(jobs),
        "stages": stages,
        "tasks": tasks,
        "sql_executions": sql,
    }


def run_once(cmd: list[str], env: dict[str, str], eventlog_dir: Path) -> dict[str, object]:
    before = set(eventlog_dir.iterdir())
    load_before = os.getloadavg()
    started_ms = time.time() * 1e3
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
    cpu_seen: dict[int, float] = {}
    stop = threading.Event()

    def sample() -> None:
        # The JVM is not waited for by its parent, so rusage misses it: sample /proc.
        while not stop.wait(0.2):
            for pid, secs in _cpu_by_pid(proc.pid).items():
                cpu_seen[pid] = max(secs, cpu_seen.get(pid, 0.0))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stages: dict[str, float] = {}
    assert proc.stderr is not None
    for line in proc.stderr:
        m = STAGE.search(line)
        if m:
            stages[m.group(3)] = float(m.group(4))
        elif "error" in line or "Traceback" in line:
            sys.stderr.write(line)
    rc = proc.wait()
    wall = time.perf_counter() - t0
    stop.set()
    sampler.join()
    own = cpu_seen.pop(proc.pid, 0.0)
    logs = sorted(set(eventlog_dir.iterdir()) - before)
    result: dict[str, object] = {
        "exit": rc,
        "wall_s": round(wall, 2),
        "load_avg_before": [round(x, 2) for x in load_before],
        "load_avg_after": [round(x, 2) for x in os.getloadavg()],
        "cpu_python_s": round(own, 2),
        "cpu_jvm_and_children_s": round(sum(cpu_seen.values()), 2),  # sampled every 0.2 s
        "stages_s": stages,
    }
    if logs:
        result.update(event_log_figures(logs[-1], started_ms))
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=Path("/tmp/meshd-report-small"))
    ap.add_argument("--nodes", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--sim-arg", action="append", default=[], help="extra meshd simulate argument")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--master", default="local[*]")
    ap.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args(argv)

    traces = args.dir / "traces"
    eventlogs = args.dir / "eventlog"
    eventlogs.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    subprocess.run(
        ["meshd", "simulate", "--nodes", str(args.nodes), "--seconds", str(args.seconds),
         "--seed", str(args.seed), "--out", str(traces), "--no-progress", *args.sim_arg],
        check=True, env=env, stdout=subprocess.DEVNULL,
    )
    size = sum(p.stat().st_size for p in traces.iterdir())
    cmd = ["meshd", "report", str(traces), "--out", str(args.dir / "out"), "--master", args.master]
    for pair in [
        "spark.eventLog.enabled=true", f"spark.eventLog.dir=file://{eventlogs}",
        "spark.eventLog.compress=false", "spark.eventLog.rolling.enabled=false", *args.conf,
    ]:
        cmd += ["--conf", pair]
    print(f"traces: {traces} ({size} bytes); command: {' '.join(cmd)}", file=sys.stderr)
    walls = []
    for _ in range(args.runs):
        r = run_once(cmd, env, eventlogs)
        walls.append(float(str(r["wall_s"])))
        print(json.dumps(r), flush=True)
    walls.sort()
    print(json.dumps({"median_wall_s": walls[len(walls) // 2], "min_wall_s": walls[0]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
