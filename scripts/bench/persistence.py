"""Issue 3: persistent QoS 1 fan-in (10 publishers -> 1 subscriber) against a clean session.

`run(workdir, quick, durability)` starts a fresh meshd (fresh data dir) for each of five
measurements, all with the same `--durability` flags:

- online, persistent: the fan-in throughput run with the subscriber on clean session 0;
- online, clean: the same with clean session 1 (the in-memory path);
- offline, persistent: the subscriber subscribes (clean session 0) and disconnects; the
  publishers send N QoS 1 messages (publish rate: N / time until the last PUBACK); the
  subscriber reconnects and drains (drain rate: N / time from CONNECT to the last
  message). Every message must arrive: the lost count is N minus what arrived;
- offline, clean: the same with a clean session, whose messages have nowhere to go once
  it left; only its publish rate is a baseline (routing to nobody, nothing stored).
- restart: offline, persistent again, but meshd is killed (SIGKILL) after the last
  PUBACK and started again on the same data dir before the subscriber comes back, so
  the drain reads what RocksDB holds. In `batch` mode a PUBACK does not wait for the
  commit, so the kill waits `kill_grace_s()` (ten batch windows, at least 0.1 s) first:
  what the mode may lose by design is not counted as loss.

The batch window is `BATCH_MS` (`run.py --durability-batch-ms`), meshd's default (50 ms) unless given.

Ratios: online persistent/clean (msg/s and msg per broker CPU-second), offline publish
persistent/clean, and drain over the online clean delivery rate (a clean session has no
queue to drain, so the rate at which the broker delivers the same fan-in from memory is
the nearest in-memory counterpart).
"""

from __future__ import annotations

import contextlib
import os
import re
import selectors
import signal
import socket
import time
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import brokers
import loadgen
import procstat
import wire

PUBLISHERS = 10
SUB_FILTER = "bench/in/+"
SUB_ID = "p-sub"
QOS = 1
# N must fit in the session queue: meshd gets --max-queued-messages above it.
OFFLINE_N = {True: 5000, False: 10000}
QUEUE_LIMIT = 20000
WAIT_S = 30.0  # bound on each offline phase; hitting it shows up as loss, never a hang
KILL_GRACE_S = 0.1  # batch mode: at least this between the last PUBACK and the kill
BATCH_MS = 50  # batch mode's window (--durability-batch-ms), meshd's default; run.py may change it


def kill_grace_s() -> float:
    """Ten batch windows: the loss window batch mode documents, with room to spare."""
    return max(KILL_GRACE_S, 10 * BATCH_MS / 1000)


def meshd_flags(durability: str) -> list[str]:
    flags = ["--durability", durability, "--max-queued-messages", str(QUEUE_LIMIT)]
    if durability == "batch":
        flags += ["--durability-batch-ms", str(BATCH_MS)]
    return flags


def run(workdir: Path, quick: bool, durability: str) -> dict[str, Any]:
    flags = meshd_flags(durability)
    duration = 2.0 if quick else 4.0
    n = OFFLINE_N[quick]
    out: dict[str, Any] = {"durability": durability, "offline_n": n}
    if durability == "batch":
        out["batch_ms"] = BATCH_MS
        out["kill_grace_s"] = kill_grace_s()
    for persistent in (True, False):
        kind = "persistent" if persistent else "clean"
        http_port = brokers.free_port()
        with _meshd(workdir / f"online-{kind}", flags + ["--http", f"127.0.0.1:{http_port}"]) as b:
            r = loadgen.throughput(b.port, b.pid, publishers=PUBLISHERS, subscribers=1, qos=QOS,
                                   topics="per-publisher", duration=duration, window=500,
                                   persistent_subs=persistent, tag=f"o{kind[0]}")
            puts = _delivery_records_written(http_port)
            if puts is not None and r["delivered"]:
                r["records_written_per_msg"] = puts / r["delivered"]
        out[f"online_{kind}"] = r
        out[f"online_{kind}_msgs_per_s"] = r["msgs_per_s"]
        out[f"online_{kind}_msgs_per_cpu_s"] = r["msgs_per_cpu_s"]
        with _meshd(workdir / f"offline-{kind}", flags) as b:
            r = offline_then_online(b.port, b.pid, n, persistent)
        out[f"offline_{kind}"] = r
        out[f"offline_{kind}_publish_per_s"] = r["publish_per_s"]
    out["restart"] = r = killed_and_restarted(workdir / "restart", flags, n, durability)
    out["restart_lost"] = r["lost"]
    out["restart_drain_per_s"] = r["drain_per_s"]
    out["drain_per_s"] = out["offline_persistent"]["drain_per_s"]
    out["online_ratio"] = _ratio(out["online_persistent_msgs_per_s"], out["online_clean_msgs_per_s"])
    out["online_cpu_ratio"] = _ratio(out["online_persistent_msgs_per_cpu_s"], out["online_clean_msgs_per_cpu_s"])
    out["publish_ratio"] = _ratio(out["offline_persistent_publish_per_s"], out["offline_clean_publish_per_s"])
    out["drain_ratio"] = _ratio(out["drain_per_s"], out["online_clean_msgs_per_s"])
    out["lost"] = sum(out[k]["lost"] for k in ("online_persistent", "online_clean", "offline_persistent", "restart"))
    out["puback_missing"] = sum(out[k]["puback_missing"] for k in
                                ("online_persistent", "online_clean", "offline_persistent", "offline_clean", "restart"))
    return out


