"""Session handoff between real `meshd` processes: a persistent client reconnects to
another node and finds its whole session there."""

from __future__ import annotations

import threading
import time

from mesh.http_client import request_json
from tests.cluster.test_mesh_processes import cluster3, routes, wait_route  # noqa: F401  (fixture)
from tests.cluster.test_membership_processes import wait_for
from tests.support import Client


def persistent(client_id: str) -> Client:
    return Client(client_id, version=5, clean=False)


def test_offline_queue_moves_to_the_node_the_client_reconnects_to(cluster3):
    a, b, c = cluster3["A"], cluster3["B"], cluster3["C"]
    sub = persistent("mover")
    sub.connect(a.port, expiry=3600)
    sub.subscribe("move/#", 1)
    wait_route(cluster3.values(), "move/#", {"A"})
    sub.disconnect()
    pub = Client("pub-c", version=5)
    pub.connect(c.port)
    for i in range(50):
        pub.publish(f"move/{i}", str(i).encode(), qos=1)
    again = persistent("mover")
    flags, _, _ = again.connect(b.port, expiry=3600)
    if not flags.session_present:
        dump(cluster3)
    assert flags.session_present
    got = again.expect(50)
    assert [int(m.payload) for m in got] == list(range(50))
    # The routes followed the session; A kept nothing.
    wait_route(cluster3.values(), "move/#", {"B"})
    pub.publish("move/after", b"after", qos=1)
    assert again.expect(1)[0].payload == b"after"
    again.expect_none(0.5)
    status, body = request_json(a.http_addr, "GET", "/api/v1/status")
    assert status == 200



class SteadyPublisher(threading.Thread):
    """Publishes `prefix:N` at a steady rate until stopped; counts acknowledged messages."""

    def __init__(self, port: int, client_id: str, qos: int, rate: float) -> None:
        super().__init__(daemon=True)
        self.client = Client(client_id, version=5)
        self.client.connect(port)
        self.qos, self.interval = qos, 1.0 / rate
        self.sent = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            self.client.publish("steady/q%d" % self.qos, f"{self.qos}:{self.sent}".encode(), qos=self.qos)
            self.sent += 1
            time.sleep(self.interval)

    def stop(self) -> int:
        self.stopping.set()
        self.join(10)
        return self.sent


def check_stream(messages, qos: int, sent: int) -> None:
    """Every message once, in order; a QoS 1 repeat only as a DUP resend."""
    seen: list[int] = []
    for m in messages:
        n = int(m.payload.split(b":")[1])
        if seen and n <= seen[-1]:
            assert qos == 1 and m.dup and n in seen, f"QoS {qos}: {n} after {seen[-1]} (dup={m.dup})"
            continue
        seen.append(n)
    assert seen == list(range(sent)), f"QoS {qos}: missing {sorted(set(range(sent)) - set(seen))[:20]}"


def test_reconnects_across_nodes_while_publishing_lose_nothing(cluster3):
    nodes = cluster3
    sub = persistent("roamer")
    sub.connect(nodes["A"].port, expiry=3600)
    sub.subscribe("steady/#", 2)
    wait_route(nodes.values(), "steady/#", {"A"})
    pubs = [SteadyPublisher(nodes["C"].port, f"steady-{q}", q, rate=150) for q in (1, 2)]
    for p in pubs:
        p.start()
    # One paho client throughout, as a real device keeps its session state (QoS 2
    # messages it acknowledged with PUBREC are delivered on the PUBREL it gets later).
    for hop in "BAC":
        time.sleep(0.7)
        sub.disconnect()
        flags, _, _ = sub.connect(nodes[hop].port, expiry=3600)
        assert flags.session_present, f"no session on {hop}"
    time.sleep(0.5)
    sent = {p.qos: p.stop() for p in pubs}
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        counts = {q: len({m.payload for m in list(sub.messages.queue) if m.topic == f"steady/q{q}"}) for q in (1, 2)}
        if counts == sent:
            break
        time.sleep(0.2)
    got = list(sub.messages.queue)
    for q in (1, 2):
        check_stream([m for m in got if m.topic == f"steady/q{q}"], q, sent[q])
    assert min(sent.values()) > 100


def dump(nodes) -> None:
    for n in nodes.values():
        n.stop()
        print(f"----- {n.node_id}\n{n.output()[-6000:]}")
