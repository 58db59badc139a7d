"""Held traffic: while a member is unreachable (here: frozen with SIGSTOP, so it neither
answers nor leaves), QoS >= 1 messages for its routes are held on the other nodes and
replayed, in order, when it is back."""

from __future__ import annotations

import os
import signal

from mesh.http_client import request_json
from tests.cluster.test_mesh_processes import cluster3, wait_route  # noqa: F401  (fixture)
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