def _delivery_records_written(http_port: int) -> float | None:
    """meshd's count of delivery records its store wrote (None before that metric existed)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    m = re.search(r'^meshd_store_records_written_total\{kind="delivery_put"\} (\S+)$', text, re.M)
    return float(m.group(1)) if m else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


@contextlib.contextmanager
def _meshd(workdir: Path, flags: list[str]) -> Iterator[brokers.RunningBroker]:
    """A fresh meshd for one measurement (fresh data dir), stopped by its PID after it."""
    broker = brokers.start(brokers.BROKERS["meshd"], workdir, extra=flags)
    try:
        yield broker
        if not broker.alive():
            raise RuntimeError(f"meshd exited with {broker.proc.returncode} during the run")
    finally:
        broker.stop()


def killed_and_restarted(workdir: Path, flags: list[str], n: int, durability: str) -> dict[str, Any]:
    """Subscribe and leave; publish `n`; SIGKILL meshd; start it on the same data dir; drain."""
    meshd = brokers.BROKERS["meshd"]
    b = brokers.start(meshd, workdir, extra=flags)
    try:
        _subscribe_and_leave(b.port, persistent=True)
        published, acked, publish_s = publish_count(b.port, n)
        if durability != "sync":
            time.sleep(kill_grace_s())
        os.kill(b.pid, signal.SIGKILL)
        b.proc.wait(10)
    finally:
        b.stop()
    b = brokers.start(meshd, workdir, extra=flags)  # same workdir: same data dir
    try:
        received, drain_s, present = drain(b.port, acked)
        if not b.alive():
            raise RuntimeError(f"restarted meshd exited with {b.proc.returncode}")
    finally:
        b.stop()
    return {
        "published": published, "acked": acked, "puback_missing": published - acked,
        "publish_per_s": acked / publish_s if publish_s else None,
        "session_present": present, "delivered": received, "lost": max(acked - received, 0),
        "duplicates": max(received - acked, 0),
        "drain_s": round(drain_s, 4), "drain_per_s": received / drain_s if drain_s else None,
    }


def _subscribe_and_leave(port: int, persistent: bool) -> None:
    sub = loadgen.open_client(port, SUB_ID, (SUB_FILTER, QOS), clean_start=not persistent)
    sub.setblocking(True)
    sub.sendall(b"\xe0\x00")  # DISCONNECT: a normal leave, the session stays (clean session 0)
    sub.close()


def offline_then_online(port: int, pid: int, n: int, persistent: bool) -> dict[str, Any]:
    """Subscribe and leave; publish `n` QoS 1 messages; come back and drain them."""
    _subscribe_and_leave(port, persistent)
    cpu0 = procstat.cpu_seconds(pid)
    published, acked, publish_s = publish_count(port, n)
    cpu_pub = procstat.cpu_seconds(pid) - cpu0
    res: dict[str, Any] = {
        "published": published, "acked": acked, "puback_missing": published - acked,
        "publish_s": round(publish_s, 4), "publish_per_s": acked / publish_s if publish_s else None,
        "publish_cpu_us_per_msg": 1e6 * cpu_pub / acked if acked else None,
    }
    if not persistent:
        return res  # nothing was kept for a clean session: nothing to drain
    cpu0 = procstat.cpu_seconds(pid)
    received, drain_s, present = drain(port, n)
    cpu_drain = procstat.cpu_seconds(pid) - cpu0
    res.update({
        "session_present": present, "delivered": received, "lost": max(n - received, 0),
        "duplicates": max(received - n, 0),
        "drain_s": round(drain_s, 4), "drain_per_s": received / drain_s if drain_s else None,
        "drain_cpu_us_per_msg": 1e6 * cpu_drain / received if received else None,
    })
    return res


def publish_count(port: int, n: int, inflight: int = 100) -> tuple[int, int, float]:
    """10 QoS 1 publishers send `n` messages together, each at most `inflight` unacked.

    Returns (sent, acked, seconds from the first send to the last PUBACK)."""
    payload = bytes([0xA5]) * loadgen.PAYLOAD_SIZE
    socks = [loadgen.open_client(port, f"p-pub-{i}") for i in range(PUBLISHERS)]
    try:
        pubs = [loadgen._Publisher(s, wire.PublishTemplate(f"bench/in/{i:03d}", payload, QOS))
                for i, s in enumerate(socks)]
        share = [n // PUBLISHERS + (1 if i < n % PUBLISHERS else 0) for i in range(PUBLISHERS)]
        sel = selectors.DefaultSelector()
        for p in pubs:
            sel.register(p.sock, selectors.EVENT_READ, p)
        t0 = time.perf_counter()
        deadline = t0 + WAIT_S
        t_last = t0
        while time.perf_counter() < deadline:
            for p, total in zip(pubs, share):
                if p.pending:
                    p.pending = p.pending[_send(p.sock, p.pending):]
                    continue
                k = min(total - p.sent, inflight - (p.sent - p.ack.acked))
                if k > 0:
                    data = p.template.batch(k)
                    p.pending = data[_send(p.sock, data):]
                    p.sent += k
            if all(p.ack.acked >= total for p, total in zip(pubs, share)):
                break
            for key, _ in sel.select(0.05):
                try:
                    data = key.data.sock.recv(65536)  # the _Publisher registered with its socket
                except BlockingIOError:
                    continue
                if not data:
                    raise loadgen.ClientError("broker closed a publisher")
                key.data.ack.feed(data)
                t_last = time.perf_counter()
        sel.close()
        return sum(p.sent for p in pubs), sum(p.ack.acked for p in pubs), t_last - t0
    finally:
        loadgen._close_all(socks)


def _send(sock: socket.socket, data: bytes) -> int:
    try:
        return sock.send(data)
    except BlockingIOError:
        return 0


def drain(port: int, n: int) -> tuple[int, float, bool]:
    """Reconnect the persistent subscriber and take its queue, acking each message.

    Returns (received, seconds from CONNECT to the last message, session present). Messages may follow the CONNACK in the same read, so the
    handshake is parsed here rather than by `open_client`."""
    frame = wire.publish_frame_size("bench/in/000", loadgen.PAYLOAD_SIZE, QOS)
    stream = wire.SubscriberStream(frame, QOS, loadgen.PAYLOAD_SIZE)
    sock = socket.create_connection(("127.0.0.1", port), timeout=loadgen.CONNECT_TIMEOUT)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        t0 = time.perf_counter()
        sock.sendall(wire.connect_packet(SUB_ID, clean_start=False))
        buf = bytearray()
        deadline = time.monotonic() + loadgen.CONNECT_TIMEOUT
        first, body = loadgen._recv_frame(sock, buf, deadline)
        if first >> 4 != 2 or body[1] != 0:
            raise loadgen.ClientError(f"drain: CONNACK refused ({body!r})")
        present = bool(body[0] & 1)
        t_last = t0
        data = bytes(buf)
        sock.settimeout(2.0)  # quiet for 2 s: the queue is empty (or lost)
        end = time.perf_counter() + WAIT_S
        while True:
            if data:
                acks = stream.feed(data)
                t_last = time.perf_counter()
                if acks:
                    sock.sendall(acks)
            if stream.received >= n or time.perf_counter() > end:
                break
            try:
                data = sock.recv(262144)
            except socket.timeout:
                break
            if not data:
                raise loadgen.ClientError("broker closed the draining subscriber")
        return stream.received, t_last - t0, present
    finally:
        sock.close()
