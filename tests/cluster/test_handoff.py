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


def subscribed_then_offline(nodes, node, client_id: str, topic_filter: str, qos: int = 1) -> Client:
    """A persistent v5 client that subscribes on `node`, waits until every node routes
    the filter there, and disconnects: its session waits on `node`."""
    sub = persistent(client_id)
    sub.connect(node.port, expiry=3600)
    sub.subscribe(topic_filter, qos)
    wait_route(nodes.values(), topic_filter, {node.node_id})
    sub.disconnect()
    return sub


def test_v311_persistent_session_moves_too(cluster3):
    a, b, c = cluster3["A"], cluster3["B"], cluster3["C"]
    sub = Client("old-school", version=4, clean=False)
    sub.connect(a.port)
    sub.subscribe("v3/#", 2)
    wait_route(cluster3.values(), "v3/#", {"A"})
    sub.disconnect()
    pub = Client("pub-v3", version=4)
    pub.connect(c.port)
    for i in range(10):
        pub.publish("v3/x", str(i).encode(), qos=2)
    again = Client("old-school", version=4, clean=False)
    flags, _, _ = again.connect(b.port)
    assert flags.session_present
    assert [int(m.payload) for m in again.expect(10)] == list(range(10))
    wait_route(cluster3.values(), "v3/#", {"B"})


def test_offline_queue_moves_to_the_node_the_client_reconnects_to(cluster3):
    a, b, c = cluster3["A"], cluster3["B"], cluster3["C"]
    sub = subscribed_then_offline(cluster3, a, "mover", "move/#")
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
    assert 'meshd_handoffs_total{outcome="taken"} 1' in metrics_text(b)
    assert 'meshd_handoffs_total{outcome="given"} 1' in metrics_text(a)
    assert 'meshd_handoff_duration_ms{quantile="0.5"}' in metrics_text(b)


def metrics_text(node) -> str:
    status, body = request_json(node.http_addr, "GET", "/metrics")
    assert status == 200
    return body if isinstance(body, str) else body.decode()



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
        self.client.disconnect()
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



def test_owner_killed_during_reconnect_then_its_copy_is_merged_when_it_returns(cluster3):
    a, b, c = cluster3["A"], cluster3["B"], cluster3["C"]
    sub = subscribed_then_offline(cluster3, a, "survivor", "kill/#")
    pub = Client("pub-kill", version=5)
    pub.connect(c.port)
    for i in range(20):
        pub.publish(f"kill/{i}", f"old:{i}".encode(), qos=1)  # acknowledged: on A's disk
    a.kill()
    started = time.monotonic()
    flags, _, _ = sub.connect(b.port, expiry=3600)
    waited = time.monotonic() - started
    assert waited < 8, f"CONNACK took {waited:.1f} s"
    assert not flags.session_present  # documented: the owner is gone, no copy here
    sub.subscribe("kill/#", 1)
    wait_route([b, c], "kill/#", {"B"})
    pub.publish("kill/new", b"new", qos=1)
    assert sub.expect(1)[0].payload == b"new"
    # A comes back on its data dir: its copy is merged into B's session, nothing is lost.
    a.start()
    got = sub.expect(20, timeout=30)
    assert sorted(m.payload for m in got) == sorted(f"old:{i}".encode() for i in range(20))
    assert [m.payload for m in got] == [f"old:{i}".encode() for i in range(20)]  # in order
    wait_for(lambda: request_json(a.http_addr, "GET", "/api/v1/status")[1]["sessions"] == 0, what="A forgot its copy")



def no_auto_reconnect(client: Client) -> Client:
    client.c.reconnect_delay_set(min_delay=300, max_delay=300)  # a kicked client stays kicked
    return client


