"""Delayed publish figures (issue 23): firing lateness with many messages pending, and
the node's memory with a million pending.

    python scripts/bench/delayed_publish.py --pending 100000 --measured 3000      # lateness
    python scripts/bench/delayed_publish.py --pending 1000000 --measured 0 --restart   # memory

One real `meshd` (RocksDB, `durability = sync`) on 127.0.0.1. `--pending` messages are
published as `$delayed/<3600..7200>/bench/far/<i>` (QoS 0, four paho publishers) and
wait in the node; then `--measured` QoS 1 messages with delays of 2-20 s go to
`bench/near/<i>`, received by one paho subscriber. Lateness = arrival - due, the due
time as the node lists it (`GET /api/v1/delayed`: the measured messages are due first,
so they fill the first pages; read once all are acknowledged, before any is due). RSS is the
node process's resident memory (/proc). `--restart` stops the node (SIGKILL) with
everything pending and starts it on the same data directory: its memory then holds
only the window of the index it loaded. One JSON line on stdout, a summary on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import paho.mqtt.client as mqtt  # noqa: E402
from paho.mqtt.enums import CallbackAPIVersion  # noqa: E402

from mesh.http_client import request_json  # noqa: E402
from procstat import cpu_model, rss_bytes  # noqa: E402
from tests.support import MeshdProcess  # noqa: E402


def metric(node: MeshdProcess, name: str) -> float:
    status, text = request_json(node.http_addr, "GET", "/metrics")
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise RuntimeError(f"no {name}")


def wait_metric(node: MeshdProcess, name: str, value: float, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = metric(node, name)
        if got >= value:
            return got
        time.sleep(0.5)
    raise RuntimeError(f"{name} did not reach {value} in {timeout} s")


def client(port: int, client_id: str) -> mqtt.Client:
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
    c.max_inflight_messages_set(1000)
    c.max_queued_messages_set(0)
    c.connect("127.0.0.1", port, 60)
    c.loop_start()
    return c


def preload(node: MeshdProcess, n: int, rng: random.Random) -> float:
    """`n` far-off delayed messages, QoS 0 from 4 publishers; seconds until all are pending."""
    t0 = time.monotonic()
    base = metric(node, "meshd_delayed_pending")
    pubs = [client(node.port, f"preload-{k}") for k in range(4)]

    def send(k: int) -> None:
        c = pubs[k]
        for i in range(k, n, 4):
            info = c.publish(f"$delayed/{rng.randint(3600, 7200)}/bench/far/{i}", b"0123456789abcdef", 0)
            if i % 2000 < 4:
                info.wait_for_publish(60)  # paho's own queue stays bounded

    threads = [threading.Thread(target=send, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wait_metric(node, "meshd_delayed_pending", base + n, timeout=max(600.0, n / 500))
    for c in pubs:
        c.disconnect()
        c.loop_stop()
    return time.monotonic() - t0


def lateness(node: MeshdProcess, m: int, rng: random.Random) -> dict[str, float]:
    arrivals: dict[int, float] = {}
    lock = threading.Lock()
    sub = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="near-sub", protocol=mqtt.MQTTv5)

    def on_message(c: mqtt.Client, u: object, msg: mqtt.MQTTMessage) -> None:
        now = time.time()
        with lock:
            arrivals[int(msg.payload)] = now

    sub.on_message = on_message
    subscribed = threading.Event()
    sub.on_subscribe = lambda *a: subscribed.set()
    sub.connect("127.0.0.1", node.port, 60)
    sub.loop_start()
    sub.subscribe("bench/near/#", 1)
    subscribed.wait(10)
    pub = client(node.port, "near-pub")
    acked: dict[int, float] = {}
    pub.on_publish = lambda c, u, mid, rc, props: acked.__setitem__(mid, time.time())
    sent: dict[int, tuple[float, int, int]] = {}
    for i in range(m):
        delay = rng.randint(5, 20)
        t = time.time()
        info = pub.publish(f"$delayed/{delay}/bench/near/{i}", str(i).encode(), 1)
        sent[i] = (t, delay, info.mid)
        time.sleep(rng.uniform(0, 0.001))  # spread over a second or two: due times spread too
    while len(acked) < m:
        time.sleep(0.05)
    due: dict[int, float] = {}
    after = ""
    while len(due) < m:
        status, body = request_json(node.http_addr, "GET", f"/api/v1/delayed?limit=1000&after={after}")
        for row in body["data"]:
            if row["topic"].startswith("bench/near/"):
                due[int(row["topic"].rsplit("/", 1)[1])] = row["due_at"]
        after = body["meta"]["next"]
        if after is None or not body["data"][-1]["topic"].startswith("bench/near/"):
            break
    listed_by = time.time() - min(t for t, _, _ in sent.values())
    deadline = time.monotonic() + 60
    while len(arrivals) < m and time.monotonic() < deadline:
        time.sleep(0.2)
    late_due = sorted(arrivals[i] - due[i] for i in due if i in arrivals)
    status, text = request_json(node.http_addr, "GET", "/metrics")
    node_side = {line.split('"')[1]: float(line.split()[-1]) for line in text.splitlines()
                 if line.startswith("meshd_delayed_lateness_ms{")}
    late_send = sorted(arrivals[i] - (t + d) for i, (t, d, mid) in sent.items() if i in arrivals)
    sub.disconnect()
    pub.disconnect()

    def q(values: list[float], p: float) -> float:
        return round(values[min(len(values) - 1, int(p * len(values)))] * 1000, 1)

    return {"measured": m, "received": len(arrivals),
            "listed": len(due), "listed_after_s": round(listed_by, 2),
            "late_ms_p50": q(late_due, 0.5), "late_ms_p99": q(late_due, 0.99), "late_ms_max": q(late_due, 1.0),
            "late_from_send_ms_p50": q(late_send, 0.5), "late_from_send_ms_p99": q(late_send, 0.99),
            "early": sum(x < -0.002 for x in late_due),
            "node_fire_late_ms_p50": node_side.get("0.5"), "node_fire_late_ms_p99": node_side.get("0.99"),
            "node_fire_late_ms_max": node_side.get("1")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pending", type=int, default=100_000)
    ap.add_argument("--measured", type=int, default=3000)
    ap.add_argument("--restart", action="store_true", help="SIGKILL and restart with everything pending; RSS after")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="meshd-delayed-bench-"))
    node = MeshdProcess(str(workdir / "node"), "--log-level", "warning", http=True, node_id="bench")
    out: dict[str, object] = {"bench": "delayed", "cpu": cpu_model(), "cores": os.cpu_count(),
                              "pending": args.pending, "commit": os.popen(f"git -C {REPO} rev-parse --short HEAD").read().strip()}
    node.start()
    try:
        assert node.proc is not None
        time.sleep(1)
        out["rss_mb_empty"] = round(rss_bytes(node.proc.pid) / 2**20, 1)
        out["preload_s"] = round(preload(node, args.pending, rng), 1)
        out["rss_mb_after_preload"] = round(rss_bytes(node.proc.pid) / 2**20, 1)
        if args.restart:
            node.kill()
            t0 = time.monotonic()
            node.start()
            out["restart_to_ready_s"] = round(time.monotonic() - t0, 2)
            assert node.proc is not None
            out["pending_after_restart"] = metric(node, "meshd_delayed_pending")
            time.sleep(5)
            out["rss_mb_after_restart"] = round(rss_bytes(node.proc.pid) / 2**20, 1)
        if args.measured:
            out.update(lateness(node, args.measured, rng))
            out["rss_mb_end"] = round(rss_bytes(node.proc.pid) / 2**20, 1)
    finally:
        if node.proc is not None and node.proc.poll() is None:
            node.proc.kill()
            node.proc.wait(10)
    print(json.dumps(out))
    print(", ".join(f"{k}={v}" for k, v in out.items()), file=sys.stderr)


if __name__ == "__main__":
    main()
