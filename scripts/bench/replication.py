#!/usr/bin/env python3
"""Session replication's cost: fan-in QoS 1 to one persistent subscriber on a 3-node
meshd cluster on 127.0.0.1, with `session_replicas` 1, 2 (sync) and 2 (async), side by
side in one run (the configurations alternate, `--reps` times each).

The subscriber (MQTT 5, clean start 0, session expiry 3600) is connected to n0 and
acknowledges every message; `--publishers` publishers on n1 and n2 keep `--window` QoS 1
PUBLISHes outstanding each for `--seconds`.  Per run: messages acknowledged per second,
publish-to-PUBACK latency p50/p90/p99, the three nodes' CPU seconds per 1,000 messages
(from /proc), and the session store's bytes on disk per node.

    python scripts/bench/replication.py                    # 3 reps x 3 configs, 5 s each
    python scripts/bench/replication.py --reps 1 --seconds 3
    python scripts/bench/replication.py --reps 1 --configs 2-sync --profile /tmp/prof

With `--profile DIR`, py-spy records every node while the load runs (raw stacks in
DIR/<config>-<node>.txt) and the top self and inclusive times of each node are printed
(`profile_meshd.top_tables`): where the replicated path spends its CPU.

One JSON line per run goes to scripts/bench/results/replication.jsonl (git-ignored).
Everything stays on 127.0.0.1 and stops by itself.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from handoff import RawClient  # noqa: E402
from mesh.http_client import request_json  # noqa: E402
from route_convergence import start_cluster  # noqa: E402
from mqtt import Connack, Puback, Publish, Suback, Subscribe, Subscription  # noqa: E402
from tests.support import MeshdProcess  # noqa: E402

CONFIGS = {"1": ("1", "sync"), "2-sync": ("2", "sync"), "2-async": ("2", "async")}
TOPIC = "bench/repl"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def du(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                continue  # removed by a compaction during the walk
    return total


REPL_COUNTERS = ("changes", "batches", "applied", "snapshots", "resyncs", "replaced")


def replication_counters(node: MeshdProcess) -> dict[str, float]:
    """The node's replication counters (`meshd_replication_<name>_total`): how many
    changes, batches and snapshots the run took (per message, what a copy costs)."""
    host, port = node.http_addr.rsplit(":", 1)
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        for name in REPL_COUNTERS:
            if line.startswith(f"meshd_replication_{name}_total "):
                out[name] = float(line.split()[1])
    return out


def start(workdir: str, replicas: str, mode: str) -> list[MeshdProcess]:
    return start_cluster(3, "local", workdir,
                         extra_flags=("--session-replicas", replicas, "--session-replication", mode))


class Publisher(threading.Thread):
    """Keeps `window` QoS 1 PUBLISHes outstanding; with `rate` (messages per second),
    sends at that pace instead (open loop, at most `window` outstanding): the latency
    of the path itself, not of a queue in front of it."""

    def __init__(self, port: int, name: str, window: int, until: float, rate: float = 0.0) -> None:
        super().__init__(daemon=True)
        self.client = RawClient(port, name, clean_start=True, expiry=0)
        self.window = window
        self.until = until
        self.interval = 1.0 / rate if rate else 0.0
        self.sent: dict[int, float] = {}
        self.latencies: list[float] = []
        self.acked = 0
        self.next_id = 1

    def run(self) -> None:
        c = self.client
        c.expect(Connack)
        next_send = time.monotonic()
        while (now := time.monotonic()) < self.until:
            while len(self.sent) < self.window and now >= next_send:
                pid = self.next_id
                self.next_id = self.next_id % 65535 + 1
                self.sent[pid] = time.monotonic()
                c.send(Publish(topic=TOPIC, payload=b"x" * 64, qos=1, packet_id=pid))
                next_send = next_send + self.interval if self.interval else now
            wait = max(0.0005, min(0.05, next_send - time.monotonic())) if self.interval else 0.05
            for p in c.packets(wait):
                if isinstance(p, Puback) and p.packet_id in self.sent:
                    self.latencies.append(time.monotonic() - self.sent.pop(p.packet_id))
                    self.acked += 1
        c.close()


def subscriber(port: int, stop: threading.Event, got: list[int]) -> None:
    sub = RawClient(port, "repl-sub", clean_start=False, expiry=3600)
    sub.expect(Connack)
    sub.send(Subscribe(packet_id=1, subscriptions=(Subscription(TOPIC, qos=1),)))
    sub.expect(Suback)
    got.append(0)
    while not stop.is_set():
        for p in sub.packets(0.05):
            if isinstance(p, Publish):
                got[0] += 1
                if p.qos:
                    sub.send(Puback(packet_id=p.packet_id))
    sub.close()


def start_profilers(nodes: list[MeshdProcess], config: str, outdir: Path) -> list[subprocess.Popen[bytes]]:
    from profile_meshd import ensure_py_spy
    py_spy = ensure_py_spy()
    outdir.mkdir(parents=True, exist_ok=True)
    return [subprocess.Popen([py_spy, "record", "--pid", str(n.proc.pid), "--rate", "200", "--format", "raw",
                              "-o", str(outdir / f"{config}-{n.node_id}.txt")],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for n in nodes if n.proc is not None]


def stop_profilers(spies: list[subprocess.Popen[bytes]], config: str, outdir: Path, top: int = 25) -> None:
    from profile_meshd import parse_collapsed, top_tables
    for spy in spies:
        spy.send_signal(signal.SIGINT)  # py-spy writes its output and exits
    for spy in spies:
        try:
            spy.wait(timeout=30)
        except subprocess.TimeoutExpired:
            spy.kill()
    for raw in sorted(outdir.glob(f"{config}-*.txt")):
        total, self_fn, _, total_fn = top_tables(parse_collapsed(raw.read_text()), top)
        print(f"\n## {raw.stem}: {total} busy samples")
        for title, rows in (("self", self_fn), ("inclusive", total_fn)):
            print(f"-- {title}")
            for k, c in rows:
                print(f"{100 * c / max(total, 1):5.1f}%  {k}")


def one_run(config: str, seconds: float, publishers: int, window: int,
            profile: Path | None = None, rate: float = 0.0) -> dict[str, object]:
    replicas, mode = CONFIGS[config]
    with tempfile.TemporaryDirectory(prefix="meshd-repl-bench-") as workdir:
        nodes = start(workdir, replicas, mode)
        try:
            stop = threading.Event()
            got: list[int] = []
            sub_thread = threading.Thread(target=subscriber, args=(nodes[0].port, stop, got), daemon=True)
            sub_thread.start()
            while not got:
                time.sleep(0.05)
            # Every node routes the filter to n0 before the load starts.
            deadline = time.monotonic() + 30
            for n in nodes[1:]:
                while True:
                    _, body = request_json(n.http_addr, "GET", "/api/v1/routes")
                    if any(r["filter"] == TOPIC for r in body["routes"]):
                        break
                    if time.monotonic() > deadline:
                        raise RuntimeError("route did not converge")
                    time.sleep(0.05)
            time.sleep(1.0)  # the session's first snapshot reached its replica
            spies = start_profilers(nodes, config, profile) if profile is not None else []
            if spies:
                time.sleep(1.0)  # py-spy attached before the load starts
            cpu0 = {n.node_id: cpu_seconds(n.proc.pid) for n in nodes if n.proc is not None}
            started = time.monotonic()
            until = started + seconds
            pubs = [Publisher(nodes[1 + i % 2].port, f"repl-pub-{i}", window, until, rate / publishers)
                    for i in range(publishers)]
            for p in pubs:
                p.start()
            for p in pubs:
                p.join(seconds + 30)
            elapsed = time.monotonic() - started
            per_node = {n.node_id: cpu_seconds(n.proc.pid) - cpu0[n.node_id] for n in nodes if n.proc is not None}
            cpu = sum(per_node.values())
            if spies and profile is not None:
                stop_profilers(spies, config, profile)
            stop.set()
            sub_thread.join(10)
            acked = sum(p.acked for p in pubs)
            lat = sorted(x for p in pubs for x in p.latencies)
            disk = {n.node_id: du(os.path.join(n.data_dir, "sessions")) for n in nodes}
            repl = {n.node_id: replication_counters(n) for n in nodes[:2]}
        finally:
            for n in nodes:
                n.__exit__()
    return {"config": config, "rate": rate or None, "acked": acked, "msg_per_s": round(acked / elapsed, 1),
            "p50_ms": round(statistics.median(lat) * 1000, 2) if lat else None,
            "p90_ms": round(lat[int(len(lat) * 0.90) - 1] * 1000, 2) if lat else None,
            "p99_ms": round(lat[int(len(lat) * 0.99) - 1] * 1000, 2) if lat else None,
            "cpu_ms_per_1000": round(cpu / max(acked, 1) * 1e6, 1),
            "node_cpu_ms_per_1000": {k: round(v / max(acked, 1) * 1e6, 1) for k, v in per_node.items()},
            "disk_bytes": disk,
            "replication": repl,
            "loadavg": os.getloadavg()[0]}


def _owner_cpu(row: dict[str, object]) -> float:
    """The session owner's (n0's) CPU ms per 1,000 messages in one run."""
    per_node = row["node_cpu_ms_per_1000"]
    return float(per_node["n0"]) if isinstance(per_node, dict) else 0.0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--publishers", type=int, default=4)
    p.add_argument("--window", type=int, default=50)
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--rate", type=float, default=0.0,
                   help="messages per second over all publishers (default: as fast as the window allows)")
    p.add_argument("--profile", type=Path, default=None, metavar="DIR",
                   help="record every node with py-spy during the load and print where the time goes")
    args = p.parse_args()
    out = ROOT / "scripts" / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    rows: dict[str, list[dict[str, object]]] = {c: [] for c in args.configs.split(",")}
    with (out / "replication.jsonl").open("a") as f:
        for rep in range(args.reps):
            for config in rows:
                row = one_run(config, args.seconds, args.publishers, args.window, args.profile, args.rate)
                row["rep"] = rep
                print(json.dumps(row), flush=True)
                f.write(json.dumps(row) + "\n")
                rows[config].append(row)
    base = statistics.median(float(str(r["msg_per_s"])) for r in rows.get("1", [])) if rows.get("1") else None
    # The owner's (n0's) CPU per message beside 1 copy's, run by run: on a shared
    # machine the throughput moves with everyone else's load, the CPU per message less.
    owner_base = [_owner_cpu(r) for r in rows.get("1", [])]
    print("\nconfig     msg/s (median)  x of 1   p50 ms  p90 ms  p99 ms  CPU ms/1000 msg  owner ms/1000  owner x of 1  load")
    for config, runs in rows.items():
        rate = statistics.median(float(str(r["msg_per_s"])) for r in runs)
        ratio = f"{rate / base:.2f}" if base else "-"
        p50 = statistics.median(float(str(r["p50_ms"])) for r in runs)
        p90 = statistics.median(float(str(r["p90_ms"])) for r in runs)
        p99 = statistics.median(float(str(r["p99_ms"])) for r in runs)
        cpu = statistics.median(float(str(r["cpu_ms_per_1000"])) for r in runs)
        owner = statistics.median(_owner_cpu(r) for r in runs)
        owner_ratio = (f"{statistics.median(_owner_cpu(r) / b for r, b in zip(runs, owner_base)):.2f}"
                       if len(owner_base) == len(runs) and all(owner_base) else "-")
        load = statistics.median(float(str(r["loadavg"])) for r in runs)
        print(f"{config:<10} {rate:>14.0f}  {ratio:>6}  {p50:>7.2f} {p90:>7.2f} {p99:>7.2f}  {cpu:>8.1f}"
              f"         {owner:>7.1f}        {owner_ratio:>6}  {load:>4.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
