"""The password file, the ACL and $SYS as built-in users of the hook points, on a real
node: they are listed as callbacks of their points, and $SYS publishes each client's
connect and disconnect from client.connected / client.disconnected."""

from __future__ import annotations

import json
from typing import Any, Callable

from mesh.http_client import request_json
from tests.support import Client, RunningNode


def test_builtin_callbacks_are_listed_at_their_points(node_factory: Callable[..., RunningNode], tmp_path: Any) -> None:
    acl = tmp_path / "acl.toml"
    acl.write_text('[[rule]]\npermission = "deny"\naction = "publish"\ntopics = ["locked/#"]\n')
    node = node_factory(acl_file=str(acl), sys_interval=60)
    status, body = request_json(f"127.0.0.1:{node.ports['http']}", "GET", "/api/v1/plugins")
    assert status == 200 and body["plugins"] == []
    builtin = {(h["point"], h["callback"], h["priority"]) for h in body["hooks"]}
    assert builtin == {("client.authenticate", "builtin/password_file", 1000), ("client.authorize", "builtin/acl", 1000),
                       ("client.connected", "builtin/sys", 1000), ("client.disconnected", "builtin/sys", 1000)}
    c = Client("acl-c")
    c.connect(node.mqtt_port)
    info = c.publish("locked/door", "open", qos=1)
    acks = dict([c.published.get(timeout=5)])
    assert acks[info.mid] == 0x87  # the ACL, through client.authorize
    c.disconnect()


def test_sys_publishes_client_events_from_the_hooks(node_factory: Callable[..., RunningNode]) -> None:
    node = node_factory(sys_interval=60)
    watcher = Client("sys-watcher")
    watcher.connect(node.mqtt_port)
    watcher.subscribe("$SYS/brokers/+/clients/#")
    c = Client("device-1")
    c.connect(node.mqtt_port)
    c.disconnect()
    connected, disconnected = watcher.expect(2)
    assert connected.topic == "$SYS/brokers/test-node/clients/device-1/connected"
    body = json.loads(connected.payload)
    assert (body["clientid"], body["node"], body["proto_ver"], body["transport"]) == ("device-1", "test-node", 5, "tcp")
    assert disconnected.topic == "$SYS/brokers/test-node/clients/device-1/disconnected"
    assert json.loads(disconnected.payload)["reason"] == "client_disconnect"
    watcher.disconnect()
