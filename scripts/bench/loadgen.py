"""The load generator: raw non-blocking sockets, pre-encoded packets, one selector loop.

Three drivers, each returns a dict of measurements:

- `throughput()`: P publishers flood, S subscribers count. Every subscriber receives
  every message, so the generator keeps the lag (messages published minus messages the
  slowest subscriber has) under a window: the broker is measured at the rate it can
  sustain, not at the size of its queues. QoS 1 publishers also keep at most
  `pub_inflight` PUBLISHes unacknowledged. A stall (window full, nothing arriving for
  `stall_s`) lets one more batch through, so a broker that drops messages is shown as
  losing them, never as hanging the run.
- `latency()`: one publisher at a fixed rate, one subscriber; each payload carries its
  send time (`perf_counter_ns`, same process, same clock).
- `idle_connections()`: N clients CONNECT (keep alive 0) with a bounded number
  handshaking at once; connects/s and the broker's RSS per connection.

Broker CPU comes from /proc/PID/stat, generator CPU from `time.process_time()`.
"""

from __future__ import annotations

import errno
import selectors
import socket
import struct
import time
from typing import Any, Callable, Sequence

import procstat
import wire

PAYLOAD_SIZE = 64
CONNECT_TIMEOUT = 10.0


class ClientError(RuntimeError):
    pass


# ----------------------------------------------------------------------------- setup

def _recv_frame(sock: socket.socket, buf: bytearray, deadline: float) -> tuple[int, bytes]:
    while True:
        frames, used = wire.split_frames(buf)
        if frames:
            first, start, end = frames[0]
            body = bytes(buf[start:end])
            del buf[:end]
            return first, body
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise ClientError("timed out waiting for the broker")
        sock.settimeout(remaining)
        data = sock.recv(65536)
        if not data:
            raise ClientError("broker closed the connection")
        buf += data


def open_client(port: int, client_id: str, subscribe: tuple[str, int] | None = None,
                clean_start: bool = True) -> socket.socket:
    """A connected (CONNACK 0) client socket, subscribed when asked (SUBACK checked), non-blocking."""
    deadline = time.monotonic() + CONNECT_TIMEOUT
    sock = socket.create_connection(("127.0.0.1", port), timeout=CONNECT_TIMEOUT)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = bytearray()
    sock.sendall(wire.connect_packet(client_id, clean_start=clean_start))
    first, body = _recv_frame(sock, buf, deadline)
    if first >> 4 != 2 or len(body) < 2 or body[1] != 0:
        raise ClientError(f"{client_id}: CONNACK refused or missing ({first:#x} {body!r})")
    if subscribe is not None:
        sock.sendall(wire.subscribe_packet(subscribe[0], subscribe[1]))
        first, body = _recv_frame(sock, buf, deadline)
        if first >> 4 != 9 or body[-1] >= 0x80 or body[-1] != subscribe[1]:
            raise ClientError(f"{client_id}: SUBACK refused or downgraded ({body!r})")
    if buf:
        raise ClientError(f"{client_id}: unexpected bytes after the handshake")
    sock.setblocking(False)
    return sock


def _close_all(socks: list[socket.socket]) -> None:
    for s in socks:
        try:
            s.close()
        except OSError:
            pass


def _cpu(pids: int | Sequence[int]) -> float:
    """Broker CPU seconds so far, summed over the nodes of a cluster run."""
    if isinstance(pids, int):
        return procstat.cpu_seconds(pids)
    return sum(procstat.cpu_seconds(p) for p in pids)


def _cpus(pids: Sequence[int]) -> list[float]:
    """Each node's CPU seconds so far (a cluster run keeps them apart in `node_cpu_s`)."""
    return [procstat.cpu_seconds(p) for p in pids]


def _payload() -> bytes:
    return bytes([0xA5]) * PAYLOAD_SIZE  # no byte of it looks like a PUBLISH header


class _Publisher:
    __slots__ = ("sock", "template", "ack", "sent", "pending", "qos")

    def __init__(self, sock: socket.socket, template: wire.PublishTemplate) -> None:
        self.sock = sock
        self.template = template
        self.qos = template.qos
        self.ack = wire.AckStream()
        self.sent = 0
        self.pending = b""


