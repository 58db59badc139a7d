"""MQTT bridges against a real Mosquitto (Debian's package) started by the test on a free
port: egress and ingress with QoS kept, v3.1.1 and v5, and no echo loop when the
egress and ingress topics overlap."""

from __future__ import annotations

import json
from typing import Any, Callable

import pytest

from tests.bridges.mosquitto import Mosquitto
from tests.bridges.helpers import bridge_manager
from tests.support import Client, RunningNode, wait_for


def bridged_node(node_factory: Callable[..., RunningNode], **bridge: Any) -> RunningNode:
    return node_factory(bridges=json.dumps([bridge]))


def status(node: RunningNode, bridge_id: str) -> dict[str, Any]:
    """What GET /api/v1/bridges/<id> answers (read in the node's thread)."""
    assert node.node is not None
    bridges = bridge_manager(node.node)
    return node.call(bridges.describe, bridge_id)


def connected(node: RunningNode, bridge_id: str) -> bool:
    return status(node, bridge_id)["status"]["state"] == "connected"


@pytest.mark.parametrize("version", [4, 5])
def test_egress_and_ingress_keep_qos(mosquitto: Mosquitto, node_factory: Callable[..., RunningNode],
                                     version: int) -> None:
    node = bridged_node(node_factory, id="m", type="mqtt", url=mosquitto.url, protocol_version=version,
                        egress=["out/#"], ingress=["in/#"], remote_prefix="site/", local_prefix="cloud/")
    wait_for(lambda: connected(node, "m"), what="bridge connected")
    remote_sub = Client("remote-sub", version=version)
    remote_sub.connect(mosquitto.port)
    remote_sub.subscribe("site/#", qos=2)
    local_sub = Client("local-sub", version=5)
    local_sub.connect(node.mqtt_port)
    local_sub.subscribe("cloud/#", qos=2)
    pub = Client("pub", version=5)
    pub.connect(node.mqtt_port)
    for qos in (0, 1, 2):
        pub.publish(f"out/q{qos}", f"m{qos}".encode(), qos=qos)
    got = remote_sub.expect(3)
    assert sorted((m.topic, m.payload, m.qos) for m in got) == [
        ("site/out/q0", b"m0", 0), ("site/out/q1", b"m1", 1), ("site/out/q2", b"m2", 2)]
    # Ingress: the bridge's subscription asks for QoS 2, so each message keeps its own.
    wait_for(lambda: status(node, "m")["status"]["connects_total"] >= 1)
    remote_pub = Client("remote-pub", version=version)
    remote_pub.connect(mosquitto.port)
    for qos in (1, 2, 0):
        remote_pub.publish(f"in/q{qos}", f"r{qos}".encode(), qos=qos)
    got = local_sub.expect(3)
    assert sorted((m.topic, m.payload, m.qos) for m in got) == [
        ("cloud/in/q0", b"r0", 0), ("cloud/in/q1", b"r1", 1), ("cloud/in/q2", b"r2", 2)]
    # The remote's PUBACK may come after its subscriber had the message.
    wait_for(lambda: status(node, "m")["metrics"]["sent_total"] == 3, what="3 sent")
    described = status(node, "m")
    assert described["metrics"]["queued"] == 0 and described["status"]["received_total"] == 3


@pytest.mark.parametrize("version", [4, 5])
def test_no_echo_loop_when_egress_and_ingress_overlap(mosquitto: Mosquitto,
                                                      node_factory: Callable[..., RunningNode], version: int) -> None:
    node = bridged_node(node_factory, id="loop", type="mqtt", url=mosquitto.url, protocol_version=version,
                        egress=["loop/#"], ingress=["loop/#"])
    wait_for(lambda: connected(node, "loop"), what="bridge connected")
    remote = Client("remote", version=version)
    remote.connect(mosquitto.port)
    remote.subscribe("loop/#", qos=1)
    local = Client("local", version=5)
    local.connect(node.mqtt_port)
    local.subscribe("loop/#", qos=1)
    # Each step waits for what it causes, so a loop would show as an extra copy before the next one.
    local.publish("loop/a", b"A", qos=1)
    assert [m.payload for m in remote.expect(1)] == [b"A"]
    assert [m.payload for m in local.expect(1)] == [b"A"]
    if version == 4:  # 3.1.1 has no No Local: the remote sends it back and the echo filter drops it
        wait_for(lambda: status(node, "loop")["status"]["echoes_dropped"] == 1, what="the echo seen and dropped")
    remote.publish("loop/r", b"R", qos=1)
    assert [m.payload for m in remote.expect(1)] == [b"R"]
    assert [m.payload for m in local.expect(1)] == [b"R"]
    local.publish("loop/z", b"Z", qos=1)
    assert [m.payload for m in remote.expect(1)] == [b"Z"]
    assert [m.payload for m in local.expect(1)] == [b"Z"]
    # R came in through the bridge: never sent out again; A and Z went out once.
    wait_for(lambda: status(node, "loop")["metrics"]["sent_total"] == 2, what="A and Z acknowledged by the remote")
    assert status(node, "loop")["status"]["received_total"] == 1
    assert remote.messages.empty() and local.messages.empty()
