#!/usr/bin/env python3
"""Session handoff under load: one persistent subscriber hops between the nodes of a
real meshd cluster on 127.0.0.1 while a publisher sends QoS 1 messages at a fixed rate.

For every hop the subscriber sends DISCONNECT to its node, opens a TCP connection to the
next node and sends CONNECT (clean start 0, session expiry 3600); the figure is the time
from that connect to the CONNACK, which must say session present = 1.  It then takes
PUBLISHes for `--dwell` seconds (acknowledging each) and hops again.  At the end the
publisher stops and the subscriber drains its session on the last node.

    python scripts/bench/handoff.py                      # 1000 handoffs, 1000 msg/s, 3 nodes
    python scripts/bench/handoff.py --handoffs 200 --rate 500

Reports median / p99 / max reconnect-to-CONNACK (ms), hops without session present,
and the message accounting: acknowledged to the publisher, received, lost (acknowledged
but never received), duplicates with and without DUP=1, and order violations.  One JSON
line per run goes to scripts/bench/results/handoff.jsonl (git-ignored; a result lands in
RESULTS.md with its lines, see README.md).  Everything stays on 127.0.0.1 and stops by
itself.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from mesh.http_client import request_json  # noqa: E402
from mqtt import Connack, Connect, Decoder, Disconnect, Properties, Puback, Publish, Suback, Subscribe, Subscription, encode  # noqa: E402
from route_convergence import start_cluster  # noqa: E402

TOPIC = "handoff/bench"
trail: list = []  # (time, message number or -1, dup flag or a note): for diagnosing
CLIENT_ID = "roamer"


class RawClient:
    """A minimal MQTT 5 client on a blocking socket, using the project's codec."""

    def __init__(self, port: int, client_id: str, *, clean_start: bool, expiry: int = 3600) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.decoder = Decoder(role="client", protocol_level=5)
        props = Properties(session_expiry_interval=expiry) if expiry else Properties()
        self.sock.sendall(encode(Connect(client_id=client_id, clean_start=clean_start, keep_alive=60, protocol_level=5, properties=props), 5))

    def packets(self, timeout: float):
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(65536)
        except socket.timeout:
            return []
        if not data:
            raise ConnectionError("closed by the broker")
        self.decoder.feed(data)
        out = []
        while (p := self.decoder.next_packet()) is not None:
            out.append(p)
        return out

    def expect(self, kind: type, timeout: float = 10.0) -> list:
        """Read until a packet of `kind` arrives; every packet read so far, that one last."""
        deadline = time.monotonic() + timeout
        seen: list = []
        while time.monotonic() < deadline:
            seen.extend(self.packets(max(0.01, deadline - time.monotonic())))
            if any(isinstance(p, kind) for p in seen):
                return seen
        raise TimeoutError(f"no {kind.__name__} within {timeout:g} s")

    def send(self, packet) -> None:
        self.sock.sendall(encode(packet, 5))

    def close(self) -> None:
        try:
            self.send(Disconnect())
        except OSError:
            pass  # the broker went first: closing is all that is left
        self.sock.close()


class Publisher(threading.Thread):
    """QoS 1 publishes at `rate` per second; remembers which were acknowledged."""

    def __init__(self, port: int, rate: float) -> None:
        super().__init__(daemon=True)
        self.client = RawClient(port, "handoff-pub", clean_start=True, expiry=0)
        self.rate = rate
        self.stopping = threading.Event()
        self.sent = 0
        self.acked: set[int] = set()
        self.error: Exception | None = None

    def run(self) -> None:
        try:
            self._run()
        except Exception as exc:  # reported by the caller
            self.error = exc

    def _run(self) -> None:
        c = self.client
        c.expect(Connack)
        start = time.monotonic()
        while not self.stopping.is_set():
            due = int((time.monotonic() - start) * self.rate)
            while self.sent < due:
                n = self.sent
                c.send(Publish(topic=TOPIC, payload=str(n).encode(), qos=1, packet_id=n % 65535 + 1))
                self.sent += 1
            for p in c.packets(0.002):
                if isinstance(p, Puback):
                    self._ack(p.packet_id)
        deadline = time.monotonic() + 10
        while len(self.acked) < self.sent and time.monotonic() < deadline:
            for p in c.packets(0.1):
                if isinstance(p, Puback):
                    self._ack(p.packet_id)
        c.close()

    def _ack(self, packet_id: int) -> None:
        # Packet ids wrap every 65535 messages; the oldest unacknowledged one with that id is meant.
        n = packet_id - 1
        while n in self.acked:
            n += 65535
        self.acked.add(n)


def take(client: RawClient, timeout: float, received: list[tuple[int, bool]]) -> None:
    for p in client.packets(timeout):
        if isinstance(p, Publish):
            received.append((int(p.payload), p.dup))
            trail.append((time.time(), int(p.payload), p.dup))
            if p.qos == 1:
                client.send(Puback(packet_id=p.packet_id))