# ----------------------------------------------------------------------------- throughput

def throughput(
    port: int,
    broker_pid: int | Sequence[int],
    *,
    publishers: int,
    subscribers: int,
    qos: int,
    topics: str = "one",
    duration: float = 3.0,
    window: int = 500,
    batch: int = 50,
    pub_inflight: int = 100,
    drain_s: float = 2.0,
    stall_s: float = 0.2,
    tag: str = "t",
    sub_port: int | None = None,
    persistent_subs: bool = False,
    before_publish: Callable[[], object] | None = None,
    payload: bytes | None = None,
) -> dict[str, Any]:
    """`topics`: "one" (every publisher on bench/x, subscribers on it) or "per-publisher"
    (bench/in/NN, subscribers on bench/in/+). `sub_port`: subscribers on another node
    than the publishers (cross-node runs); `broker_pid` may then list every node, whose
    CPU is summed. `persistent_subs`: subscribers connect with clean session 0.
    `before_publish` runs once every subscriber has its SUBACK (e.g. wait for a route).
    `payload`: PAYLOAD_SIZE bytes to publish instead of the default filler (rules.py: JSON)."""
    if payload is None:
        payload = _payload()
    elif len(payload) != PAYLOAD_SIZE:
        raise ValueError(f"a payload of {PAYLOAD_SIZE} bytes, not {len(payload)}")
    if topics == "one":
        pub_topics = ["bench/x"] * publishers
        sub_filter = "bench/x"
    else:
        pub_topics = [f"bench/in/{i:03d}" for i in range(publishers)]
        sub_filter = "bench/in/+"
    frame = wire.publish_frame_size(pub_topics[0], PAYLOAD_SIZE, qos)
    socks: list[socket.socket] = []
    try:
        subs = []
        for i in range(subscribers):
            sock = open_client(sub_port or port, f"{tag}-sub-{i}", (sub_filter, qos), clean_start=not persistent_subs)
            socks.append(sock)
            subs.append((sock, wire.SubscriberStream(frame, qos, PAYLOAD_SIZE)))
        if before_publish is not None:
            before_publish()
        pubs = []
        for i in range(publishers):
            sock = open_client(port, f"{tag}-pub-{i}")
            socks.append(sock)
            pubs.append(_Publisher(sock, wire.PublishTemplate(pub_topics[i], payload, qos)))
        return _throughput_loop(broker_pid, pubs, subs, qos, duration, window, batch, pub_inflight, drain_s, stall_s)
    finally:
        _close_all(socks)


