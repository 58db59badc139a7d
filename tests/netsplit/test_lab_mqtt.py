"""MQTT across a real netsplit: five `meshd` processes in network namespaces split 3|2
while real MQTT clients inside the namespaces keep publishing and subscribing on both
sides; after the heal every QoS 1 message for a persistent session on the other side
arrives, in order, and a client id used on both sides ends with one session."""

from __future__ import annotations

import threading
import time

import pytest

from tests.netsplit.test_lab_splits import HTTP, N, LabCluster, netlab, wait_for
from mesh.http_client import request_json
from tests.support import Client

pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(not netlab.has_net_admin(), reason="needs CAP_NET_ADMIN to build network namespaces"),
]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    base = tmp_path_factory.mktemp("labmqtt")
    with netlab.NetLab(hosts=N) as net:  # a prefix of its own (the pid): concurrent runs do not collide
        c = LabCluster(net, base)
        try:
            c.start()
            wait_for(lambda: (c.assert_running(), c.one_view())[1], 30, "five nodes in one view")
            yield c
        finally:
            c.stop()


def client_on(c: LabCluster, host: int, client_id: str, *, persistent: bool) -> Client:
    client = Client(client_id, version=5, clean=not persistent)
    client.c.reconnect_delay_set(min_delay=300, max_delay=300)  # a kicked client stays kicked
    addr = c.lab.hosts[host].address
    c.lab.in_host(host, lambda: client.connect(1883, host=addr, expiry=3600 if persistent else None))
    return client


def routes_on(c: LabCluster, host: int) -> dict[str, set[str]]:
    status, body = c.lab.in_host(host, request_json, HTTP, "GET", "/api/v1/routes")
    assert status == 200
    return {r["filter"]: set(r["nodes"]) for r in body["routes"]}


def sessions_on(c: LabCluster, host: int) -> int:
    return c.lab.in_host(host, request_json, HTTP, "GET", "/api/v1/status")[1]["sessions"]


def payloads(client: Client, prefix: str) -> list[str]:
    return [m.payload.decode() for m in list(client.messages.queue) if m.payload.decode().startswith(prefix)]


def test_both_sides_serve_and_the_heal_delivers_what_was_held(lab):
    c = lab
    side_b = [3, 4]
    # Persistent subscribers on each side; two client ids that will be used on both sides:
    # "twin" goes offline on side A (its queue grows there), "dual" stays connected.
    s_a = client_on(c, 1, "s-a", persistent=True)
    s_b = client_on(c, 3, "s-b", persistent=True)
    twin = client_on(c, 0, "twin", persistent=True)
    dual = client_on(c, 0, "dual", persistent=True)
    for s in (s_a, s_b):
        s.subscribe("split/#", 1)
    twin.subscribe("twin/#", 1)
    dual.subscribe("dual/#", 1)
    wanted = {"split/#": {"n1", "n3"}, "twin/#": {"n0"}, "dual/#": {"n0"}}
    wait_for(lambda: all({f: routes_on(c, i).get(f) for f in wanted} == wanted for i in range(N)), 15, "routes everywhere")
    twin.disconnect()
    p_a = client_on(c, 2, "p-a", persistent=False)
    p_b = client_on(c, 4, "p-b", persistent=False)

    c.lab.split(side_b)
    wait_for(lambda: all(c.sees_dead(i, side_b) for i in (0, 1, 2)) and all(c.sees_dead(i, [0, 1, 2]) for i in side_b),
             20, "each side holds the other dead")
    # Both sides keep serving: publish on each, QoS 1, all acknowledged.
    for i in range(40):
        p_a.publish("split/a", f"a:{i}".encode(), qos=1)
        p_b.publish("split/b", f"b:{i}".encode(), qos=1)
        p_a.publish("twin/x", f"ta:{i}".encode(), qos=1)  # queued on n0 for the offline twin
    wait_for(lambda: len(payloads(s_a, "a:")) == 40 and len(payloads(s_b, "b:")) == 40, 10, "same-side delivery")
    # Both client ids connect on side B too: their owner n0 is unreachable.
    twin_b = client_on(c, 4, "twin", persistent=True)
    dual_b = client_on(c, 3, "dual", persistent=True)
    twin_b.subscribe("twin/#", 1)
    dual_b.subscribe("dual/#", 1)
    for i in range(10):
        p_b.publish("twin/y", f"tb:{i}".encode(), qos=1)
    wait_for(lambda: len(payloads(twin_b, "tb:")) == 10, 10, "twin on side B served")

    c.lab.heal()
    wait_for(c.one_view, 15, "one view after the heal")
    # Route tables agree again (the bound: within 10 s of one view).
    wait_for(lambda: all(routes_on(c, i) == routes_on(c, 0) for i in range(1, N)), 10, "equal route tables")
    # Held messages crossed: in order per publisher, none lost, none twice.
    wait_for(lambda: len(payloads(s_a, "b:")) == 40 and len(payloads(s_b, "a:")) == 40, 20, "held messages delivered")
    assert payloads(s_a, "b:") == [f"b:{i}" for i in range(40)]
    assert payloads(s_b, "a:") == [f"a:{i}" for i in range(40)]
    assert payloads(s_a, "a:") == [f"a:{i}" for i in range(40)]
    # The newer connections (side B) win: the older "dual" is taken over (0x8E), and
    # what side A queued for "twin" is merged into its session on n4. One session each.
    rc, _ = dual.disconnects.get(timeout=15)
    assert rc.value == 0x8E
    wait_for(lambda: payloads(twin_b, "ta:") == [f"ta:{i}" for i in range(40)], 20, "side A's queue merged into n4's")
    # What n4 held for n0's twin route came back in the merge and was recognised: once only.
    assert payloads(twin_b, "tb:") == [f"tb:{i}" for i in range(10)]
    wait_for(lambda: sessions_on(c, 0) == 0, 15, "n0 holds no session any more")
    wait_for(lambda: all(routes_on(c, i).get("twin/#") == {"n4"} and routes_on(c, i).get("dual/#") == {"n3"}
                         for i in range(N)), 15, "each client id routed to its one session")
    c.assert_running()
    logs = {i: (c.base / f"n{i}.log").read_text() for i in range(N)}
    assert "messages=40" in held_lines(logs[2]) and held_lines(logs[4])  # held, not buffered
    assert "merged into n4" in logs[0] or "merged" in logs[4]


