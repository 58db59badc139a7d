"""The node's HTTP API over a real socket."""

from __future__ import annotations

import re
import socket
import urllib.request

from mesh.http_client import request_json
from tests.support import wait_for
from tests.support import Client


def metrics_text(node) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{node.ports['http']}/metrics", timeout=5).read().decode()


def samples_of(text: str) -> dict[str, str]:
    """Prometheus text: sample name (with its labels) -> value."""
    return dict(re.findall(r"^(meshd_[^\s]+) (\S+)$", text, re.M))


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
    text = metrics_text(node)
    samples = samples_of(text)
    assert samples['meshd_messages_received_total{qos="1"}'] == "3"
    assert samples['meshd_messages_sent_total{qos="1"}'] == "3"
    assert samples["meshd_connections"] == "2"
    assert float(samples["meshd_bytes_received_total"]) > 0
    assert "# TYPE meshd_messages_dropped_total counter" in text



def test_metrics_count_malformed_gossip_by_reason(node):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendto(b"\xff" * 10, ("127.0.0.1", node.ports["gossip"]))  # not CBOR
    by_reason = 'meshd_gossip_malformed_by_reason_total{reason="not_cbor"}'
    wait_for(lambda: samples_of(metrics_text(node)).get(by_reason) == "1", 10, by_reason)
    assert samples_of(metrics_text(node))["meshd_gossip_malformed_total"] == "1"


def test_metrics_count_store_writes(node):
    """Messages queued for an offline persistent session are written (synced before the
    PUBACK in sync durability); the store's counters say so."""

    def store_samples() -> dict[str, float]:
        text = metrics_text(node)
        assert "# TYPE meshd_store_records_written_total counter" in text
        return {k: float(v) for k, v in samples_of(text).items()}

    sub = Client("away", version=5, clean=False)
    sub.connect(node.mqtt_port, expiry=600)
    sub.subscribe("w/#", 1)
    sub.disconnect()
    before = store_samples()
    pub = Client("p", version=5)
    pub.connect(node.mqtt_port)
    for i in range(5):
        pub.publish(f"w/{i}", b"x", qos=1)  # returns at the PUBACK: the queued record is synced
    after = store_samples()
    assert after['meshd_store_records_written_total{kind="delivery_put"}'] - before['meshd_store_records_written_total{kind="delivery_put"}'] == 5
    assert after["meshd_store_commits_total"] > before["meshd_store_commits_total"]
