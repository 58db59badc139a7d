"""Session handoff between real `meshd` processes: a persistent client reconnects to
another node and finds its whole session there.  Handoff in all its cases (under load,
racing CONNECTs, a killed owner, flapping) is tested on the simulator (tests/cluster_sim/)."""

from __future__ import annotations

from mesh.http_client import request_json
from tests.cluster.test_mesh_processes import cluster3, wait_route  # noqa: F401  (fixture)
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


def test_offline_queue_moves_to_the_node_the_client_reconnects_to(cluster3):
    a, b, c = cluster3["A"], cluster3["B"], cluster3["C"]
    subscribed_then_offline(cluster3, a, "mover", "move/#")
    pub = Client("pub-c", version=5)
    pub.connect(c.port)
    for i in range(50):
        pub.publish(f"move/{i}", str(i).encode(), qos=1)
    again = persistent("mover")
    flags, _, _ = again.connect(b.port, expiry=3600)
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