def held_lines(log: str) -> str:
    """The node's `held.replayed` lines (README "Logs")."""
    return "\n".join(line for line in log.splitlines() if " held.replayed " in line)


def test_split_during_a_session_handoff_loses_nothing_acknowledged(lab):
    c = lab
    mover = client_on(c, 1, "mover", persistent=True)
    mover.subscribe("mv/#", 1)
    wait_for(lambda: all(routes_on(c, i).get("mv/#") == {"n1"} for i in range(N)), 15, "mv/# routed to n1")
    mover.disconnect()
    pub = client_on(c, 2, "mv-pub", persistent=False)
    for i in range(20):
        pub.publish("mv/x", f"mv:{i}".encode(), qos=1)  # queued on n1
    moved = Client("mover", version=5, clean=False)
    moved.c.reconnect_delay_set(min_delay=300, max_delay=300)
    addr = c.lab.hosts[4].address
    outcome: dict = {}

    def reconnect() -> None:
        t0 = time.monotonic()
        outcome["flags"] = c.lab.in_host(4, lambda: moved.connect(1883, host=addr, expiry=3600))[0]
        outcome["took"] = time.monotonic() - t0

    t = threading.Thread(target=reconnect)
    t.start()
    c.lab.split([3, 4])  # while the takeover of n1's session by n4 runs
    t.join(15)
    assert "took" in outcome and outcome["took"] < 10, outcome  # never left hanging
    moved.subscribe("mv/#", 1)  # a no-op if the session came along, needed if not
    wait_for(lambda: all(c.sees_dead(i, [0, 1, 2]) for i in (3, 4)), 20, "side B holds side A dead")
    for i in range(20, 40):
        pub.publish("mv/x", f"mv:{i}".encode(), qos=1)  # acknowledged on side A during the split
    c.lab.heal()
    wait_for(c.one_view, 15, "one view after the heal")
    want = {f"mv:{i}" for i in range(40)}
    wait_for(lambda: set(payloads(moved, "mv:")) >= want, 30, "every acknowledged message reached the client")
    wait_for(lambda: all(routes_on(c, i).get("mv/#") == {"n4"} for i in range(N)), 20, "one session, on n4")
    fresh = [m.payload.decode() for m in list(moved.messages.queue) if not m.dup]
    assert len(fresh) == len(set(fresh)), "a message delivered twice without DUP"
