"""Interop with Debian's mosquitto_pub / mosquitto_sub (installed by scripts/test)."""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest

from tests.support import Client

# Not skipped when missing: scripts/test installs mosquitto-clients, and CI must run these.
assert shutil.which("mosquitto_pub"), "mosquitto-clients missing: run scripts/test, which installs it"


def start_sub(port: int, topic: str, count: int, qos: int, version: str) -> subprocess.Popen:
    return subprocess.Popen(
        ["mosquitto_sub", "-h", "127.0.0.1", "-p", str(port), "-t", topic, "-q", str(qos),
         "-C", str(count), "-V", version, "-v", "-W", "20"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def wait_subscribed(node, count: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if node.call(lambda: node.node.broker.subscription_count()) >= count:
            return
        time.sleep(0.05)
    raise AssertionError("mosquitto_sub did not subscribe")


@pytest.mark.parametrize("version", ["mqttv311", "mqttv5"])
@pytest.mark.parametrize("qos", [0, 1, 2])
def test_mosquitto_pub_to_mosquitto_sub(node, version, qos):
    sub = start_sub(node.mqtt_port, "sensors/#", 3, qos, version)
    wait_subscribed(node, 1)
    for i in range(3):
        subprocess.run(
            ["mosquitto_pub", "-h", "127.0.0.1", "-p", str(node.mqtt_port), "-t", f"sensors/{i}",
             "-m", f"v{i}", "-q", str(qos), "-V", version],
            check=True, timeout=20,
        )
    out, err = sub.communicate(timeout=20)
    assert sub.returncode == 0, err
    assert out.splitlines() == [f"sensors/{i} v{i}" for i in range(3)]


def test_mosquitto_sub_gets_retained_from_paho(node):
    pub = Client("p", version=5)
    pub.connect(node.mqtt_port)
    pub.publish("state/door", b"open", qos=1, retain=True)
    out = subprocess.run(
        ["mosquitto_sub", "-h", "127.0.0.1", "-p", str(node.mqtt_port), "-t", "state/#", "-C", "1", "-v",
         "-V", "mqttv311", "-W", "10"],
        capture_output=True, text=True, timeout=20,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "state/door open"


def test_mosquitto_pub_to_paho_over_websocket(node):
    sub = Client("ws-sub", version=5, transport="websockets")
    sub.connect(node.ports["ws"])
    sub.subscribe("mixed/#", 1)
    subprocess.run(
        ["mosquitto_pub", "-h", "127.0.0.1", "-p", str(node.mqtt_port), "-t", "mixed/a", "-m", "hello", "-q", "1"],
        check=True, timeout=20,
    )
    (m,) = sub.expect(1)
    assert (m.topic, m.payload) == ("mixed/a", b"hello")
