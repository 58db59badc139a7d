"""The node's HTTP API over a real socket."""

from __future__ import annotations

import re

from mesh.http_client import request_json
from tests.support import Client


def test_status(node):
    c = Client("api-client", version=5)
    c.connect(node.mqtt_port)
    status, body = request_json(f"127.0.0.1:{node.ports['http']}", "GET", "/api/v1/status")
    assert status == 200
    assert body["node_id"] == "test-node"
    assert body["connected_clients"] == 1
    assert body["uptime_s"] >= 0
    assert body["listeners"]["mqtt"]["address"] == f"127.0.0.1:{node.mqtt_port}"
    assert body["listeners"]["ws"]["path"] == "/mqtt"
    assert body["version"]


def test_metrics_count_traffic(node):
    sub = Client("s", version=5)
    sub.connect(node.mqtt_port)
    sub.subscribe("m", 1)
    pub = Client("p", version=4)
    pub.connect(node.mqtt_port)
    for _ in range(3):
        pub.publish("m", b"x", qos=1)
    sub.expect(3)
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{node.ports['http']}/metrics", timeout=5).read().decode()
    samples = dict(re.findall(r"^(meshd_[^\s]+) (\S+)$", text, re.M))
    assert samples['meshd_messages_received_total{qos="1"}'] == "3"
    assert samples['meshd_messages_sent_total{qos="1"}'] == "3"
    assert samples["meshd_connections"] == "2"
    assert float(samples["meshd_bytes_received_total"]) > 0
    assert "# TYPE meshd_messages_dropped_total counter" in text
