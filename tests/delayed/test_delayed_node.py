"""Delayed publish on a real node (real sockets, real RocksDB) with paho-mqtt clients:
`$delayed/<seconds>/<topic>` arrives on the topic at its time, never before; list,
inspect and cancel through the HTTP API and `meshd ctl`; bad input refused with v5
reason codes while the connection stays; the ACL judges the target topic."""

from __future__ import annotations

import logging
import time

import pytest

from mesh.http_client import request_json
from mqtt import Publish, encode
from tests.mesh.test_broker_raw import Raw, recv_until_close
from tests.support import Client, run_cli, wait_for

MAX_DELAY = 600


@pytest.fixture
def delayed_node(node_factory, tmp_path):
    acl = tmp_path / "acl.toml"
    acl.write_text('[[rule]]\npermission = "deny"\naction = "publish"\ntopics = ["secret/#"]\n')
    return node_factory(delayed_max_delay=MAX_DELAY, acl_file=str(acl))


def api(node, method: str, path: str):
    return request_json(f"127.0.0.1:{node.ports['http']}", method, path)


def listed(node) -> list[dict]:
    status, body = api(node, "GET", "/api/v1/delayed?limit=1000")
    assert status == 200
    return body["data"]


def metric(node, name: str) -> float:
    status, text = api(node, "GET", "/metrics")
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no {name} in /metrics")


def acks(client: Client, n: int) -> list[int]:
    """The reason codes of the next `n` PUBACKs/PUBRECs paho reported."""
    return [client.published.get(timeout=10)[1].value for _ in range(n)]


@pytest.mark.parametrize("version", [5, 4])
def test_a_delayed_message_arrives_on_its_topic_at_its_time_not_before(delayed_node, version):
    sub = Client("sub", version=version)
    sub.connect(delayed_node.mqtt_port)
    sub.subscribe("x", 1)
    pub = Client("pub", version=version)
    pub.connect(delayed_node.mqtt_port)
    sent = time.time()
    pub.publish("$delayed/2/x", b"hello", qos=1)  # returns at the PUBACK: stored durably by then
    [row] = listed(delayed_node)
    assert row["topic"] == "x" and row["origin"] == "test-node" and row["qos"] == 1
    assert sent + 2 <= row["due_at"] <= time.time() + 2.001
    status, one = api(delayed_node, "GET", f"/api/v1/delayed/{row['id']}")
    assert status == 200 and one["id"] == row["id"] and one["due"] == row["due"]
    assert metric(delayed_node, "meshd_delayed_pending") == 1
    [msg] = sub.expect(1, timeout=10)
    arrived = time.time()
    assert msg.topic == "x" and msg.payload == b"hello"
    assert row["due_at"] <= arrived < row["due_at"] + 0.5
    assert listed(delayed_node) == []
    assert metric(delayed_node, "meshd_delayed_fired_total") == 1
    assert metric(delayed_node, "meshd_delayed_pending") == 0
    status, _ = api(delayed_node, "GET", f"/api/v1/delayed/{row['id']}")
    assert status == 404


def test_original_properties_go_with_it_and_expiry_counts_from_the_publish(delayed_node):
    sub = Client("sub", version=5)
    sub.connect(delayed_node.mqtt_port)
    sub.subscribe("props/#", 1)
    pub = Client("pub", version=5)
    pub.connect(delayed_node.mqtt_port)
    pub.publish("$delayed/1/props/gone", b"x", qos=1, properties={"MessageExpiryInterval": 1})
    pub.publish("$delayed/1/props/kept", b"y", qos=1, retain=True,
                properties={"MessageExpiryInterval": 60, "UserProperty": [("k", "v")], "ContentType": "text/plain"})
    [msg] = sub.expect(1, timeout=10)
    assert msg.topic == "props/kept" and msg.payload == b"y"
    assert msg.properties.UserProperty == [("k", "v")] and msg.properties.ContentType == "text/plain"
    assert 57 <= msg.properties.MessageExpiryInterval <= 59  # a second or more already went by
    assert metric(delayed_node, "meshd_delayed_expired_total") == 1
    late = Client("late", version=5)
    late.connect(delayed_node.mqtt_port)
    late.subscribe("props/kept", 1)
    assert late.expect(1)[0].retain  # published as retained, as it was sent


def test_cancel_through_the_api_and_through_meshd_ctl(delayed_node):
    http = f"127.0.0.1:{delayed_node.ports['http']}"
    sub = Client("sub", version=5)
    sub.connect(delayed_node.mqtt_port)
    sub.subscribe("c/#", 1)
    pub = Client("pub", version=5)
    pub.connect(delayed_node.mqtt_port)
    pub.publish("$delayed/60/c/api", b"1", qos=1)  # long enough for a meshd ctl process to start under load
    pub.publish("$delayed/60/c/ctl", b"2", qos=2)
    rows = {r["topic"]: r for r in listed(delayed_node)}
    assert set(rows) == {"c/api", "c/ctl"}
    out = run_cli(["ctl", "--http", http, "delayed", "list"])
    assert out.returncode == 0, out.stderr
    assert rows["c/api"]["id"] in out.stdout and "2 of 2 delayed messages" in out.stdout
    shown = run_cli(["ctl", "--http", http, "delayed", "show", rows["c/ctl"]["id"]])
    assert shown.returncode == 0 and "topic: c/ctl" in shown.stdout and "origin: test-node" in shown.stdout
    status, body = api(delayed_node, "DELETE", f"/api/v1/delayed/{rows['c/api']['id']}")
    assert status == 200 and body["cancelled"] == rows["c/api"]["id"]
    out = run_cli(["ctl", "--http", http, "delayed", "cancel", rows["c/ctl"]["id"]])
    assert out.returncode == 0 and f"cancelled {rows['c/ctl']['id']}" in out.stdout
    again = run_cli(["ctl", "--http", http, "delayed", "cancel", rows["c/ctl"]["id"]])
    assert again.returncode == 1 and "no such pending delayed message" in again.stderr
    assert listed(delayed_node) == []  # nothing left to fire (a cancelled one never fires: test_schedule)
    assert metric(delayed_node, "meshd_delayed_pending") == 0
    assert metric(delayed_node, "meshd_delayed_cancelled_total") == 2
    pub.publish("$delayed/1/c/control", b"3", qos=1)
    assert [m.topic for m in sub.expect(1, timeout=10)] == ["c/control"]
    assert metric(delayed_node, "meshd_delayed_fired_total") == 1
    assert run_cli(["ctl", "--http", http, "delayed", "show", "nonsense"]).returncode == 1


