"""Held traffic with real processes and real RocksDB: while a member is unreachable
(frozen with SIGSTOP, so it neither answers nor leaves), QoS >= 1 messages for its
routes are held on disk by the other nodes, survive a kill -9 of the holder, and are
replayed in order when the member is back.  Held traffic and netsplits in all their
cases are tested on the simulator (tests/cluster_sim/)."""

from __future__ import annotations

import os
import signal

from tests.cluster.test_mesh_processes import cluster3, wait_route  # noqa: F401  (fixture)
from tests.cluster.test_membership_processes import view
from tests.support import wait_for
from tests.support import Client


def test_held_messages_survive_a_restart_of_the_holder(cluster3):
    a, c = cluster3["A"], cluster3["C"]
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
