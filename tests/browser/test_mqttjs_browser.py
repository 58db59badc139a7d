"""MQTT.js's browser bundle in headless Chromium (issue 25): the bundle from the npm
install of tests/js (`npm ci` in scripts/test; node_modules/mqtt/dist/mqtt.min.js,
never copied into the tree) loaded into a local page, connecting over ws:// to a
3-node cluster of real `meshd` processes: QoS 1 messages published on node A's
WebSocket listener arrive, in order and at QoS 1, at a subscriber on node C's, at
MQTT 3.1.1 and 5.0."""

from __future__ import annotations

from pathlib import Path

import pytest

from mesh.http_client import request_json
from tests.browser.chrome import console_errors, start_chromium
from tests.support import MeshdProcess, free_port, start_all, wait_for

pytestmark = pytest.mark.browser

BUNDLE = Path(__file__).parent.parent / "js" / "node_modules" / "mqtt" / "dist" / "mqtt.min.js"
MESSAGES = 20

# Step 1: a subscriber on C; resolves once the SUBACK is in. State stays in `window`.
SUBSCRIBE = """
const [url, topic, version, done] = arguments;
window.received = [];
const sub = window.sub = mqtt.connect(url, {clientId: `browser-c-${version}`, protocolVersion: version, reconnectPeriod: 0});
sub.on("error", (err) => done({error: String(err)}));
sub.on("message", (t, payload, packet) => window.received.push([t, payload.toString(), packet.qos]));
sub.on("connect", () => sub.subscribe(topic, {qos: 1}, (err, granted) => done(err ? {error: String(err)} : granted[0].qos)));
"""

# Step 2: a publisher on A sends QoS 1 messages (each awaited: its PUBACK), then waits
# until C's subscriber has them all.
PUBLISH = """
const [url, topic, version, count, done] = arguments;
const pub = mqtt.connect(url, {clientId: `browser-a-${version}`, protocolVersion: version, reconnectPeriod: 0});
pub.on("error", (err) => done({error: String(err)}));
pub.on("connect", async () => {
  for (let i = 0; i < count; i++) await pub.publishAsync(topic, `m${i}`, {qos: 1});
  const deadline = Date.now() + 10000;
  while (window.received.length < count && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
  pub.end(true);
  window.sub.end(true);
  done({received: window.received});
});
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    base = tmp_path_factory.mktemp("mqttjs-browser")
    ports = [free_port() for _ in range(3)]
    nodes = [MeshdProcess(str(base / name), "--ws", "127.0.0.1:0", "--gossip-preset", "local",
                          "--seed", f"127.0.0.1:{ports[0]}", http=True, gossip_port=ports[i], node_id=name)
             for i, name in enumerate("ABC")]
    start_all(nodes)
    try:
        for n in nodes:
            wait_for(lambda n=n: len([m for m in request_json(n.http_addr, "GET", "/api/v1/members")[1]["members"]
                                      if m["state"] == "alive"]) == 3, what=f"{n.node_id} sees three alive")
        yield nodes
    finally:
        for n in nodes:
            n.__exit__()


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """Chromium on a local page that loads MQTT.js's browser bundle from the npm install."""
    assert BUNDLE.is_file(), "MQTT.js is missing: run scripts/test (npm ci in tests/js)"
    html = tmp_path_factory.mktemp("page") / "mqttjs.html"
    html.write_text(f'<!doctype html><title>MQTT.js</title><script src="{BUNDLE.as_uri()}"></script>\n')
    chrome = start_chromium()
    try:
        chrome.set_script_timeout(30)
        chrome.get(html.as_uri())
        assert chrome.execute_script("return typeof mqtt.connect") == "function"
        yield chrome
    finally:
        chrome.quit()


def ws_url(node: MeshdProcess) -> str:
    return f"ws://127.0.0.1:{node.ready['ports']['ws']}/mqtt"


@pytest.mark.parametrize("version", [4, 5])
def test_mqttjs_in_chromium_round_trips_qos1_from_node_a_to_node_c(cluster, page, version):
    a, _, c = cluster
    topic = f"browser/roundtrip/{version}"
    assert page.execute_async_script(SUBSCRIBE, ws_url(c), topic, version) == 1
    # A forwards to C once C's route has reached A.
    wait_for(lambda: {"filter": topic, "nodes": ["C"]} in request_json(a.http_addr, "GET", "/api/v1/routes")[1]["routes"],
             what="C's route on A")
    result = page.execute_async_script(PUBLISH, ws_url(a), topic, version, MESSAGES)
    assert result.get("received") == [[topic, f"m{i}", 1] for i in range(MESSAGES)], result
    assert console_errors(page) == []
