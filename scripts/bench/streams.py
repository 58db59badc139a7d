"""Issue 23: the cost of durable streams, on real meshd processes (v3.1.1 load
generators from `loadgen`, RocksDB, `sync` durability: the default).

Append cost. Ten QoS 1 publishers send N messages (`persistence.publish_count`) to a
fresh node in three set-ups, and the node's CPU time is read around it:

- `clean`: no subscriber, no stream (routing to nobody: the baseline);
- `session`: a persistent subscriber that left (each message queued in its session in
  RocksDB: a plain persistent-session publish);
- `stream`: no subscriber, the topics are a stream (each message appended to it).

The append cost per message is stream - clean; a persistent-session publish costs
session - clean.

Replay throughput. N messages are stored, then a v3.1.1 client subscribes to
`$replay/earliest/bench/in/+` at QoS 1 and acknowledges every message; msg/s from the
SUBSCRIBE to the last message, the CPU time of the node(s) meanwhile, and their resident
memory before and at its peak during the replay (sampled). Once from one
node, once merged from three (N/3 published on each, the replay asked on the first).

    python scripts/bench/streams.py [--n 30000] [--replay-n N] [--out FILE]

Prints one JSON line (and appends it to FILE). Every process started here is stopped
by its PID; every wait is bounded.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import sys
import time
import urllib.request
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any, Iterator

sys.path.insert(0, str(Path(__file__).resolve().parent))

import brokers  # noqa: E402
import loadgen  # noqa: E402
import persistence  # noqa: E402
import procstat  # noqa: E402
import wire  # noqa: E402

STREAM = json.dumps([{"filter": "bench/#"}])
WAIT_S = 120.0


@contextlib.contextmanager
def meshd(workdir: Path, flags: list[str], pin: bool = True) -> Iterator[brokers.RunningBroker]:
    broker = brokers.start(brokers.BROKERS["meshd"], workdir, extra=flags, pin=pin)
    try:
        yield broker
    finally:
        broker.stop()


def publish_cost(workdir: Path, n: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in ("clean", "session", "stream"):
        flags = ["--max-queued-messages", str(2 * n)] + (["--streams", STREAM] if kind == "stream" else [])
        with meshd(workdir / f"publish-{kind}", flags) as b:
            if kind == "session":
                persistence._subscribe_and_leave(b.port, persistent=True)
            cpu0 = procstat.cpu_seconds(b.pid)
            sent, acked, seconds = persistence.publish_count(b.port, n)
            cpu = procstat.cpu_seconds(b.pid) - cpu0
        out[kind] = {"sent": sent, "acked": acked, "seconds": round(seconds, 4),
                     "msgs_per_s": round(acked / seconds) if seconds else None,
                     "cpu_us_per_msg": round(1e6 * cpu / acked, 2) if acked else None}
    base = out["clean"]["cpu_us_per_msg"]
    out["stream_append_us_per_msg"] = round(out["stream"]["cpu_us_per_msg"] - base, 2)
    out["session_queue_us_per_msg"] = round(out["session"]["cpu_us_per_msg"] - base, 2)
    return out


def replay(port: int, pids: list[int], n: int) -> dict[str, Any]:
    """Subscribe to `$replay/earliest/bench/in/+` at QoS 1, ack everything, count `n`."""
    frame = wire.publish_frame_size("bench/in/000", loadgen.PAYLOAD_SIZE, 1)
    stream = wire.SubscriberStream(frame, 1, loadgen.PAYLOAD_SIZE)
    sock = loadgen.open_client(port, "replayer")
    sock.setblocking(True)
    sock.settimeout(5.0)
    try:
        cpu0 = sum(procstat.cpu_seconds(p) for p in pids)
        rss0 = peak = sum(procstat.rss_bytes(p) for p in pids)
        t0 = time.perf_counter()
        sock.sendall(wire.subscribe_packet("$replay/earliest/bench/in/+", 1))
        end = t0 + WAIT_S
        t_last = t0
        while stream.received < n and time.perf_counter() < end:
            try:
                data = sock.recv(1 << 20)
            except socket.timeout:
                break
            if not data:
                break
            acks = stream.feed(data)
            t_last = time.perf_counter()
            if stream.received % 1000 < 50:  # now and then: /proc reads cost the generator's time
                peak = max(peak, sum(procstat.rss_bytes(p) for p in pids))
            if acks:
                sock.sendall(acks)
        cpu = sum(procstat.cpu_seconds(p) for p in pids) - cpu0
    finally:
        sock.close()
    seconds = t_last - t0
    got = stream.received
    return {"expected": n, "received": got, "seconds": round(seconds, 3),
            "msgs_per_s": round(got / seconds) if seconds else None,
            "cpu_us_per_msg": round(1e6 * cpu / got, 2) if got else None,
            "rss_before_mb": round(rss0 / 2**20, 1), "rss_peak_mb": round(peak / 2**20, 1)}


def replay_one_node(workdir: Path, n: int) -> dict[str, Any]:
    with meshd(workdir / "replay-one", ["--streams", STREAM]) as b:
        persistence.publish_count(b.port, n)
        return replay(b.port, [b.pid], n)


def members_alive(http_port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/api/v1/members", timeout=5) as resp:
        return sum(m["state"] == "alive" for m in json.load(resp)["members"])


def replay_three_nodes(workdir: Path, n: int) -> dict[str, Any]:
    gossip = [brokers.free_port() for _ in range(3)]
    https = [brokers.free_port() for _ in range(3)]
    with contextlib.ExitStack() as stack:
        nodes = [stack.enter_context(meshd(workdir / f"replay-three-{i}", [
            "--streams", STREAM, "--gossip", f"127.0.0.1:{gossip[i]}", "--seed", f"127.0.0.1:{gossip[0]}",
            "--gossip-preset", "local", "--http", f"127.0.0.1:{https[i]}", "--node-id", f"n{i}"], pin=False))
            for i in range(3)]
        deadline = time.monotonic() + 60
        while not all(members_alive(h) == 3 for h in https):
            if time.monotonic() > deadline:
                raise RuntimeError("the three nodes did not see each other within 60 s")
            time.sleep(0.1)
        for b in nodes:
            persistence.publish_count(b.port, n // 3)
        return replay(nodes[0].port, [b.pid for b in nodes], 3 * (n // 3))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=30000, help="messages per measurement (default 30000)")
    parser.add_argument("--replay-n", type=int, help="messages stored for the replays (default: --n)")
    parser.add_argument("--out", type=Path, help="append the JSON line to this file")
    args = parser.parse_args(argv)
    persistence.WAIT_S = WAIT_S
    line: dict[str, Any] = {"kind": "streams", "ts": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                            "n": args.n, "cpu": procstat.cpu_model(), "loadavg_before": round(_load(), 2)}
    with TemporaryDirectory(prefix="meshd-bench-streams-") as tmp:
        work = Path(tmp)
        line["publish"] = publish_cost(work, args.n)
        line["replay_n"] = replay_n = args.replay_n or args.n
        line["replay_one_node"] = replay_one_node(work, replay_n)
        line["replay_three_nodes"] = replay_three_nodes(work, replay_n)
    line["loadavg_after"] = round(_load(), 2)
    text = json.dumps(line)
    print(text)
    if args.out:
        with open(args.out, "a", encoding="utf-8") as f:
            f.write(text + "\n")
    return 0


def _load() -> float:
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


if __name__ == "__main__":
    sys.exit(main())
