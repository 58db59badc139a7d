"""MQTT.js (npm `mqtt`) under Node against a real meshd process.

Issue 21: over ws://, publish a retained message, clear it with an empty retained
publish (an empty WebSocket message on the wire), and keep the connection.
Issue 25: over TCP and WebSocket, MQTT 3.1.1 and 5.0: QoS 0/1/2, retained, will,
session resume (interop.js). MQTT.js in a browser: tests/browser/test_mqttjs_browser.py.

MQTT.js comes from `scripts/test`, which runs `npm ci` here (tests/js/package.json and
package-lock.json; node_modules is git-ignored)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support import MeshdProcess

HERE = Path(__file__).parent
SCRIPT = HERE / "retained_clear.js"
INTEROP = HERE / "interop.js"


def node_with_mqttjs() -> str:
    node = shutil.which("node")
    assert node is not None, "Node.js is needed: scripts/test installs it"
    assert (HERE / "node_modules" / "mqtt").is_dir(), "MQTT.js is missing: run scripts/test (npm ci in tests/js)"
    return node


@pytest.fixture(scope="module")
def meshd(tmp_path_factory):
    # port 0: the ready file says which port the WebSocket listener got, once it listens
    with MeshdProcess(str(tmp_path_factory.mktemp("mqttjs")), "--ws", "127.0.0.1:0") as meshd:
        yield meshd


@pytest.fixture(scope="module")
def meshd_ws(meshd):
    return f"ws://127.0.0.1:{meshd.ready['ports']['ws']}/mqtt"


@pytest.mark.parametrize("version", ["4", "5", "3"])
def test_mqttjs_clears_a_retained_message_over_websocket_and_stays_connected(meshd_ws, version):
    node = node_with_mqttjs()
    out = subprocess.run([node, str(SCRIPT), meshd_ws, version], capture_output=True, text=True, timeout=60, cwd=HERE)
    assert out.stdout.strip(), out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["error"] is None, seen
    assert seen["closes"] == 0, seen  # the empty retained publish did not cost the connection
    assert seen["retained"] == [], seen  # and it cleared the retained message
    assert seen["echoed"] == "alive", seen
    assert out.returncode == 0, (seen, out.stderr)


@pytest.mark.parametrize("version", [4, 5])
@pytest.mark.parametrize("transport", ["tcp", "ws"])
def test_mqttjs_qos_retained_will_and_session_resume(meshd, meshd_ws, transport, version):
    url = f"mqtt://127.0.0.1:{meshd.port}" if transport == "tcp" else meshd_ws
    out = subprocess.run([node_with_mqttjs(), str(INTEROP), url, str(version)], capture_output=True, text=True,
                         timeout=90, cwd=HERE)
    assert out.returncode == 0 and out.stdout.strip(), out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    tag = f"{transport}-{version}"
    # each message at the QoS it was published with (the subscription granted 2)
    assert seen["qos"] == [["0", "at 0", 0], ["1", "at 1", 1], ["2", "at 2", 2]], seen
    assert seen["retained"] == {"topic": f"js/{tag}/retained", "payload": "kept", "qos": 1, "retain": True}, seen
    assert seen["will"] == {"topic": f"js/{tag}/will", "payload": "gone", "qos": 1, "retain": False}, seen
    # the session was found, and the messages queued while away came in order
    assert seen["resume"] == {"sessionPresent": True, "payloads": ["m1", "m2", "m3"]}, seen