def run(nodes_n: int, handoffs: int, rate: float, dwell: float, workdir: str, logs: str | None = None) -> dict:
    nodes = start_cluster(nodes_n, "local", workdir, "info" if logs else "warning")
    try:
        ports = [n.port for n in nodes]
        sub = RawClient(ports[0], CLIENT_ID, clean_start=True)
        sub.expect(Connack)
        sub.send(Subscribe(packet_id=1, subscriptions=(Subscription(TOPIC, 1),)))
        sub.expect(Suback)
        for node in nodes:
            while not any(r["filter"] == TOPIC for r in request_json(node.http_addr, "GET", "/api/v1/routes")[1]["routes"]):
                time.sleep(0.05)
        pub = Publisher(ports[-1], rate)
        pub.start()
        received: list[tuple[int, bool]] = []
        latencies: list[float] = []
        absent = 0
        at = 0
        started = time.monotonic()
        for i in range(handoffs):
            take(sub, dwell, received)
            sub.close()
            at = (at + 1) % nodes_n
            t0 = time.perf_counter()
            trail.append((time.time(), -1, f"hop to n{at}"))
            sub = RawClient(ports[at], CLIENT_ID, clean_start=False)
            packets = sub.expect(Connack)
            connack = next(p for p in packets if isinstance(p, Connack))
            latencies.append((time.perf_counter() - t0) * 1000)
            if not connack.session_present:
                absent += 1
            for p in packets:
                if isinstance(p, Publish):
                    received.append((int(p.payload), p.dup))
                    trail.append((time.time(), int(p.payload), p.dup))
                    sub.send(Puback(packet_id=p.packet_id))
        hopping = time.monotonic() - started
        pub.stopping.set()
        pub.join(30)
        if pub.error is not None:
            raise pub.error
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not pub.acked <= {n for n, _ in received}:
            take(sub, 0.2, received)
        take(sub, 0.5, received)
        sub.close()
        time.sleep(1.0)
        left = {n.node_id: request_json(n.http_addr, "GET", "/api/v1/status")[1]["sessions"] for n in nodes}
    finally:
        for node in nodes:
            node.__exit__()
            if logs:
                Path(logs).mkdir(parents=True, exist_ok=True)
                (Path(logs) / f"{node.node_id}.log").write_text(node.output())
    got = {n for n, _ in received}
    lost = sorted(pub.acked - got)
    seen: set[int] = set()
    dup_flagged = dup_unflagged = out_of_order = 0
    unflagged: list[int] = []
    last = -1
    for n, dup in received:
        if n in seen:
            if dup:
                dup_flagged += 1
            else:
                dup_unflagged += 1
                unflagged.append(n)
            continue
        seen.add(n)
        if n < last:
            out_of_order += 1
        last = n
    latencies.sort()
    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "nodes": nodes_n, "handoffs": handoffs, "rate": rate, "dwell_s": dwell, "hopping_s": round(hopping, 1),
        "connack_ms_median": round(statistics.median(latencies), 2),
        "connack_ms_p99": round(latencies[int(len(latencies) * 0.99) - 1] if len(latencies) >= 100 else latencies[-1], 2),
        "connack_ms_max": round(latencies[-1], 2),
        "session_absent": absent,
        "published": pub.sent, "acked": len(pub.acked), "received_unique": len(got), "lost": len(lost),
        "lost_sample": lost[:10], "dup_with_dup_flag": dup_flagged, "dup_without_dup_flag": dup_unflagged,
        "dup_without_dup_flag_sample": unflagged[:10],
        "out_of_order": out_of_order,
        "sessions_left": left,  # the subscriber's on its last node, the publisher's gone
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--handoffs", type=int, default=1000)
    ap.add_argument("--rate", type=float, default=1000.0, help="QoS 1 messages per second from the publisher")
    ap.add_argument("--dwell", type=float, default=0.02, help="seconds on each node before the next hop")
    ap.add_argument("--logs", help="keep each node's log (at info level) in this directory")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="meshd-handoff-") as workdir:
        result = run(args.nodes, args.handoffs, args.rate, args.dwell, workdir, args.logs)
    print(json.dumps(result, indent=2))
    out = Path(__file__).resolve().parent / "results"
    out.mkdir(exist_ok=True)
    if args.logs:
        with open(Path(args.logs) / "trail.txt", "w") as f:
            for t, n, note in trail:
                f.write(f"{time.strftime('%H:%M:%S', time.gmtime(t))}.{int(t * 1000) % 1000:03d} {n} {note}\n")
    with open(out / "handoff.jsonl", "a") as f:
        f.write(json.dumps(result) + "\n")
    return 0 if result["lost"] == 0 and result["session_absent"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