def _throughput_loop(
    broker_pid: int | Sequence[int],
    pubs: list[_Publisher],
    subs: list[tuple[socket.socket, wire.SubscriberStream]],
    qos: int,
    duration: float,
    window: int,
    batch: int,
    pub_inflight: int,
    drain_s: float,
    stall_s: float,
) -> dict[str, Any]:
    sel = selectors.DefaultSelector()
    sub_streams = [stream for _, stream in subs]
    for sock, stream in subs:
        sel.register(sock, selectors.EVENT_READ, ("sub", sock, stream))
    for p in pubs:
        sel.register(p.sock, selectors.EVENT_READ, ("pub", p.sock, p))
    # QoS 1 acks a subscriber could not send at once (socket full) wait here
    ack_backlog: dict[socket.socket, bytes] = {}
    perf = time.perf_counter
    cpu0 = _cpu(broker_pid)
    cpus0 = [] if isinstance(broker_pid, int) else _cpus(broker_pid)
    gen0 = time.process_time()
    t0 = perf()
    end_send = t0 + duration
    sent = 0
    last_progress = t0
    last_min = 0
    t_last_recv = t0
    t_send_end: float | None = None
    errors = 0
    turn = 0
    while True:
        now = perf()
        sending = now < end_send
        sent_before = sent
        if sending:
            low = min(s.received for s in sub_streams)
            if low != last_min:
                last_min, last_progress = low, now
            stalled = now - last_progress > stall_s
            room = window - (sent - low)
            if stalled:
                room = max(room, batch)
                last_progress = now
            turn = (turn + 1) % len(pubs)  # rotate who goes first: every publisher gets a share
            for p in pubs[turn:] + pubs[:turn]:
                if room <= 0:
                    break
                if p.pending:
                    continue
                n = batch if batch < room else room
                if p.qos:
                    n = min(n, pub_inflight - (p.sent - p.ack.acked))
                    if n <= 0:
                        continue
                data = p.template.batch(n)
                try:
                    w = p.sock.send(data)
                except BlockingIOError:
                    w = 0
                if w < len(data):
                    p.pending = data[w:]
                    sel.modify(p.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, ("pub", p.sock, p))
                p.sent += n
                sent += n
                room -= n
        elif t_send_end is None:
            t_send_end = now
            # stop writing: flush what is pending, then only read
        # Poll while there is sending to do; otherwise sleep until a socket is ready
        # (acks and deliveries are what opens the window), never spin.
        events = sel.select(0 if sending and sent > sent_before else 0.05)
        for key, mask in events:
            kind, sock, obj = key.data
            if mask & selectors.EVENT_READ:
                try:
                    data = sock.recv(262144)
                except (BlockingIOError, InterruptedError):
                    data = None
                except OSError:
                    data = b""
                if data == b"":
                    errors += 1
                    sel.unregister(sock)
                    continue
                if data:
                    if kind == "sub":
                        acks = obj.feed(data)
                        t_last_recv = perf()
                        if acks:
                            acks = ack_backlog.pop(sock, b"") + acks
                            try:
                                w = sock.send(acks)
                            except BlockingIOError:
                                w = 0
                            if w < len(acks):
                                ack_backlog[sock] = acks[w:]
                    else:
                        obj.ack.feed(data)
            if mask & selectors.EVENT_WRITE and kind == "pub":
                try:
                    w = sock.send(obj.pending)
                except BlockingIOError:
                    w = 0
                obj.pending = obj.pending[w:]
                if not obj.pending:
                    sel.modify(sock, selectors.EVENT_READ, key.data)
        for sock in list(ack_backlog):
            data = ack_backlog.pop(sock)
            try:
                w = sock.send(data)
            except BlockingIOError:
                w = 0
            if w < len(data):
                ack_backlog[sock] = data[w:]
        if not sending:
            now = perf()
            received = sum(s.received for s in sub_streams)
            acked = sum(p.ack.acked for p in pubs) if qos else sent
            done = received >= sent * len(sub_streams) and acked >= sent and not any(p.pending for p in pubs)
            quiet = now - max(t_last_recv, t_send_end) > drain_s
            if done or quiet or now - t_send_end > 10 * drain_s:
                break
    cpu = _cpu(broker_pid) - cpu0
    gen_cpu = time.process_time() - gen0
    per_node = None if isinstance(broker_pid, int) else [round(a - b, 2) for a, b in zip(_cpus(broker_pid), cpus0)]
    sel.close()
    received = sum(s.received for s in sub_streams)
    expected = sent * len(sub_streams)
    elapsed = max(t_last_recv - t0, 1e-9)
    return {
        "published": sent,
        "expected": expected,
        "delivered": received,
        "lost": max(expected - received, 0),
        "duplicates": max(received - expected, 0),
        "puback_missing": (sent - sum(p.ack.acked for p in pubs)) if qos else 0,
        "closed_sockets": errors,
        "elapsed_s": round(elapsed, 4),
        "msgs_per_s": received / elapsed,
        "publish_per_s": sent / elapsed,
        "broker_cpu_s": cpu,
        "broker_cpu_pct": 100 * cpu / elapsed,
        "cpu_us_per_msg": 1e6 * cpu / received if received else None,
        "msgs_per_cpu_s": received / cpu if cpu else None,
        "gen_cpu_pct": 100 * gen_cpu / elapsed,
        "gen_us_per_msg": 1e6 * gen_cpu / received if received else None,
        **({"node_cpu_s": per_node} if per_node is not None else {}),
    }


# ----------------------------------------------------------------------------- latency

_STAMP = struct.Struct(">QI")