def test_bad_delayed_topics_get_reason_codes_and_the_v5_connection_stays(delayed_node):
    pub = Client("pub", version=5)
    pub.connect(delayed_node.mqtt_port)
    bad = {
        "$delayed/abc/x": 0x90, "$delayed/-1/x": 0x90, "$delayed/1.5/x": 0x90, "$delayed/5/": 0x90,
        "$delayed/5": 0x90, f"$delayed/{MAX_DELAY + 1}/x": 0x83,
        "$delayed/5/secret/plans": 0x87,  # the ACL judges the target topic
    }
    for topic in bad:
        pub.publish(topic, b"no", qos=1, wait=False)
    assert acks(pub, len(bad)) == list(bad.values())
    assert pub.disconnects.empty()
    pub.publish(f"$delayed/{MAX_DELAY}/ok", b"yes", qos=1, wait=False)
    assert acks(pub, 1) == [0]
    assert [r["topic"] for r in listed(delayed_node)] == ["ok"]
    assert metric(delayed_node, "meshd_delayed_refused_total") == len(bad) - 1  # the ACL's refusals count apart
    assert metric(delayed_node, "meshd_delayed_pending") == 1


def test_a_wildcard_target_gets_0x90_and_the_connection_stays(delayed_node):
    # Neither paho nor our encoder sends a wildcard in a PUBLISH topic: patched in the bytes.
    raw = Raw(delayed_node.mqtt_port)
    raw.connect()
    raw.send_bytes(encode(Publish(topic="$delayed/5/a/P/b", payload=b"x", qos=1, packet_id=1), 5).replace(b"/P/", b"/+/"))
    raw.send_bytes(encode(Publish(topic="$delayed/5/a/H", payload=b"x", qos=2, packet_id=2), 5).replace(b"/H", b"/#"))
    raw.send(Publish(topic="$delayed/5/a/b", payload=b"x", qos=1, packet_id=3))
    answers = [raw.recv() for _ in range(3)]
    assert [(type(p).__name__, p.packet_id, p.reason_code) for p in answers] == [
        ("Puback", 1, 0x90), ("Pubrec", 2, 0x90), ("Puback", 3, 0)]
    assert [r["topic"] for r in listed(delayed_node)] == ["a/b"]
    # Outside $delayed/ a wildcard in a PUBLISH topic is still malformed [MQTT-3.3.2-2].
    raw.send_bytes(encode(Publish(topic="a/P", payload=b"x", qos=1, packet_id=4), 5).replace(b"a/P", b"a/+"))
    assert [(type(p).__name__, p.reason_code) for p in recv_until_close(raw)] == [("Disconnect", 0x90)]


def test_v311_gets_a_plain_ack_a_log_line_and_nothing_stored(delayed_node, caplog):
    caplog.set_level(logging.INFO, logger="meshd.connection")
    pub = Client("old", version=4)
    pub.connect(delayed_node.mqtt_port)
    pub.publish("$delayed/abc/x", b"no", qos=1)  # 3.1.1 has no negative PUBACK
    pub.publish("$delayed/-1/x", b"no", qos=0)
    wait_for(lambda: sum("delayed publish refused" in r.getMessage() for r in caplog.records) == 2,
             what="two log lines")
    assert any("'$delayed/abc/x'" in r.getMessage() and "0x90" in r.getMessage() for r in caplog.records)
    assert listed(delayed_node) == []
    assert pub.disconnects.empty()


def test_listing_pages_in_due_order(delayed_node):
    pub = Client("pub", version=5)
    pub.connect(delayed_node.mqtt_port)
    for i, delay in enumerate([30, 10, 20, 40, 50]):
        pub.publish(f"$delayed/{delay}/p/{i}", b"", qos=1)
    status, first = api(delayed_node, "GET", "/api/v1/delayed?limit=2")
    assert [r["topic"] for r in first["data"]] == ["p/1", "p/2"] and first["meta"]["count"] == 5
    status, rest = api(delayed_node, "GET", f"/api/v1/delayed?limit=10&after={first['meta']['next']}")
    assert [r["topic"] for r in rest["data"]] == ["p/0", "p/3", "p/4"] and rest["meta"]["next"] is None
    assert api(delayed_node, "GET", "/api/v1/delayed?after=zzz")[0] == 400
    assert api(delayed_node, "GET", "/api/v1/delayed?limit=0")[0] == 400


def test_a_bad_max_delay_is_refused_at_start_naming_the_key(tmp_path):
    out = run_cli(["run", "--data-dir", str(tmp_path / "d"), "--delayed-max-delay", "-5", "--mqtt", "127.0.0.1:0"])
    assert out.returncode == 2 and "delayed_max_delay" in out.stderr
