"""`/api/v1/clients`, `/api/v1/clients/<id>`, `DELETE /api/v1/sessions/<id>` and
`/api/v1/subscriptions` on a real node, with real MQTT clients (paho).

The cluster-wide side (asking the other members, naming those that do not answer) is
tested on three processes in tests/cluster/test_inventory_processes.py.
"""

from __future__ import annotations

from urllib.parse import quote

import pytest

from mesh.http_client import request_json
from tests.support import wait_for
from tests.support import Client


def api(node, method: str, path: str):
    return request_json(f"127.0.0.1:{node.ports['http']}", method, path)


def get(node, path: str):
    status, body = api(node, "GET", path)
    assert status == 200, body
    return body


def clients_by_id(node, query: str = "") -> dict[str, dict]:
    return {c["clientid"]: c for c in get(node, "/api/v1/clients" + query)["data"]}


@pytest.fixture
def three_clients(node):
    """`live-1` (v5, keep alive 30, user alice) and `live-2` (v3.1.1) connected;
    `gone-1` a persistent v5 session whose client went away, with 2 queued messages."""
    live1 = Client("live-1", version=5)
    live1.c.username_pw_set("alice", "pw")
    live1.connect(node.mqtt_port, keepalive=30)
    live1.subscribe("plant/+/temp", 1, noLocal=True)
    live2 = Client("live-2", version=4)
    live2.connect(node.mqtt_port)
    live2.subscribe("plant/#", 0)
    gone = Client("gone-1", version=5)
    gone.connect(node.mqtt_port, expiry=600)
    gone.subscribe("plant/7/temp", 1)
    gone.disconnect()
    wait_for(lambda: not clients_by_id(node).get("gone-1", {"connected": True})["connected"], what="gone-1 offline")
    pub = Client("pub", version=5)
    pub.connect(node.mqtt_port)
    pub.publish("plant/7/temp", b"21", qos=1)
    pub.publish("plant/7/temp", b"22", qos=1)
    pub.disconnect()
    wait_for(lambda: "pub" not in clients_by_id(node), what="the publisher's clean session ends")
    yield live1, live2
    live1.disconnect()
    live2.disconnect()


def test_clients_lists_connections_and_kept_sessions(node, three_clients):
    body = get(node, "/api/v1/clients")
    assert body["missing"] == []
    assert body["meta"] == {"count": 3, "limit": 100, "next": None}
    rows = {c["clientid"]: c for c in body["data"]}
    assert [c["clientid"] for c in body["data"]] == ["gone-1", "live-1", "live-2"]  # sorted by client id
    live1 = rows["live-1"]
    assert live1["node"] == "test-node" and live1["connected"] is True
    assert live1["username"] == "alice"
    assert live1["ip_address"] == "127.0.0.1" and isinstance(live1["port"], int)
    assert live1["listener"] == "mqtt" and live1["proto_ver"] == 5
    assert live1["keepalive"] == 30 and live1["clean_start"] is True and live1["expiry_interval"] == 0
    assert live1["connected_at"].endswith("+00:00") and live1["disconnected_at"] is None
    assert live1["subscriptions_cnt"] == 1
    assert rows["live-2"]["proto_ver"] == 4 and rows["live-2"]["username"] is None
    gone = rows["gone-1"]
    assert gone["connected"] is False and gone["ip_address"] is None and gone["keepalive"] is None
    assert gone["expiry_interval"] == 600 and gone["disconnected_at"] is not None
    assert gone["mqueue_len"] == 2 and gone["inflight_cnt"] == 0


def test_clients_filters(node, three_clients):
    assert set(clients_by_id(node, "?connected=false")) == {"gone-1"}
    assert set(clients_by_id(node, "?connected=true")) == {"live-1", "live-2"}
    assert set(clients_by_id(node, "?clientid_prefix=live-")) == {"live-1", "live-2"}
    assert set(clients_by_id(node, "?username=alice")) == {"live-1"}
    assert set(clients_by_id(node, "?node=test-node&clientid_prefix=gone")) == {"gone-1"}
    body = get(node, "/api/v1/clients?node=no-such-node")
    assert body["data"] == [] and body["missing"] == [{"node": "no-such-node", "reason": "not a member"}]


def test_clients_pages_with_a_cursor(node, three_clients):
    seen = []
    after = ""
    for _ in range(3):
        body = get(node, f"/api/v1/clients?limit=1{after}")
        assert body["meta"]["count"] == 3 and len(body["data"]) == 1
        seen.append(body["data"][0]["clientid"])
        after = f"&after={body['meta']['next']}"
    assert seen == ["gone-1", "live-1", "live-2"]
    assert body["meta"]["next"] is None  # the last page says so
    two = get(node, "/api/v1/clients?limit=2")
    assert [c["clientid"] for c in two["data"]] == ["gone-1", "live-1"] and two["meta"]["next"]


