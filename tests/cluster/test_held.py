"""Held traffic: while a member is unreachable (here: frozen with SIGSTOP, so it neither
answers nor leaves), QoS >= 1 messages for its routes are held on the other nodes and
replayed, in order, when it is back."""

from __future__ import annotations

import os
import signal

from mesh.http_client import request_json
from tests.cluster.test_mesh_processes import cluster3, start_cluster, wait_route  # noqa: F401  (fixture)
from tests.cluster.test_membership_processes import view, wait_for
from tests.support import Client


def test_messages_for_an_unreachable_member_are_held_and_replayed(cluster3):
    a, b, c = cluster3["A"], cluster3["B"], cluster3["C"]
    sub = Client("held-sub", version=5, clean=False)
    sub.connect(a.port, expiry=3600)
    sub.subscribe("held/#", 1)
    wait_route(cluster3.values(), "held/#", {"A"})
    sub.disconnect()
    pub = Client("held-pub", version=5)
    pub.connect(c.port)
    os.kill(a.proc.pid, signal.SIGSTOP)
    try:
        for n in (b, c):
            wait_for(lambda n=n: view(n).get("A") == "dead", what=f"{n.node_id} sees A dead")
        for i in range(30):
            pub.publish(f"held/{i}", f"m{i}".encode(), qos=1)  # acknowledged: held on C's disk
        pub.publish("held/q0", b"not held", qos=0)
        metrics = request_json(c.http_addr, "GET", "/api/v1/status")[1]
        assert metrics["sessions"] >= 1
    finally:
        os.kill(a.proc.pid, signal.SIGCONT)
    for n in (b, c):
        wait_for(lambda n=n: view(n).get("A") == "alive", what=f"{n.node_id} sees A again")
    flags, _, _ = sub.connect(a.port, expiry=3600)
    assert flags.session_present
    got = sub.expect(30, timeout=20)
    assert [m.payload for m in got] == [f"m{i}".encode() for i in range(30)]
    sub.expect_none(0.5)  # QoS 0 is not held
    c.stop()
    assert "replaying 30 held messages" in c.output()  # they came from C's hold, not a link buffer


def test_operations_can_be_refused_during_a_netsplit(tmp_path):
    """allow_*_during_netsplit off on C.  A frozen alone: C is on the majority side and
    keeps serving (a crash must not stop the survivors).  A and B frozen: C is alone,
    on the minority side, and answers CONNECT with 0x88, SUBSCRIBE and PUBLISH with
    0x83; after the heal, all is accepted again."""
    strict = ("--no-allow-connect-during-netsplit", "--no-allow-subscribe-during-netsplit",
              "--no-allow-publish-during-netsplit")
    nodes = start_cluster(tmp_path, extra={"C": strict})
    cluster = lambda: request_json(c.http_addr, "GET", "/api/v1/cluster")[1]  # noqa: E731
    try:
        a, b, c = nodes["A"], nodes["B"], nodes["C"]
        wait_for(lambda: sum(v == "alive" for v in view(c).values()) == 3, what="C sees 3 alive")
        early = Client("early", version=5)
        early.connect(c.port)
        os.kill(a.proc.pid, signal.SIGSTOP)
        try:
            wait_for(lambda: cluster()["partitioned"], what="C sees a partition")
            assert cluster()["minority"] is False
            Client("during-majority", version=5).connect(c.port)
            assert [rc.value for rc in early.subscribe("m/#", 1)] == [1]
            os.kill(b.proc.pid, signal.SIGSTOP)
            try:
                # alone, C accuses only once Lifeguard lets it (its probes get no nacks)
                wait_for(lambda: cluster()["minority"], timeout=60, what="C sees itself in the minority")
                late = Client("late", version=5)
                try:
                    late.connect(c.port)
                    raise AssertionError("CONNECT accepted on the minority side")
                except ConnectionError as exc:
                    assert "Server unavailable" in str(exc)
                assert [rc.value for rc in early.subscribe("x/#", 1)] == [0x83]
                info = early.c.publish("x/y", b"no", qos=1)
                info.wait_for_publish(5)
                assert early.published.get(timeout=5)[1].value == 0x83
            finally:
                os.kill(b.proc.pid, signal.SIGCONT)
        finally:
            os.kill(a.proc.pid, signal.SIGCONT)
        wait_for(lambda: not cluster()["partitioned"], timeout=60, what="healed")
        assert [rc.value for rc in early.subscribe("x/#", 1)] == [1]
        Client("later", version=5).connect(c.port)
    finally:
        for n in nodes.values():
            n.__exit__()


def test_held_messages_survive_a_restart_of_the_holder(cluster3):
    a, b, c = cluster3["A"], cluster3["B"], cluster3["C"]
    sub = Client("held-restart", version=5, clean=False)
    sub.connect(a.port, expiry=3600)
    sub.subscribe("kept/#", 1)
    wait_route(cluster3.values(), "kept/#", {"A"})
    sub.disconnect()
    os.kill(a.proc.pid, signal.SIGSTOP)
    try:
        wait_for(lambda: view(c).get("A") == "dead", what="C sees A dead")
        pub = Client("kept-pub", version=5)
        pub.connect(c.port)
        for i in range(10):
            pub.publish(f"kept/{i}", f"k{i}".encode(), qos=1)
        pub.disconnect()
        c.kill()  # no clean shutdown: the held messages must already be on disk
        c.start()
        wait_for(lambda: view(c).get("B") == "alive", what="C back in the cluster")
    finally:
        os.kill(a.proc.pid, signal.SIGCONT)
    flags, _, _ = sub.connect(a.port, expiry=3600)
    got = sub.expect(10, timeout=30)
    assert [m.payload for m in got] == [f"k{i}".encode() for i in range(10)]
