"""A bridge from one meshd to another (the remote side is our own broker: shared
ingress subscription, v5 No Local, QoS kept), and `meshd ctl bridges` over the API,
including a bridge to an unreachable host: its error shown, the node unaffected."""

from __future__ import annotations

import json
from typing import Any, Callable

from tests.bridges.helpers import bridge_manager
from tests.support import Client, RunningNode, run_cli, wait_for


def describe(node: RunningNode, bridge_id: str) -> Any:
    assert node.node is not None
    return node.call(bridge_manager(node.node).describe, bridge_id)


def test_bridge_to_another_meshd(node_factory: Callable[..., RunningNode]) -> None:
    remote = node_factory(node_id="remote")
    local = node_factory(node_id="local", bridges=json.dumps([{
        "id": "up", "type": "mqtt", "url": f"mqtt://127.0.0.1:{remote.mqtt_port}", "protocol_version": 5,
        "egress": ["tele/#"], "ingress": ["cmd/#"], "remote_prefix": "sites/a/"}]))
    wait_for(lambda: describe(local, "up")["status"]["state"] == "connected", what="bridge connected")
    remote_sub = Client("rs")
    remote_sub.connect(remote.mqtt_port)
    remote_sub.subscribe("sites/#", qos=2)
    local_sub = Client("ls")
    local_sub.connect(local.mqtt_port)
    local_sub.subscribe("cmd/#", qos=2)
    pub = Client("lp")
    pub.connect(local.mqtt_port)
    pub.publish("tele/1", b"t1", qos=1)
    pub.publish("tele/2", b"t2", qos=2)
    got = remote_sub.expect(2)
    assert [(m.topic, m.payload, m.qos) for m in got] == [("sites/a/tele/1", b"t1", 1), ("sites/a/tele/2", b"t2", 2)]
    # The remote meshd has the ingress as a shared subscription of the bridge's session.
    wait_for(lambda: remote.call(remote.node.broker.subscription_count) >= 2, what="the ingress subscription")  # type: ignore[union-attr]
    rpub = Client("rp")
    rpub.connect(remote.mqtt_port)
    rpub.publish("cmd/reboot", b"now", qos=1)
    got = local_sub.expect(1)
    assert [(m.topic, m.payload, m.qos) for m in got] == [("cmd/reboot", b"now", 1)]


def test_ctl_bridges_add_list_show_delete_and_an_unreachable_host(node_factory: Callable[..., RunningNode],
                                                                  tmp_path: Any) -> None:
    node = node_factory()
    http = f"127.0.0.1:{node.ports['http']}"
    table = tmp_path / "bridge.toml"
    # Port 1 on loopback: nothing listens, the connection is refused at once.
    table.write_text('[[bridges]]\nid = "nowhere"\ntype = "mqtt"\nurl = "mqtt://127.0.0.1:1"\negress = ["x/#"]\n'
                     'backoff_min_s = 0.05\nbackoff_max_s = 0.2\n')
    added = run_cli(["ctl", "--http", http, "bridges", "add", f"@{table}"])
    assert added.returncode == 0, added.stderr
    assert added.stdout.startswith("nowhere (mqtt mqtt://127.0.0.1:1, from cluster")
    wait_for(lambda: describe(node, "nowhere")["status"]["errors_total"] >= 2, what="retries with backoff")
    listed = run_cli(["ctl", "--http", http, "bridges"])
    assert listed.returncode == 0, listed.stderr
    row = [line for line in listed.stdout.splitlines() if line.startswith("nowhere")][0]
    assert "mqtt://127.0.0.1:1" in row and "refused" in row.lower()
    # The node goes on serving its clients meanwhile, and a publish on the egress is acknowledged (queued).
    c = Client("c")
    c.connect(node.mqtt_port)
    c.subscribe("x/#", qos=1)
    c.publish("x/1", b"kept", qos=1)
    assert [m.payload for m in c.expect(1)] == [b"kept"]
    shown = run_cli(["ctl", "--http", http, "--json", "bridges", "show", "nowhere"])
    body = json.loads(shown.stdout)
    assert body["metrics"]["queued"] == 1 and body["status"]["state"] in ("backoff", "connecting")
    bad = run_cli(["ctl", "--http", http, "bridges", "add", '{"id": "b", "type": "mqtt", "url": "ftp://x"}'])
    assert bad.returncode == 2 and "url:" in bad.stderr
    deleted = run_cli(["ctl", "--http", http, "bridges", "delete", "nowhere"])
    assert deleted.returncode == 0, deleted.stderr
    missing = run_cli(["ctl", "--http", http, "bridges", "show", "nowhere"])
    assert missing.returncode == 1 and "no such bridge" in missing.stderr


def test_the_config_listing_masks_a_cluster_bridges_password(node_factory: Callable[..., RunningNode]) -> None:
    node = node_factory()
    http = f"127.0.0.1:{node.ports['http']}"
    added = run_cli(["ctl", "--http", http, "bridges", "add",
                     '{"id": "secret", "type": "http", "url": "http://127.0.0.1:1/x", "password": "hunter2"}'])
    assert added.returncode == 0, added.stderr
    listing = run_cli(["ctl", "--http", http, "--json", "config", "list"])
    assert "hunter2" not in listing.stdout and "bridge/secret" in listing.stdout
    shown = run_cli(["ctl", "--http", http, "--json", "bridges", "show", "secret"])
    assert "hunter2" not in shown.stdout