@pytest.mark.parametrize("query, error", [
    ("limit=0", "limit"), ("limit=1001", "limit"), ("limit=x", "limit"),
    ("connected=maybe", "connected"), ("after=!!!", "cursor"),
])
def test_bad_query_is_400_naming_the_parameter(node, query, error):
    status, body = api(node, "GET", f"/api/v1/clients?{query}")
    assert status == 400 and error in body["error"]


def test_client_detail_shows_session_subscriptions_and_queue(node, three_clients):
    body = get(node, "/api/v1/clients/gone-1")
    assert body["clientid"] == "gone-1" and body["node"] == "test-node" and body["missing"] == []
    assert body["subscriptions"] == [{"topic": "plant/7/temp", "qos": 1, "nl": 0, "rap": 0, "rh": 0, "subid": None}]
    assert body["mqueue"] == [{"topic": "plant/7/temp", "qos": 1}] * 2
    assert body["inflight"] == []
    live = get(node, "/api/v1/clients/live-1")
    assert live["subscriptions"][0]["nl"] == 1 and live["connected"] is True
    status, body = api(node, "GET", "/api/v1/clients/nobody")
    assert status == 404 and "nobody" in body["error"] and body["missing"] == []


def test_client_ids_with_slashes_are_one_path_segment(node):
    c = Client("plant/7/sensor", version=5)
    c.connect(node.mqtt_port)
    assert get(node, "/api/v1/clients/" + quote("plant/7/sensor", safe=""))["clientid"] == "plant/7/sensor"
    c.disconnect()


def test_subscriptions_by_topic_name_or_exact_filter(node, three_clients):
    def subs(query: str) -> set[tuple[str, str]]:
        body = get(node, "/api/v1/subscriptions" + query)
        assert body["missing"] == []
        return {(s["clientid"], s["topic"]) for s in body["data"]}

    everyone = {("live-1", "plant/+/temp"), ("live-2", "plant/#"), ("gone-1", "plant/7/temp")}
    assert subs("") == everyone
    assert subs("?topic=plant/7/temp") == everyone  # who gets a message published there
    assert subs("?topic=plant/8/temp") == {("live-1", "plant/+/temp"), ("live-2", "plant/#")}
    assert subs("?topic=plant/7/humidity") == {("live-2", "plant/#")}
    assert subs("?topic=" + quote("plant/+/temp", safe="")) == {("live-1", "plant/+/temp")}  # a filter: exactly it
    assert subs("?clientid=gone-1") == {("gone-1", "plant/7/temp")}
    row = get(node, "/api/v1/subscriptions?clientid=live-1")["data"][0]
    assert row == {"clientid": "live-1", "node": "test-node", "topic": "plant/+/temp", "qos": 1, "nl": 1, "rap": 0,
                   "rh": 0, "subid": None}
    page = get(node, "/api/v1/subscriptions?limit=2")
    rest = get(node, f"/api/v1/subscriptions?limit=2&after={page['meta']['next']}")
    assert [s["topic"] for s in page["data"] + rest["data"]] == ["plant/#", "plant/+/temp", "plant/7/temp"]
    assert rest["meta"]["next"] is None


def test_delete_session_disconnects_the_client_and_forgets_it(node, three_clients):
    live1, _ = three_clients
    status, body = api(node, "DELETE", "/api/v1/sessions/live-1")
    assert status == 200 and body == {"deleted": "live-1", "nodes": ["test-node"], "missing": []}
    rc, _ = live1.disconnects.get(timeout=10)
    assert rc.value == 0x98  # administrative action
    assert "live-1" not in clients_by_id(node)
    assert {s["clientid"] for s in get(node, "/api/v1/subscriptions")["data"]} == {"live-2", "gone-1"}
    status, body = api(node, "DELETE", "/api/v1/sessions/gone-1")  # a session without a connection
    assert status == 200
    assert set(clients_by_id(node)) == {"live-2"}
    status, body = api(node, "DELETE", "/api/v1/sessions/gone-1")
    assert status == 404 and "gone-1" in body["error"]


def test_the_token_guards_the_new_endpoints(node_factory):
    node = node_factory(api_token="s3cret", api_open_reads=True)
    assert api(node, "GET", "/api/v1/clients")[0] == 200  # reads are open
    assert api(node, "DELETE", "/api/v1/sessions/x")[0] == 401  # a change is not
    status, _ = request_json(f"127.0.0.1:{node.ports['http']}", "DELETE", "/api/v1/sessions/x", token="s3cret")
    assert status == 404
