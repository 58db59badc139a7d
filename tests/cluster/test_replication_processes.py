"""Session replication between real `meshd` processes (issue 29): a persistent
session's queue survives kill -9 of its node and is taken over from the replica on
the node the client reconnects to.  The cases (in-flight resends, QoS 2, replacement,
degraded runs, a thousand seeds) are on the simulator (tests/cluster_sim/test_replication.py)."""

from __future__ import annotations

import time

from tests.cluster.test_membership_processes import view
from tests.cluster.test_mesh_processes import start_cluster, wait_route
from tests.support import Client, wait_for

QUEUED = 500


def test_500_acknowledged_messages_survive_kill9_of_the_owner(tmp_path):
    nodes = start_cluster(tmp_path, extra={n: ("--session-replicas", "2") for n in "ABC"})
    try:
        a, b, c = nodes["A"], nodes["B"], nodes["C"]
        for n in nodes.values():
            wait_for(lambda n=n: sum(v == "alive" for v in view(n).values()) == 3, what=f"{n.node_id} sees 3 alive")
        sub = Client("rep-sub", version=5, clean=False)
        sub.connect(a.port, expiry=3600)
        sub.subscribe("rep/q", 1)
        wait_route(nodes.values(), "rep/q", {"A"})
        sub.disconnect()
        pub = Client("rep-pub", version=5)
        pub.connect(b.port)
        started = time.monotonic()
        sent = [pub.publish("rep/q", str(i).encode(), qos=1, wait=False) for i in range(QUEUED)]
        for info in sent:
            info.wait_for_publish(30)  # every one PUBACKed
            assert info.is_published()
        publish_s = time.monotonic() - started
        a.kill()
        wait_for(lambda: view(c).get("A") != "alive", timeout=30, what="C sees A dead")
        again = Client("rep-sub", version=5, clean=False)
        flags, _, _ = again.connect(c.port, expiry=3600)
        assert flags.session_present
        got = again.expect(QUEUED, timeout=30)
        assert [int(m.payload) for m in got] == list(range(QUEUED)), f"published in {publish_s:.1f} s"
        again.expect_none(0.5)
        assert "taken over from the replica" in c.output()
    finally:
        for n in nodes.values():
            n.__exit__()