def latency(port: int, broker_pid: int, *, qos: int, rate: float = 2000.0, duration: float = 3.0,
            warmup: float = 0.5, drain_s: float = 1.0, tag: str = "l") -> dict[str, Any]:
    payload = _payload()
    topic = "bench/lat"
    frame = wire.publish_frame_size(topic, PAYLOAD_SIZE, qos)
    samples: list[int] = []
    seen = 0
    t_measure_from = 0

    def on_payload(p: bytes) -> None:
        nonlocal seen
        ts, _seq = _STAMP.unpack_from(p)
        seen += 1
        if ts >= t_measure_from:
            samples.append(time.perf_counter_ns() - ts)

    socks: list[socket.socket] = []
    try:
        sub = open_client(port, f"{tag}-sub", (topic, qos))
        socks.append(sub)
        pub = open_client(port, f"{tag}-pub")
        socks.append(pub)
        stream = wire.SubscriberStream(frame, qos, PAYLOAD_SIZE, on_payload=on_payload)
        acks = wire.AckStream()
        template = wire.PublishTemplate(topic, payload, qos)
        sel = selectors.DefaultSelector()
        sel.register(sub, selectors.EVENT_READ, ("sub", sub))
        sel.register(pub, selectors.EVENT_READ, ("pub", pub))
        interval_ns = int(1e9 / rate)
        cpu0 = procstat.cpu_seconds(broker_pid)
        gen0 = time.process_time()
        start = time.perf_counter_ns()
        t_measure_from = start + int(warmup * 1e9)
        stop = start + int((warmup + duration) * 1e9)
        sent = 0
        last_seen_at = start
        while True:
            now = time.perf_counter_ns()
            if now < stop:
                due = (now - start) // interval_ns + 1 - sent
                if due > 0:
                    out = []
                    for _ in range(due):
                        out.append(template.stamped(_STAMP.pack(time.perf_counter_ns(), sent)))
                        sent += 1
                    _send_all(pub, b"".join(out))
                next_due = start + (sent) * interval_ns
                timeout = max(0.0, (next_due - time.perf_counter_ns()) / 1e9)
            else:
                if seen >= sent and (not qos or acks.acked >= sent):
                    break
                if now - last_seen_at > drain_s * 1e9:
                    break
                timeout = 0.05
            for key, _ in sel.select(timeout):
                role, sock = key.data  # key.fileobj is typed as any file-like; the socket rides along
                try:
                    data = sock.recv(65536)
                except BlockingIOError:
                    continue
                if not data:
                    raise ClientError("broker closed a latency client")
                if role == "sub":
                    back = stream.feed(data)
                    last_seen_at = time.perf_counter_ns()
                    if back:
                        _send_all(sub, back)
                else:
                    acks.feed(data)
        elapsed = (time.perf_counter_ns() - start) / 1e9
        cpu = procstat.cpu_seconds(broker_pid) - cpu0
        gen_cpu = time.process_time() - gen0
        sel.close()
    finally:
        _close_all(socks)
    samples.sort()
    n = len(samples)

    def pct(q: float) -> float | None:
        return samples[min(n - 1, int(q * n))] / 1000 if n else None

    return {
        "published": sent,
        "expected": sent,
        "delivered": seen,
        "lost": max(sent - seen, 0),
        "samples": n,
        "rate": rate,
        "p50_us": pct(0.50),
        "p99_us": pct(0.99),
        "max_us": samples[-1] / 1000 if n else None,
        "broker_cpu_pct": 100 * cpu / elapsed,
        "gen_cpu_pct": 100 * gen_cpu / elapsed,
    }


def _send_all(sock: socket.socket, data: bytes) -> None:
    """Blocking-style send on a non-blocking socket (the latency rate is low)."""
    view = memoryview(data)
    while view:
        try:
            n = sock.send(view)
        except BlockingIOError:
            time.sleep(0.0005)
            continue
        view = view[n:]


# ----------------------------------------------------------------------------- idle

class _Handshake:
    """One connection of `idle_connections` between connect() and its CONNACK."""

    __slots__ = ("sock", "client_id", "received")

    def __init__(self, sock: socket.socket, client_id: str) -> None:
        self.sock = sock
        self.client_id = client_id
        self.received = bytearray()


