"""Bridge figures (issue 24): meshd bridging to a real Mosquitto.

    python scripts/bench/bridge.py throughput [--duration 10] [--publishers 4]
    python scripts/bench/bridge.py outage [--rate 1000] [--outage 60] [--publishers 4]

`throughput`: QoS 1 publishers on meshd, a bridge (egress `bench/#`) to Mosquitto, one
QoS 1 subscriber on Mosquitto (scripts/bench/loadgen.py's `throughput`, subscriber on the
other broker's port): messages/s delivered end to end, and, for reference, the same
load with the subscriber on meshd and no bridge.

`outage`: the long form of tests/bridges/test_outage.py (the same driver,
tests/bridges/outage.py): QoS 1 publishers at `--rate` msg/s in all, Mosquitto stopped
for `--outage` s, meshd killed with SIGKILL in the middle and started again, Mosquitto
back; every acknowledged message must reach the Mosquitto subscriber, in order per
publisher. Bounded: the load stops after the outage plus 10 s, the drain waits at most
`--drain-timeout` s.

Results go to scripts/bench/results/bridge.jsonl (one JSON line per run).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.append(str(Path(__file__).resolve().parent))  # after the project: scripts/bench/streams.py is no package

import loadgen  # noqa: E402
from tests.bridges.mosquitto import Mosquitto  # noqa: E402
from tests.bridges.outage import OutageParams, run_outage  # noqa: E402
from tests.support import MeshdProcess  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "bridge.jsonl"


def _record(kind: str, line: dict[str, object]) -> None:
    RESULTS.parent.mkdir(exist_ok=True)
    commit = os.popen(f"git -C {ROOT} rev-parse --short HEAD").read().strip()
    entry = {"kind": kind, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "commit": commit, **line}
    with open(RESULTS, "a", encoding="utf-8") as f:
        f.write(json.dumps(entry) + "\n")
    print(json.dumps(entry, indent=2))


def throughput(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="bridge-bench-") as work:
        mosq = Mosquitto(os.path.join(work, "mosquitto")).start()
        try:
            config = os.path.join(work, "meshd.toml")
            with open(config, "w", encoding="utf-8") as f:
                f.write(f'[[bridges]]\nid = "mosq"\ntype = "mqtt"\nurl = "{mosq.url}"\negress = ["bench/#"]\ninflight = {args.inflight}\n')
            runs = {}
            for name, extra in (("bridged", ["--config", config]), ("meshd_only", [])):
                with MeshdProcess(os.path.join(work, name), "--log-level", "warning", *extra) as node:
                    assert node.proc is not None and mosq.proc is not None
                    sub_port = mosq.port if name == "bridged" else node.port
                    pids = [node.proc.pid, mosq.proc.pid] if name == "bridged" else node.proc.pid
                    result = loadgen.throughput(node.port, pids, publishers=args.publishers, subscribers=1, qos=1,
                                                topics="per-publisher", duration=args.duration, sub_port=sub_port,
                                                tag=name)
                runs[name] = {k: (round(v, 2) if isinstance(v, float) else v) for k, v in result.items()}
                print(f"{name}: {result['msgs_per_s']:.0f} msg/s delivered, lost {result['lost']}", flush=True)
            _record("throughput", {"publishers": args.publishers, "duration_s": args.duration,
                                   "inflight": args.inflight, **runs})
        finally:
            mosq.stop()


def outage(args: argparse.Namespace) -> None:
    params = OutageParams(publishers=args.publishers, rate=args.rate, before_s=10.0, outage_s=args.outage,
                          kill_at_s=args.outage / 2, after_s=10.0, drain_timeout_s=args.drain_timeout)
    with tempfile.TemporaryDirectory(prefix="bridge-outage-") as work:
        started = time.monotonic()
        result = run_outage(work, params, log=lambda s: print(f"[{time.monotonic() - started:6.1f} s] {s}", flush=True))
    achieved = result.acked_total / (params.before_s + params.outage_s + params.after_s)
    _record("outage", {"params": vars(params), "achieved_rate": round(achieved, 1), **result.summary(),
                       "ok": result.ok})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    t = sub.add_parser("throughput")
    t.add_argument("--duration", type=float, default=10.0)
    t.add_argument("--publishers", type=int, default=4)
    t.add_argument("--inflight", type=int, default=32, help="the bridge's inflight (unacknowledged publishes on Mosquitto)")
    o = sub.add_parser("outage")
    o.add_argument("--rate", type=float, default=1000.0)
    o.add_argument("--outage", type=float, default=60.0)
    o.add_argument("--publishers", type=int, default=4)
    o.add_argument("--drain-timeout", type=float, default=180.0)
    args = parser.parse_args()
    {"throughput": throughput, "outage": outage}[args.what](args)


if __name__ == "__main__":
    main()
