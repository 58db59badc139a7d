"""Rules on a real node with real paho clients: a rule from the config republishes
what its WHERE selects; a rule added through the HTTP API runs at once; bad rules are
refused with the reason and change nothing; per-rule metrics in the API and /metrics."""

from __future__ import annotations

import json
from typing import Any, Callable

from mesh.http_client import request_json
from tests.support import Client, RunningNode, run_cli

ALERT_RULE = {
    "id": "hot",
    "sql": 'SELECT payload.temp AS t, clientid, topic FROM "sensors/+/temp" WHERE t > 30',
    "actions": [{"type": "republish", "topic": "alerts/${clientid}", "payload": "${clientid} ${t} on ${topic}", "qos": 1},
                {"type": "log"}],
}


def _api(node: RunningNode, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    return request_json(f"127.0.0.1:{node.ports['http']}", method, path, body)


def test_a_config_rule_republishes_over_real_sockets(node_factory: Callable[..., RunningNode]) -> None:
    node = node_factory(rules=json.dumps([ALERT_RULE]))
    watcher = Client("watcher")
    watcher.connect(node.mqtt_port)
    watcher.subscribe("alerts/#", qos=1)
    sensor = Client("sensor-7")
    sensor.connect(node.mqtt_port)
    sensor.publish("sensors/7/temp", json.dumps({"temp": 25}), qos=1)
    sensor.publish("sensors/7/temp", json.dumps({"temp": 31.5}), qos=1)
    sensor.publish("sensors/7/humidity", json.dumps({"temp": 99}), qos=1)  # not a source of the rule
    sensor.publish("sensors/7/temp", "not json", qos=1)  # fails the rule, counted, the publish goes on
    got = watcher.expect(1)
    assert got[0].topic == "alerts/sensor-7"
    assert got[0].payload == b"sensor-7 31.5 on sensors/7/temp"
    assert got[0].qos == 1
    watcher.expect_none()
    status, body = _api(node, "GET", "/api/v1/rules/hot")
    assert status == 200
    assert body["metrics"] | {"last_error_at": None} == {
        "matched": 3, "passed": 1, "failed": 1, "actions_ok": 2, "actions_failed": 0,
        "last_error": "the payload is not JSON", "last_error_at": None}
    assert body["source"] == "file"
    status, text = request_json(f"127.0.0.1:{node.ports['http']}", "GET", "/metrics")
    assert 'meshd_rule_matched_total{rule="hot"} 3' in text
    assert 'meshd_rule_failed_total{rule="hot"} 1' in text
    sensor.disconnect()
    watcher.disconnect()


def test_api_rules_add_run_and_delete(node: RunningNode) -> None:
    status, body = _api(node, "GET", "/api/v1/rules")
    assert (status, body["rules"]) == (200, [])
    rule = {"id": "upper", "sql": "SELECT upper(payload) AS loud FROM \"in/#\" WHERE qos = 0",
            "actions": [{"type": "republish", "topic": "out/${topic}", "payload": "${loud}"}]}
    status, body = _api(node, "POST", "/api/v1/rules", rule)
    assert status == 201, body
    sub = Client("sub")
    sub.connect(node.mqtt_port)
    sub.subscribe("out/#")
    pub = Client("pub")
    pub.connect(node.mqtt_port)
    pub.publish("in/a", "hello", qos=0)
    pub.publish("in/a", "quiet", qos=1)  # WHERE qos = 0 does not hold
    [msg] = sub.expect(1)
    assert (msg.topic, msg.payload) == ("out/in/a", b"HELLO")
    sub.expect_none()
    status, body = _api(node, "DELETE", "/api/v1/rules/upper")
    assert status == 200
    pub.publish("in/a", "after", qos=0)
    sub.expect_none()
    assert _api(node, "GET", "/api/v1/rules/upper")[0] == 404
    pub.disconnect()
    sub.disconnect()


def test_bad_rules_are_refused_and_nothing_running_changes(node: RunningNode) -> None:
    assert _api(node, "POST", "/api/v1/rules", ALERT_RULE)[0] == 201
    cases = [
        ({**ALERT_RULE, "sql": "SELECT payload.temp AS t FROM WHERE t > 30"},
         "rule hot: cannot parse the rule's SQL at line 1, column 31: Expected table name but got 'WHERE'"),
        ({**ALERT_RULE, "sql": 'SELECT frobnicate(topic) FROM "a/#"'}, "rule hot: unknown function frobnicate at line 1, column 8"),
        ({**ALERT_RULE, "sql": 'SELECT nope FROM "a/#"'}, "rule hot: unknown field nope at line 1, column 8"),
        ({**ALERT_RULE, "actions": [{"type": "kafka", "topic": "t"}]}, "rule hot: action type 'kafka' is not available"),
        ({**ALERT_RULE, "actions": [{"type": "webhook", "url": "ftp://x"}]}, "rule hot: action 1 (webhook): url: a webhook needs"),
        ({**ALERT_RULE, "actions": [{"type": "republish"}]}, "rule hot: action 1 (republish): republish action: topic is required"),
        ({"id": "x y", "sql": "SELECT 1"}, "rule id 'x y': 1..128 of [A-Za-z0-9_.-] is required"),
    ]
    for rule, expected in cases:
        status, body = _api(node, "POST", "/api/v1/rules", rule)
        assert status == 400, (rule, body)
        assert body["error"].startswith(expected), body["error"]
    status, body = _api(node, "GET", "/api/v1/rules/hot")
    assert status == 200 and body["sql"] == ALERT_RULE["sql"]  # the running rule is unchanged


def test_an_event_rule_republishes_client_connects_and_drops(node: RunningNode) -> None:
    rule = {"id": "events", "sql": 'SELECT clientid, event, reason FROM "$events/client_connected", '
                                   '"$events/message_dropped" WHERE clientid <> \'watcher\'',
            "actions": [{"type": "republish", "topic": "events/${event}/${clientid}"}]}
    assert _api(node, "POST", "/api/v1/rules", rule)[0] == 201
    watcher = Client("watcher")
    watcher.connect(node.mqtt_port)
    watcher.subscribe("events/#")
    c = Client("dev-9")
    c.connect(node.mqtt_port)
    c.publish("nobody/listens", "x", qos=1)  # no subscriber: message.dropped, reason no_subscribers
    got = {m.topic: json.loads(m.payload) for m in watcher.expect(2)}
    assert got == {"events/client.connected/dev-9": {"clientid": "dev-9", "event": "client.connected", "reason": None},
                   "events/message.dropped/dev-9": {"clientid": "dev-9", "event": "message.dropped",
                                                   "reason": "no_subscribers"}}
    c.disconnect()
    watcher.disconnect()


def test_meshd_ctl_rules(node: RunningNode) -> None:
    http = f"127.0.0.1:{node.ports['http']}"
    out = run_cli(["ctl", "--http", http, "rules", "add", "fwd", 'SELECT topic FROM "a/#" WHERE qos = 1',
                   "--action", '{"type": "republish", "topic": "b/${topic}"}'])
    assert out.returncode == 0, out.stderr
    assert "fwd" in out.stdout and 'sql: SELECT topic FROM "a/#" WHERE qos = 1' in out.stdout
    listing = run_cli(["ctl", "--http", http, "rules"])
    assert listing.returncode == 0 and listing.stdout.splitlines()[0].split() == [
        "ID", "FROM", "MATCHED", "PASSED", "FAILED", "ACTIONS_OK", "ACTIONS_FAILED", "SOURCE"]
    assert listing.stdout.splitlines()[1].split() == ["fwd", "a/#", "0", "0", "0", "0", "0", "cluster"]
    bad = run_cli(["ctl", "--http", http, "rules", "add", "bad", 'SELECT nope() FROM "a/#"'])
    assert bad.returncode == 2 and "rule bad: unknown function nope at line 1, column 8" in bad.stderr
    gone = run_cli(["ctl", "--http", http, "rules", "delete", "fwd"])
    assert gone.returncode == 0 and "deleted rule fwd" in gone.stdout
    assert run_cli(["ctl", "--http", http, "rules", "show", "fwd"]).returncode == 1