def test_concurrent_connects_on_two_nodes_leave_exactly_one(cluster3):
    a, b, c = cluster3["A"], cluster3["B"], cluster3["C"]
    subscribed_then_offline(cluster3, a, "twin", "twin/#")
    twins = {name: no_auto_reconnect(persistent("twin")) for name in "BC"}
    results: dict[str, object] = {}
    threads = [threading.Thread(target=lambda n=n: results.__setitem__(n, twins[n].connect(cluster3[n].port, expiry=3600)))
               for n in "BC"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)
    assert set(results) == {"B", "C"}

    # paho keeps saying "connected" after a server DISCONNECT: count the DISCONNECTs.
    kicked: dict[str, int] = {}
    deadline = time.monotonic() + 10
    while not kicked and time.monotonic() < deadline:
        for n, t in twins.items():
            if not t.disconnects.empty():
                kicked[n] = t.disconnects.get()[0].value
        time.sleep(0.05)
    time.sleep(1.0)
    for n, t in twins.items():
        if not t.disconnects.empty():
            kicked[n] = t.disconnects.get()[0].value
    assert len(kicked) == 1, kicked
    loser, rc = kicked.popitem()
    assert rc == 0x8E  # session taken over
    winner = "B" if loser == "C" else "C"
    # One session, on the winner; the routes say so everywhere.
    wait_route(cluster3.values(), "twin/#", {winner})
    for name, node in cluster3.items():
        sessions = request_json(node.http_addr, "GET", "/api/v1/status")[1]["sessions"]
        assert sessions == (1 if name == winner else 0), (name, sessions)
    pub = Client("twin-pub", version=5)
    pub.connect(a.port)
    pub.publish("twin/x", b"one", qos=1)
    assert twins[winner].expect(1)[0].payload == b"one"
    twins[winner].expect_none(0.5)


def test_clean_connect_elsewhere_kicks_the_old_connection(cluster3):
    a, b = cluster3["A"], cluster3["B"]
    old = no_auto_reconnect(persistent("kickme"))
    old.connect(a.port, expiry=3600)
    old.subscribe("kick/#", 1)
    wait_route(cluster3.values(), "kick/#", {"A"})
    new = Client("kickme", version=5)  # clean start: the old session is void
    flags, _, _ = new.connect(b.port)
    assert not flags.session_present
    rc, _ = old.disconnects.get(timeout=10)
    assert rc.value == 0x8E
    for n in cluster3.values():
        wait_for(lambda n=n: "kick/#" not in routes(n), what=f"{n.node_id}: the old session's route is gone")
    wait_for(lambda: request_json(a.http_addr, "GET", "/api/v1/status")[1]["sessions"] == 0, what="A dropped the session")



def test_flapping_client_leaks_nothing(cluster3):
    nodes = cluster3
    sub = persistent("flapper")
    sub.connect(nodes["A"].port, expiry=3600)
    sub.subscribe("steady/#", 1)
    wait_route(nodes.values(), "steady/#", {"A"})
    pub = SteadyPublisher(nodes["C"].port, "flap-pub", 1, rate=100)
    pub.start()
    order = "BCA" * 34
    for i, hop in enumerate(order[:100]):
        sub.disconnect()
        flags, _, _ = sub.connect(nodes[hop].port, expiry=3600)
        if not flags.session_present:
            dump(nodes)
        assert flags.session_present, f"no session on {hop} (hop {i})"
    last = order[99]
    sent = pub.stop()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and len({m.payload for m in list(sub.messages.queue)}) < sent:
        time.sleep(0.2)
    check_stream(list(sub.messages.queue), 1, sent)
    wait_route(nodes.values(), "steady/#", {last})
    for name, node in nodes.items():
        want = 1 if name == last else 0
        try:
            wait_for(lambda node=node: request_json(node.http_addr, "GET", "/api/v1/status")[1]["sessions"] == want,
                     timeout=10, what=f"{name} holds {want} sessions")
        except AssertionError:
            dump(nodes)
            raise



def test_a_silent_third_node_does_not_stop_a_handoff(cluster3):
    """C freezes (not yet known dead): its fence and flush time out, the move goes on."""
    import os
    import signal

    a, b, c = cluster3["A"], cluster3["B"], cluster3["C"]
    sub = subscribed_then_offline(cluster3, a, "patient", "patient/#")
    pub = Client("pub-patient", version=5)
    pub.connect(a.port)
    for i in range(5):
        pub.publish("patient/x", str(i).encode(), qos=1)
    os.kill(c.proc.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        flags, _, _ = sub.connect(b.port, expiry=3600)
        took = time.monotonic() - started
        assert flags.session_present and took < 5, took
        assert [int(m.payload) for m in sub.expect(5)] == list(range(5))
    finally:
        os.kill(c.proc.pid, signal.SIGCONT)


def dump(nodes) -> None:
    for n in nodes.values():
        n.stop()
        print(f"----- {n.node_id}\n{n.output()[-6000:]}")