# Beyond this many clients they come from 127.0.0.2, 127.0.0.3, ... (PER_SOURCE_ADDRESS
# each; one address has ~28,000 ephemeral ports), with IP_BIND_ADDRESS_NO_PORT: the port
# is picked at connect, unique per address pair only, so a large run does not take the
# ports that everything else on the machine connects and listens from.
OWN_SOURCES_ABOVE = 5_000
PER_SOURCE_ADDRESS = 20_000
_BIND_ADDRESS_NO_PORT = getattr(socket, "IP_BIND_ADDRESS_NO_PORT", 24)


def idle_connections(port: int, broker_pid: int, *, count: int = 5000, concurrency: int = 200,
                     timeout: float = 60.0, settle: float = 1.0, tag: str = "i",
                     while_held: Callable[[], None] | None = None) -> dict[str, Any]:
    """Open `count` idle MQTT connections; connects/s and RSS delta per connection
    (`while_held`: called once they are all open and settled, before they close: a
    memory probe's look at the broker)."""
    time.sleep(settle)
    rss0 = procstat.rss_bytes(broker_pid)
    sel = selectors.DefaultSelector()
    open_socks: list[socket.socket] = []
    connected = 0
    started = 0
    failed = 0
    in_flight = 0
    perf = time.perf_counter
    cpu0 = procstat.cpu_seconds(broker_pid)
    gen0 = time.process_time()
    t0 = perf()
    deadline = t0 + timeout
    try:
        while connected + failed < count and perf() < deadline:
            while in_flight < concurrency and started < count:
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.setblocking(False)
                if count > OWN_SOURCES_ABOVE:
                    s.setsockopt(socket.IPPROTO_IP, _BIND_ADDRESS_NO_PORT, 1)
                    s.bind((f"127.0.0.{2 + started // PER_SOURCE_ADDRESS}", 0))
                rc = s.connect_ex(("127.0.0.1", port))
                if rc not in (0, errno.EINPROGRESS):
                    s.close()
                    failed += 1
                    started += 1
                    continue
                open_socks.append(s)
                sel.register(s, selectors.EVENT_WRITE, _Handshake(s, f"{tag}-{started:06d}"))
                started += 1
                in_flight += 1
            for key, mask in sel.select(0.5):
                state: _Handshake = key.data
                s = state.sock
                if mask & selectors.EVENT_WRITE:
                    if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                        sel.unregister(s)
                        failed += 1
                        in_flight -= 1
                        continue
                    s.send(wire.connect_packet(state.client_id))
                    sel.modify(s, selectors.EVENT_READ, state)
                    continue
                try:
                    data = s.recv(64)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                state.received += data
                if not data or len(state.received) >= 4:
                    sel.unregister(s)
                    in_flight -= 1
                    if data and state.received[0] == 0x20 and state.received[3] == 0:
                        connected += 1
                    else:
                        failed += 1
        elapsed = perf() - t0
        broker_cpu = procstat.cpu_seconds(broker_pid) - cpu0
        gen_cpu = time.process_time() - gen0
        time.sleep(settle)
        rss1 = procstat.rss_bytes(broker_pid)
        alive_check = procstat.cpu_seconds(broker_pid)  # raises if the broker died
        del alive_check
        if while_held is not None:
            while_held()
    finally:
        sel.close()
        _close_all(open_socks)
    return {
        "requested": count,
        "connected": connected,
        "failed": count - connected,  # refused, closed, or not answered within the timeout
        "elapsed_s": round(elapsed, 4),
        "connects_per_s": connected / elapsed if elapsed else None,
        # Who limits connects/s: the broker's CPU and the generator's, per connection.
        "broker_cpu_pct": 100 * broker_cpu / elapsed if elapsed else None,
        "cpu_us_per_connect": 1e6 * broker_cpu / connected if connected else None,
        "gen_cpu_pct": 100 * gen_cpu / elapsed if elapsed else None,
        "rss_before_kb": rss0 / 1024,
        "rss_after_kb": rss1 / 1024,
        "kb_per_conn": (rss1 - rss0) / 1024 / connected if connected else None,
    }
