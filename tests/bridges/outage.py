"""The bridge outage run, shared by the test (tests/bridges/test_outage.py, ~30 s) and
the figure (scripts/bench/bridge_outage.py, Mosquitto down 60 s under 1,000 msg/s).

A real `meshd` bridges `load/#` to a real Mosquitto. Publishers on meshd send numbered
QoS 1 messages at a fixed total rate and note which were acknowledged. Mosquitto is
stopped (its state saved: the collector's persistent session), meshd is killed with
SIGKILL in the middle of the outage and started again on the same data directory, then
Mosquitto comes back. A collector subscribed on Mosquitto (persistent session, QoS 1)
must receive every acknowledged message, in order per publisher: a message acknowledged
before its publisher sent the next one arrives before it.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from tests.bridges.mosquitto import Mosquitto
from tests.support import MeshdProcess


@dataclass
class OutageParams:
    publishers: int = 2
    rate: float = 200.0  # messages per second, all publishers together
    before_s: float = 3.0  # load before Mosquitto stops
    outage_s: float = 10.0  # Mosquitto down
    kill_at_s: float = 4.0  # into the outage: meshd SIGKILLed and started again
    after_s: float = 4.0  # load after Mosquitto is back
    drain_timeout_s: float = 60.0


@dataclass
class OutageResult:
    acked: dict[int, list[int]] = field(default_factory=dict)  # publisher -> acknowledged seqs
    received: dict[int, list[int]] = field(default_factory=dict)  # publisher -> seqs in arrival order
    missing: dict[int, list[int]] = field(default_factory=dict)
    out_of_order: dict[int, int] = field(default_factory=dict)  # first arrivals that went backwards
    duplicates: int = 0
    publish_errors: int = 0
    drained_s: float = 0.0  # from Mosquitto's restart until the last acknowledged message arrived
    queued_peak: int = 0
    restart_s: float = 0.0  # meshd: SIGKILL to ready again
    examples: list[str] = field(default_factory=list)  # out-of-order first arrivals

    @property
    def acked_total(self) -> int:
        return sum(len(v) for v in self.acked.values())

    @property
    def ok(self) -> bool:
        return not any(self.missing.values()) and not any(self.out_of_order.values())

    def summary(self) -> dict[str, Any]:
        return {"acked": self.acked_total, "received": sum(len(v) for v in self.received.values()),
                "missing": sum(len(v) for v in self.missing.values()),
                "out_of_order": sum(self.out_of_order.values()), "duplicates": self.duplicates,
                "publish_errors": self.publish_errors, "drained_s": round(self.drained_s, 2),
                "meshd_restart_s": round(self.restart_s, 2), "examples": self.examples}


class Collector:
    """The Mosquitto subscriber: a persistent v3.1.1 session at QoS 1, reconnecting."""

    def __init__(self, port: int) -> None:
        self.received: dict[int, list[int]] = {}
        self.lock = threading.Lock()
        self.subscribed = threading.Event()
        self.c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="outage-collector", protocol=mqtt.MQTTv311,
                             clean_session=False)
        self.c.reconnect_delay_set(0.05, 0.5)
        self.c.on_connect = lambda c, u, f, rc, p: c.subscribe("load/#", qos=1)
        self.c.on_subscribe = lambda c, u, mid, rcs, p: self.subscribed.set()
        self.c.on_message = self._on_message
        self.c.connect("127.0.0.1", port, keepalive=10)
        self.c.loop_start()

    def _on_message(self, client: Any, userdata: Any, msg: mqtt.MQTTMessage) -> None:
        publisher, seq = msg.payload.decode().split(":")
        with self.lock:
            self.received.setdefault(int(publisher), []).append(int(seq))

    def snapshot(self) -> dict[int, list[int]]:
        with self.lock:
            return {k: list(v) for k, v in self.received.items()}

    def stop(self) -> None:
        self.c.loop_stop()
        self.c.disconnect()


class Publisher(threading.Thread):
    """Numbered QoS 1 messages at a fixed rate, pipelined (paho keeps up to 100 in
    flight); a message counts as acknowledged when its PUBACK came. While meshd is gone
    paho queues what is published and reconnects; it sends the unacknowledged ones
    again (a PUBACK that came before the kill counts)."""

    def __init__(self, index: int, port: Callable[[], int], interval: float, stop: threading.Event) -> None:
        super().__init__(daemon=True, name=f"outage-publisher-{index}")
        self.index = index
        self.port = port
        self.interval = interval
        self.stop_event = stop
        self.errors = 0
        self._lock = threading.Lock()
        self._acks = 0  # PUBACKs so far: each acknowledgement's place in their order
        self._acked: list[tuple[int, int]] = []  # (place, our number)
        self._seq_of: dict[int, int] = {}  # paho message id -> our number, until acknowledged
        self._early: dict[int, int] = {}  # acknowledged before publish() returned its id: id -> place
        # Causality: a global count of publishes and PUBACKs, at each message's publish and PUBACK.
        self._events = 0
        self.published_event: dict[int, int] = {}
        self.acked_event: dict[int, int] = {}
        self._early_event: dict[int, int] = {}
        self.c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"outage-pub-{index}", protocol=mqtt.MQTTv311)
        self.c.max_inflight_messages_set(100)
        self.c.reconnect_delay_set(0.05, 0.5)
        self.c.on_publish = self._on_publish
        self.c.on_disconnect = lambda c, u, f, rc, p: self._disconnected()
        self.connected = threading.Event()
        self.c.on_connect = lambda c, u, f, rc, p: self.connected.set()

    def _disconnected(self) -> None:
        with self._lock:
            self.errors += 1

    def _on_publish(self, client: Any, userdata: Any, mid: int, rc: Any, props: Any) -> None:
        with self._lock:
            self._acks += 1
            self._events += 1
            seq = self._seq_of.pop(mid, None)
            if seq is None:
                self._early[mid] = self._acks
                self._early_event[mid] = self._events
            else:
                self._acked.append((self._acks, seq))
                self.acked_event[seq] = self._events

    @property
    def acked(self) -> list[int]:
        """The acknowledged numbers in the order the PUBACKs came."""
        with self._lock:
            return [seq for _, seq in sorted(self._acked)]

    def outstanding(self) -> int:
        with self._lock:
            return len(self._seq_of)

    def run(self) -> None:
        self.c.connect("127.0.0.1", self.port(), keepalive=10)
        self.c.loop_start()
        # paho holds a PUBLISH made before the CONNACK until a reconnect: start after it.
        if not self.connected.wait(10):
            return
        seq = 1
        next_at = time.monotonic()
        while not self.stop_event.is_set():
            info = self.c.publish("load/%d" % self.index, f"{self.index}:{seq}".encode(), qos=1)
            with self._lock:
                self._events += 1
                self.published_event[seq] = self._events
                if info.mid in self._early:
                    self._acked.append((self._early.pop(info.mid), seq))
                    self.acked_event[seq] = self._early_event.pop(info.mid)
                else:
                    self._seq_of[info.mid] = seq
            seq += 1
            next_at += self.interval
            delay = next_at - time.monotonic()
            if delay > 0:
                self.stop_event.wait(delay)

    def finish(self, deadline: float) -> None:
        """Wait (until `deadline`, monotonic) for the acknowledgements still due, then
        close. What paho never got answered by then was never acknowledged: not counted."""
        while self.outstanding() and time.monotonic() < deadline:
            time.sleep(0.05)  # polling the acknowledgements, bounded by the deadline
        self.c.disconnect()
        self.c.loop_stop()


def bridge_config(path: str, mosquitto_url: str) -> str:
    with open(path, "w", encoding="utf-8") as f:
        f.write(f'[[bridges]]\nid = "mosq"\ntype = "mqtt"\nurl = "{mosquitto_url}"\negress = ["load/#"]\n'
                'queue_max_bytes = 268435456\nbackoff_min_s = 0.1\nbackoff_max_s = 1.0\n')
    return path


def run_outage(workdir: str, params: OutageParams, log: Callable[[str], None] = lambda s: None) -> OutageResult:
    result = OutageResult()
    mosq = Mosquitto(os.path.join(workdir, "mosquitto"))
    with open(mosq.config, "a", encoding="utf-8") as f:
        f.write(f"persistence true\npersistence_location {mosq.workdir}/\nautosave_interval 0\n")
        if os.geteuid() == 0:  # else Mosquitto drops to its own user, who cannot write the test's directory
            f.write("user root\n")
    mosq.start()
    config = bridge_config(os.path.join(workdir, "meshd.toml"), mosq.url)
    node = MeshdProcess(os.path.join(workdir, "meshd"), "--config", config, "--log-level", "warning", http=True)
    collector: Collector | None = None
    stop = threading.Event()
    publishers: list[Publisher] = []
    try:
        node.start()
        collector = Collector(mosq.port)
        assert collector.subscribed.wait(10), "the collector did not subscribe"
        interval = params.publishers / params.rate
        publishers = [Publisher(i, lambda: node.port, interval, stop) for i in range(params.publishers)]
        for p in publishers:
            p.start()
        time.sleep(params.before_s)  # the load runs for this long (a benchmark phase, not a wait for a condition)
        log("stopping Mosquitto")
        mosq.stop()
        time.sleep(params.kill_at_s)
        log("kill -9 meshd")
        killed = time.monotonic()
        node.kill()
        node.start()  # the same MQTT port again (MeshdProcess keeps it), so the publishers find it
        result.restart_s = time.monotonic() - killed
        log(f"meshd back after {result.restart_s:.2f} s")
        time.sleep(max(0.0, params.outage_s - params.kill_at_s - result.restart_s))
        log("starting Mosquitto")
        mosq.start()
        back = time.monotonic()
        time.sleep(params.after_s)
        stop.set()
        log("load stopped")
        for p in publishers:
            p.join(5)
        acks_due = time.monotonic() + 15
        for p in publishers:
            p.finish(acks_due)
        log("publishers done: " + ", ".join(f"{len(p.acked)} acked, {p.outstanding()} unanswered" for p in publishers))
        result.acked = {p.index: p.acked for p in publishers}
        published_by = {p.index: dict(p.published_event) for p in publishers}
        acked_by = {p.index: dict(p.acked_event) for p in publishers}
        result.publish_errors = sum(p.errors for p in publishers)
        deadline = time.monotonic() + params.drain_timeout_s
        while True:
            received = collector.snapshot()
            if all(set(acked) <= set(received.get(i, ())) for i, acked in result.acked.items()):
                break
            if time.monotonic() > deadline:
                log(f"drain timed out: {sum(map(len, received.values()))} received")
                break
            time.sleep(0.1)  # polling the collector: the condition, bounded by the deadline
        result.drained_s = time.monotonic() - back
        result.received = collector.snapshot()
        for i, acked in result.acked.items():
            got = result.received.get(i, [])
            seen = set(got)
            result.missing[i] = [s for s in acked if s not in seen]
            result.duplicates += len(got) - len(seen)
            # Order per publisher, as MQTT promises it: a message acknowledged before the
            # publisher sent the next one arrives first (what the client library sent again
            # after meshd's restart is ordered by when it was sent again). A violation: `b`
            # arrives first although a later arrival `a` was acknowledged before `b` was published.
            pub, ack = published_by[i], acked_by[i]
            firsts: list[int] = []
            first_seen: set[int] = set()
            for s in got:
                if s not in first_seen:
                    first_seen.add(s)
                    firsts.append(s)
            backwards = []
            earliest_ack_later: tuple[float, int] = (float("inf"), 0)
            for s in reversed(firsts):
                if s in pub and earliest_ack_later[0] < pub[s]:
                    backwards.append((earliest_ack_later[1], s))
                if s in ack and ack[s] < earliest_ack_later[0]:
                    earliest_ack_later = (ack[s], s)
            result.out_of_order[i] = len(backwards)
            result.examples.extend(f"publisher {i}: {b} arrived before {a}, acknowledged before {b} was sent"
                                   for a, b in backwards[:3])
        return result
    finally:
        stop.set()
        for p in publishers:
            p.join(5)
            p.c.disconnect()
            p.c.loop_stop()
        if collector is not None:
            collector.stop()
        node.__exit__()
        mosq.stop()
