"""Benchmark meshd side by side with Mosquitto and amqtt on 127.0.0.1.

    python scripts/bench/run.py --quick                 # 1 repetition, 2 s scenarios
    python scripts/bench/run.py                         # 3 repetitions, 4 s scenarios
    python scripts/bench/run.py --brokers meshd,amqtt --scenarios fanin-qos1,fanout-qos0

For each scenario and repetition every broker runs once, in the same order each time
(A B C A B C ...): started fresh on a free port and pinned to core 1, driven by the
generator in this process pinned to core 0, stopped by its PID. Every run appends one
JSON line to `--out` (default scripts/bench/results/run-<UTC time>.jsonl); the markdown
table (medians [min..max], ratios) is printed at the end and written next to it. That
directory is git-ignored scratch: a result lands by pasting its table and raw lines into
RESULTS.md (README.md, "Landing a result").
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parents[1]))  # the repository, for mqtt

import brokers  # noqa: E402
import persistence  # noqa: E402
import procstat  # noqa: E402
import scenarios  # noqa: E402
import table  # noqa: E402
from scenarios import SCENARIOS  # noqa: E402

# What --smoke runs by default: one of each kind the issue-27 targets name.
SMOKE_SCENARIOS = ("fanin-qos1", "latency-qos0", "idle-5000")

DEFAULT_BROKERS = ("meshd", "amqtt", "mosquitto")


def source_state() -> dict[str, object]:
    """The commit benchmarked and whether the broker's packages had uncommitted edits."""
    import subprocess
    repo = str(HERE.parents[1])
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True).stdout
    dirty = git("status", "--porcelain", "--", "mesh", "routing", "session_store").splitlines()
    return {"commit": git("rev-parse", "--short", "HEAD").strip(), "dirty": [line[3:] for line in dirty if line]}


def machine() -> dict[str, object]:
    return {
        "host": platform.node(),
        "cpu": procstat.cpu_model(),
        "cores": os.cpu_count(),
        "kernel": platform.release(),
        "python": platform.python_version(),
    }


