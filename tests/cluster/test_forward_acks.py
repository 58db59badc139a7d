"""A forwarded QoS 1 publish is acknowledged by the receiving node under the same rule
as a local one: in `batch` durability at once (the store's window bounds what a crash
may lose), in `sync` once what it wrote is synced."""

from __future__ import annotations

import time

import pytest

from tests.cluster.test_membership_processes import view, wait_for
from tests.cluster.test_mesh_processes import start_cluster, wait_route
from tests.support import Client

WINDOW_MS = 4000  # far longer than a forward's round trip: waiting for it would show


@pytest.mark.parametrize("mode", ["batch", "sync"])
def test_forwarded_publish_is_acknowledged_by_the_local_rule(tmp_path, mode):
    flags = ("--durability", mode, "--durability-batch-ms", str(WINDOW_MS))
    nodes = start_cluster(tmp_path, "AB", extra={"A": flags, "B": flags})
    try:
        a, b = nodes["A"], nodes["B"]
        for n in nodes.values():
            wait_for(lambda n=n: sum(v == "alive" for v in view(n).values()) == 2, what=f"{n.node_id} sees 2 alive")
        # A persistent subscriber on A: every forwarded message changes A's store.
        sub = Client("fwd-sub", version=5, clean=False)
        sub.connect(a.port, expiry=3600)
        sub.subscribe("fwd/+", 1)
        wait_route(nodes.values(), "fwd/+", {"A"})
        pub = Client("fwd-pub", version=5)
        pub.connect(b.port)
        waits = []
        for i in range(3):
            t0 = time.monotonic()
            pub.publish(f"fwd/{i}", str(i).encode(), qos=1)  # returns at the PUBACK
            waits.append(time.monotonic() - t0)
        assert [m.payload for m in sub.expect(3)] == [b"0", b"1", b"2"]
        if mode == "batch":
            # Waiting for A's window would take 2-4 s per message (ticks every 2 s).
            assert max(waits) < WINDOW_MS / 1000 / 4, waits
        sub.disconnect()
        pub.disconnect()
    finally:
        for n in nodes.values():
            n.__exit__()
