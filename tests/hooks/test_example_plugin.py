"""The example plugin (tests/plugins/example_plugin, installed by scripts/test) found
through the `meshd.plugins` entry-point group, on a real node with real paho clients:
every one of the 13 hook points is called; its refusals, changes and drops take
effect; its raise is logged, counted and skipped; `/api/v1/plugins` and `meshd ctl
plugins` list it. A plugin that fails to set up is listed as failed and the node runs."""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Callable

import pytest

from hooks import HookPoint
from mesh.http_client import request_json
from tests.support import Client, RunningNode, run_cli, wait_for


@pytest.fixture
def example_plugin() -> object:
    found = [ep for ep in entry_points(group="meshd.plugins") if ep.name == "example"]
    assert found, "the example plugin is not installed: pip install -e tests/plugins/example_plugin (scripts/test does)"
    module = found[0].load()
    module.SEEN.clear()
    return module


def test_every_hook_point_from_an_installed_plugin(node_factory: Callable[..., RunningNode], example_plugin: object) -> None:
    seen = example_plugin.SEEN  # type: ignore[attr-defined]
    node = node_factory(plugins="example")
    http = f"127.0.0.1:{node.ports['http']}"
    status, body = request_json(http, "GET", "/api/v1/plugins")
    assert status == 200
    [plugin] = body["plugins"]
    assert (plugin["name"], plugin["status"]) == ("example", "loaded")
    assert plugin["origin"].startswith("entry point meshd_example_plugin")
    assert {h["point"] for h in plugin["hooks"]} == {p.value for p in HookPoint}

    sub = Client("plugin-sub")
    sub.connect(node.mqtt_port)
    sub.subscribe("plugin/#", qos=1)
    pub = Client("plugin-pub")
    pub.connect(node.mqtt_port)
    pub.publish("plugin/upper", "shout", qos=1)
    pub.publish("plugin/drop", "gone", qos=1)
    pub.publish("plugin/boom", "still delivered", qos=1)
    info = pub.publish("plugin/forbidden", "no", qos=1)
    assert [(m.topic, m.payload) for m in sub.expect(2)] == [("plugin/upper", b"SHOUT"), ("plugin/boom", b"still delivered")]
    sub.expect_none()
    acks = dict(pub.published.get(timeout=5) for _ in range(4))  # mid -> the PUBACK's reason code
    assert acks[info.mid] == 0x87  # refused by the plugin's client.authorize
    sub.unsubscribe("plugin/#")

    refused = Client("plugin-refused")
    with pytest.raises(ConnectionError, match="Not authorized"):
        refused.connect(node.mqtt_port)
    denied = Client("plugin-denied-client")
    denied.c.username_pw_set("plugin-denied", "x")
    with pytest.raises(ConnectionError, match="Bad user name or password"):
        denied.connect(node.mqtt_port)
    sub.disconnect()
    pub.disconnect()

    wait_for(lambda: "plugin-sub" in seen["session.terminated"] and "plugin-pub:client_disconnect" in seen["client.disconnected"])
    assert "plugin-sub" in seen["client.connect"] and "plugin-refused" in seen["client.connect"]
    assert "plugin-sub:True" in seen["client.authenticate"]  # the password file's built-in verdict came first
    assert "plugin-pub:publish:plugin/forbidden" in seen["client.authorize"]
    assert "plugin-sub:subscribe:plugin/#" in seen["client.authorize"]
    assert "plugin-sub" in seen["client.connected"] and "plugin-sub" in seen["session.created"]
    assert "plugin-sub:plugin/#:1" in seen["session.subscribed"] and "plugin-sub:plugin/#" in seen["session.unsubscribed"]
    assert seen["message.publish"] == ["plugin/upper", "plugin/drop", "plugin/boom"]  # the forbidden one never got this far
    assert "plugin-sub:plugin/upper" in seen["message.delivered"] and "plugin-sub:plugin/upper" in seen["message.acked"]
    assert "plugin/drop:dropped_by_hook" in seen["message.dropped"]
    assert set(seen) == {p.value for p in HookPoint}

    status, text = request_json(http, "GET", "/metrics")
    assert 'meshd_plugin_errors_total{plugin="example"} 1' in text
    assert 'meshd_hook_errors_total{callback="example/on_publish"} 1' in text
    out = run_cli(["ctl", "--http", http, "plugins"])
    assert out.returncode == 0, out.stderr
    assert "example" in out.stdout and "loaded" in out.stdout and "message.publish" in out.stdout


def test_a_plugin_that_fails_to_set_up_is_listed_and_the_node_runs(node_factory: Callable[..., RunningNode]) -> None:
    node = node_factory(plugins="tests.plugins.faulty,no_such_plugin_anywhere")
    status, body = request_json(f"127.0.0.1:{node.ports['http']}", "GET", "/api/v1/plugins")
    assert [(p["name"], p["status"]) for p in body["plugins"]] == [("tests.plugins.faulty", "failed"),
                                                                  ("no_such_plugin_anywhere", "failed")]
    assert body["plugins"][0]["error"] == "RuntimeError: faulty plugin: cannot start"
    assert "ModuleNotFoundError" in body["plugins"][1]["error"]
    c = Client("still-up")
    c.connect(node.mqtt_port)
    c.disconnect()