def run_one(name: str, scenario_name: str, rep: int, quick: bool, work: Path) -> dict[str, object]:
    scenario = SCENARIOS[scenario_name]
    record: dict[str, object] = {
        "ts": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "broker": name, "scenario": scenario_name, "rep": rep, "quick": quick,
        "loadavg_before": os.getloadavg()[0],
    }
    if scenario.own_brokers is not None:  # meshd-only: it starts and stops its own nodes
        try:
            record["result"] = scenario.own_brokers(work / f"{scenario_name}-{rep}", quick)
        except Exception as e:
            record["error"] = f"{type(e).__name__}: {e}"
        return record
    broker = None
    assert scenario.run is not None
    try:
        broker = brokers.start(brokers.BROKERS[name], work / f"{scenario_name}-{name}-{rep}")
        record["rss_start_kb"] = procstat.rss_bytes(broker.pid) / 1024
        record["result"] = scenario.run(broker.port, broker.pid, quick)
        if not broker.alive():
            record["error"] = f"broker exited with {broker.proc.returncode} during the run"
    except Exception as e:  # one failed run is recorded, the others go on
        record["error"] = f"{type(e).__name__}: {e}"
    finally:
        if broker is not None:
            record["exit_code"] = broker.stop()
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one repetition, 2 s scenarios")
    parser.add_argument("--smoke", action="store_true",
                        help="check that the bench works (CI): one repetition, 0.3 s scenarios, 200 idle "
                             f"connections; default scenarios {','.join(SMOKE_SCENARIOS)}; the figures mean nothing")
    parser.add_argument("--reps", type=int, help="repetitions (default 1 quick, 3 full)")
    parser.add_argument("--brokers", default=",".join(DEFAULT_BROKERS))
    parser.add_argument("--scenarios", help="comma-separated; default all")
    parser.add_argument("--out", type=Path, help="JSON lines file to append to")
    parser.add_argument("--source", default="HEAD",
                        help="git revision of meshd to measure (exported to a temp dir), or 'worktree' "
                             "for the files as they are now (default HEAD)")
    parser.add_argument("--no-pin", action="store_true", help="do not pin broker and generator to cores")
    parser.add_argument("--durability-batch-ms", type=int, default=persistence.BATCH_MS,
                        help="persist-batch: meshd's batch window in ms (default %(default)s, meshd's default)")
    args = parser.parse_args(argv)
    if args.durability_batch_ms <= 0:
        parser.error("--durability-batch-ms must be > 0")
    persistence.BATCH_MS = args.durability_batch_ms

    scenarios.SMOKE = args.smoke
    if args.smoke:
        args.quick = True
    names = [b for b in args.brokers.split(",") if b]
    chosen = [s for s in (args.scenarios or ",".join(SMOKE_SCENARIOS if args.smoke else SCENARIOS)).split(",") if s]
    unknown = [b for b in names if b not in brokers.BROKERS] + [s for s in chosen if s not in SCENARIOS]
    if unknown:
        parser.error(f"unknown broker or scenario: {', '.join(unknown)} (scenarios: {', '.join(SCENARIOS)})")
    reps = args.reps or (1 if args.quick else 3)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = args.out or HERE / "results" / f"run-{stamp}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)

    work = Path(tempfile.mkdtemp(prefix="meshd-bench-"))
    if args.source == "worktree":
        source = source_state()
    else:
        source = {"commit": brokers.export_commit(args.source, work / "src"), "dirty": []}
    for name in names:
        brokers.BROKERS[name].ensure()
    brokers.raise_fd_limit()
    pin = not args.no_pin and brokers.can_pin()
    if pin:
        os.sched_setaffinity(0, {brokers.GENERATOR_CORE})
    header = {
        "kind": "header", "ts": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(), "pinned": pin, "quick": args.quick, "smoke": args.smoke, "reps": reps,
        "versions": {n: brokers.BROKERS[n].version() for n in names},
        "source": source,
        "durability_batch_ms": persistence.BATCH_MS,
    }
    print(json.dumps(header), file=sys.stderr)
    records = []
    started = time.monotonic()
    try:
        with open(out, "a") as f:
            f.write(json.dumps(header) + "\n")
            for scenario_name in chosen:
                for rep in range(reps):
                    for name in names:
                        if SCENARIOS[scenario_name].own_brokers is not None and name != "meshd":
                            continue  # meshd against meshd: other brokers have no part in it
                        record = run_one(name, scenario_name, rep, args.quick, work)
                        records.append(record)
                        f.write(json.dumps(record) + "\n")
                        f.flush()
                        _progress(record)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    md = table.markdown(records)
    versions = ", ".join(f"{k} {v}" for k, v in header["versions"].items())
    m = header["machine"]
    summary = (f"{header['ts']} on {m['host']} ({m['cpu']}, {m['cores']} cores, Linux {m['kernel']}, "
               f"Python {m['python']}); {versions}; {reps} rep(s){' quick' if args.quick else ''}; "
               f"meshd at {header['source']['commit']}{' + uncommitted edits' if header['source']['dirty'] else ''}; "
               f"pinned={pin}; took {time.monotonic() - started:.0f} s\n\n{md}\n")
    out.with_suffix(".md").write_text(summary)
    print(summary)
    print(f"raw: {out}", file=sys.stderr)
    return 0 if not any(r.get("error") for r in records) else 1


def _progress(r: dict) -> None:
    res = r.get("result") or {}
    keys = ("msgs_per_s", "online_ratio", "publish_ratio", "drain_ratio", "ratio", "cpu_ratio", "lost", "cpu_us_per_msg", "p50_us", "p99_us", "connects_per_s", "kb_per_conn", "gen_cpu_pct")
    shown = " ".join(f"{k}={res[k]:.1f}" if isinstance(res.get(k), float) else f"{k}={res[k]}" for k in keys if k in res)
    print(f"{r['scenario']:<13} {r['broker']:<9} rep {r['rep']}: {r.get('error') or shown}", file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
