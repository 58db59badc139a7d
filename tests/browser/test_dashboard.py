"""The dashboard in a real browser (issue 25): headless Chromium on the page of a
3-node cluster of real `meshd` processes. The member table shows three alive; a paho
client shows up in the client search and can be kicked; a cluster setting changed on
the page spreads; the WebSocket panel's messages reach a paho subscriber and the
reverse; a killed node shows suspect, then dead; with a token, only the login form
until the token is given. Each page is saved as a screenshot ($DASHBOARD_SCREENSHOTS or
the test's tmp dir, printed).

The tests of this module run in order on one cluster and one browser; the node is
killed last."""

from __future__ import annotations

import time

import pytest
from selenium.webdriver.common.by import By

from gossip.config import LAN
from mesh.http_client import request_json
from tests.browser.chrome import console_errors, screenshot_dir, start_chromium, wait_until
from tests.support import Client, MeshdProcess, free_port, start_all, wait_for

pytestmark = pytest.mark.browser

TOKEN = "dashboard-test-token-1f3e"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Three nodes with the default (LAN) gossip timing: a suspicion lasts seconds, long
    enough for a page that refreshes twice a second to show it."""
    base = tmp_path_factory.mktemp("dash")
    ports = [free_port() for _ in range(3)]
    nodes = [MeshdProcess(str(base / f"n{i}"), "--ws", "127.0.0.1:0", "--seed", f"127.0.0.1:{ports[0]}",
                          http=True, gossip_port=ports[i], node_id=f"n{i}") for i in range(3)]
    start_all(nodes)
    try:
        for n in nodes:
            wait_for(lambda n=n: alive_ids(n) == {"n0", "n1", "n2"}, what=f"{n.node_id} sees all three alive")
        yield nodes
    finally:
        for n in nodes:
            n.__exit__()


@pytest.fixture(scope="module")
def browser():
    chrome = start_chromium()
    try:
        yield chrome
    finally:
        chrome.quit()


@pytest.fixture(scope="module")
def screens(tmp_path_factory):
    return screenshot_dir(tmp_path_factory)


def alive_ids(node: MeshdProcess) -> set[str]:
    status, body = request_json(node.http_addr, "GET", "/api/v1/members")
    assert status == 200
    return {m["id"] for m in body["members"] if m["state"] == "alive"}


def open_page(browser, node: MeshdProcess, page: str) -> None:
    """Load the page afresh (a get of the URL already shown only moves to its hash)."""
    url = f"http://{node.http_addr}/#{page}"
    if browser.current_url == url:
        browser.refresh()
    else:
        browser.get(url)
    wait_until(browser, lambda: browser.find_element(By.ID, "page").get_attribute("data-page") == page, f"the {page} page")


# The pages redraw their tables on every refresh: read them in one script, never
# through element handles that a redraw makes stale.

def cells(browser, table_id: str) -> list[list[str]]:
    return browser.execute_script(
        "const t = document.getElementById(arguments[0]);"
        "return t ? [...t.querySelectorAll('tbody tr')].map((r) => [...r.cells].map((c) => c.innerText)) : [];",
        table_id)


def member_states(browser) -> dict[str, str]:
    return {row[0].removesuffix(" (this node)"): row[1] for row in cells(browser, "members")}


def text(browser, element_id: str) -> str:
    return browser.execute_script("const e = document.getElementById(arguments[0]); return e ? e.innerText : '';",
                                  element_id)


def click(browser, by: str, value: str) -> bool:
    """Click what may be redrawn meanwhile (wait_until retries a stale one)."""
    browser.find_element(by, value).click()
    return True


def test_the_cluster_page_shows_three_members_alive_with_their_last_contact(cluster, browser, screens):
    open_page(browser, cluster[0], "cluster")
    wait_until(browser, lambda: member_states(browser) == {"n0": "alive", "n1": "alive", "n2": "alive"}, "three alive")
    rows = {row[0].removesuffix(" (this node)"): row for row in cells(browser, "members")}
    assert rows["n1"][3] == cluster[1].gossip_addr  # the address
    assert rows["n1"][4].endswith("s ago")  # last contact: n0 hears from n1 every probe period
    assert rows["n0"][4] == "—"  # never from itself
    assert "No partition" in text(browser, "partition-summary")
    browser.save_screenshot(str(screens / "cluster.png"))
    assert console_errors(browser) == []


def test_a_paho_client_shows_up_in_the_client_search_and_can_be_kicked(cluster, browser, screens):
    paho = Client("paho-dash-1", version=5)
    paho.connect(cluster[1].port)  # on n1: the search is cluster-wide
    paho.subscribe("plant/+/temp", 1)
    open_page(browser, cluster[0], "clients")
    browser.find_element(By.ID, "client-search").send_keys("paho-dash")
    wait_until(browser, lambda: "paho-dash-1" in text(browser, "clients"), "paho-dash-1 in the search")
    assert len(cells(browser, "clients")) == 1
    wait_until(browser, lambda: click(browser, By.LINK_TEXT, "paho-dash-1"), "a click on paho-dash-1")
    wait_until(browser, lambda: "plant/+/temp" in text(browser, "client-detail"), "its subscription in the detail")
    assert "on n1" in text(browser, "client-detail")
    browser.save_screenshot(str(screens / "clients.png"))

    wait_until(browser, lambda: click(browser, By.ID, "kick"), "a click on Kick")
    rc, _props = paho.disconnects.get(timeout=10)  # the broker closed the connection
    assert int(getattr(rc, "value", rc)) == 0x98  # administrative action
    paho.c.loop_stop()


def test_an_offline_session_is_found_with_its_queue_and_deleted(cluster, browser):
    away = Client("paho-away", version=5, clean=False)
    away.connect(cluster[2].port, expiry=600)
    away.subscribe("queued/#", 1)
    away.disconnect()
    pub = Client("paho-feeder", version=5)
    pub.connect(cluster[2].port)
    for i in range(3):
        pub.publish(f"queued/{i}", b"x", qos=1)
    pub.disconnect()
    open_page(browser, cluster[0], "clients")
    browser.find_element(By.ID, "client-search").send_keys("paho-away")
    wait_until(browser, lambda: click(browser, By.LINK_TEXT, "paho-away"), "a click on paho-away")
    wait_until(browser, lambda: "Queue (3, dropped 0)" in text(browser, "client-detail"), "its queue")
    assert [row[0] for row in cells(browser, "client-detail")] == ["queued/#", "queued/0", "queued/1", "queued/2"]
    wait_until(browser, lambda: click(browser, By.ID, "delete-session"), "a click on Delete session")
    wait_for(lambda: request_json(cluster[2].http_addr, "GET", "/api/v1/clients/paho-away")[0] == 404,
             what="the session deleted on n2")
    wait_until(browser, lambda: cells(browser, "clients") == [], "the search finds nothing")


def test_the_node_page_shows_this_nodes_load_and_store(cluster, browser, screens):
    sub = Client("node-page-sub", version=5, clean=False)
    sub.connect(cluster[0].port, expiry=600)
    sub.subscribe("load/#", 1)
    pub = Client("node-page-pub", version=5)
    pub.connect(cluster[0].port)
    for i in range(40):
        pub.publish(f"load/{i % 4}", b"x" * 100, qos=1)
    sub.expect(40)
    open_page(browser, cluster[0], "node")
    wait_until(browser, lambda: text(browser, "tile-store-size").endswith("B"), "the RocksDB size")
    wait_until(browser, lambda: float(text(browser, "tile-rate-in") or 0) > 0, "a rate of messages in")
    assert text(browser, "tile-clients") == "2"
    assert browser.find_element(By.ID, "rates-chart").size["height"] > 100
    browser.save_screenshot(str(screens / "node.png"))
    pub.disconnect()
    sub.disconnect()


def test_the_routes_page_shows_filters_and_route_versions_per_origin(cluster, browser, screens):
    sub = Client("routes-sub", version=4)
    sub.connect(cluster[2].port)
    sub.subscribe("site/+/alarm", 1)
    open_page(browser, cluster[0], "routes")
    wait_until(browser, lambda: ["site/+/alarm", "n2"] in cells(browser, "routes"), "n2's route on n0")
    assert {row[0] for row in cells(browser, "route-versions")} == {"n0", "n1", "n2"}
    browser.save_screenshot(str(screens / "routes.png"))
    sub.disconnect()


def test_a_cluster_setting_changed_on_the_config_page_spreads_to_every_node(cluster, browser, screens):
    open_page(browser, cluster[0], "config")
    # focus stops the redraws under the edit box (a redraw may come before it)
    wait_until(browser, lambda: browser.find_element(By.ID, "set-max_queued_messages").send_keys("4321") or
               browser.find_element(By.ID, "set-max_queued_messages").get_attribute("value") == "4321", "typing")
    browser.find_element(By.ID, "apply-max_queued_messages").click()
    wait_until(browser, lambda: "max_queued_messages set to 4321" in text(browser, "config-message"), "the answer")
    for node in cluster:
        wait_for(lambda node=node: request_json(node.http_addr, "GET", "/api/v1/config/max_queued_messages")[1]
                 .get("value") == 4321, what=f"{node.node_id} has the new value")
    wait_until(browser, lambda: "cluster (from n0)" in text(browser, "config"), "the source shown as cluster")
    browser.save_screenshot(str(screens / "config.png"))
    open_page(browser, cluster[2], "config")  # and n2's page shows it came from n0
    wait_until(browser, lambda: ["max_queued_messages", "4321", "cluster (from n0)"] in
               [row[:3] for row in cells(browser, "config")], "the value on n2's page")


def test_the_websocket_panel_publishes_to_paho_and_receives_from_paho(cluster, browser, screens):
    listener = Client("paho-listener", version=4)
    listener.connect(cluster[2].port)
    listener.subscribe("dash/from-page", 1)
    open_page(browser, cluster[0], "websocket")
    wait_until(browser, lambda: browser.find_element(By.ID, "ws-url").get_attribute("value").startswith("ws://"), "the URL")
    assert browser.find_element(By.ID, "ws-url").get_attribute("value").endswith(f":{cluster[0].ready['ports']['ws']}/mqtt")
    browser.find_element(By.ID, "ws-connect").click()
    wait_until(browser, lambda: text(browser, "ws-state").startswith("connected"), "the panel connected")

    sub_topic = browser.find_element(By.ID, "ws-sub-topic")
    sub_topic.clear()
    sub_topic.send_keys("dash/from-paho")
    browser.find_element(By.CSS_SELECTOR, "#ws-sub-qos option[value='1']").click()
    browser.find_element(By.ID, "ws-subscribe").click()
    wait_until(browser, lambda: "subscribed to dash/from-paho (QoS 1)" in text(browser, "ws-log"), "the SUBACK")

    for element_id, value in (("ws-pub-topic", "dash/from-page"), ("ws-pub-payload", "hello from chromium")):
        field = browser.find_element(By.ID, element_id)
        field.clear()
        field.send_keys(value)
    browser.find_element(By.CSS_SELECTOR, "#ws-pub-qos option[value='1']").click()
    browser.find_element(By.ID, "ws-publish").click()
    (message,) = listener.expect(1)  # page (n0, WebSocket) -> paho (n2, TCP)
    assert (message.topic, message.payload, message.qos) == ("dash/from-page", b"hello from chromium", 1)
    wait_until(browser, lambda: "(acknowledged)" in text(browser, "ws-log"), "the PUBACK")

    talker = Client("paho-talker", version=5)
    talker.connect(cluster[1].port)
    talker.publish("dash/from-paho", b"hello from paho", qos=1)  # paho (n1) -> page (n0)
    wait_until(browser, lambda: "dash/from-paho [QoS 1] hello from paho" in text(browser, "ws-log"), "paho's message")
    browser.save_screenshot(str(screens / "websocket.png"))
    talker.disconnect()
    listener.disconnect()
    assert console_errors(browser) == []


def test_the_rules_page_lists_a_rule_and_inspects_it(cluster, browser, screens):
    rule = {"id": "dash-rule", "sql": 'SELECT payload FROM "plant/#"',
            "actions": [{"type": "republish", "topic": "seen/${topic}", "payload": "${payload}"}]}
    status, body = request_json(cluster[0].http_addr, "POST", "/api/v1/rules", rule)
    assert status == 201, body
    open_page(browser, cluster[0], "rules")
    wait_until(browser, lambda: any(row[0] == "dash-rule" for row in cells(browser, "features")), "the rule listed")
    wait_until(browser, lambda: click(browser, By.LINK_TEXT, "dash-rule"), "a click on the rule")
    wait_until(browser, lambda: 'SELECT payload FROM \\"plant/#\\"' in text(browser, "feature-detail"), "the rule inspected")
    browser.save_screenshot(str(screens / "rules.png"))
    assert request_json(cluster[0].http_addr, "DELETE", "/api/v1/rules/dash-rule")[0] == 200


def test_the_bridges_page_lists_a_bridge_and_inspects_it(cluster, browser, screens):
    bridge = {"id": "to-n1", "type": "mqtt", "url": f"mqtt://127.0.0.1:{cluster[1].port}", "egress": ["plant/#"]}
    status, body = request_json(cluster[0].http_addr, "POST", "/api/v1/bridges", bridge)
    assert status == 201, body
    open_page(browser, cluster[0], "bridges")
    wait_until(browser, lambda: any(row[0] == "to-n1" for row in cells(browser, "features")), "the bridge listed")
    wait_until(browser, lambda: click(browser, By.LINK_TEXT, "to-n1"), "a click on the bridge")
    wait_until(browser, lambda: f'"url": "mqtt://127.0.0.1:{cluster[1].port}"' in text(browser, "feature-detail"),
               "the bridge inspected")
    browser.save_screenshot(str(screens / "bridges.png"))
    assert request_json(cluster[0].http_addr, "DELETE", "/api/v1/bridges/to-n1")[0] == 200


def test_the_delayed_page_lists_a_pending_delayed_message_and_inspects_it(cluster, browser, screens):
    pub = Client("delayer", version=5)
    pub.connect(cluster[0].port)
    pub.publish("$delayed/600/later/report", b"in ten minutes", qos=1)
    pub.disconnect()
    open_page(browser, cluster[0], "delayed")
    wait_until(browser, lambda: len(cells(browser, "features")) == 1, "the pending message listed")
    message_id = cells(browser, "features")[0][0]
    wait_until(browser, lambda: click(browser, By.LINK_TEXT, message_id), "a click on it")
    wait_until(browser, lambda: '"later/report"' in text(browser, "feature-detail"), "the message inspected")
    browser.save_screenshot(str(screens / "delayed.png"))
    assert request_json(cluster[0].http_addr, "DELETE", f"/api/v1/delayed/{message_id}")[0] == 200
    wait_until(browser, lambda: "none" in text(browser, "feature-list"), "the list empty once cancelled")


def test_the_streams_page_lists_a_stream_set_cluster_wide_with_this_nodes_count(cluster, browser, screens):
    status, body = request_json(cluster[0].http_addr, "PUT", "/api/v1/config/streams",
                                {"value": [{"filter": "telemetry/#", "max_age_s": 3600}]})
    assert status == 200, body
    wait_for(lambda: request_json(cluster[0].http_addr, "GET", "/api/v1/streams")[1]["streams"], what="the stream on n0")
    pub = Client("telemetry-pub", version=5)
    pub.connect(cluster[0].port)
    for i in range(5):
        pub.publish(f"telemetry/{i}", b"reading", qos=1)
    pub.disconnect()
    open_page(browser, cluster[0], "streams")
    wait_until(browser, lambda: click(browser, By.LINK_TEXT, "telemetry/#"), "a click on the stream")
    wait_until(browser, lambda: '"messages": 5' in text(browser, "feature-detail"), "the stream inspected, 5 messages")
    browser.save_screenshot(str(screens / "streams.png"))


# The panel's packet reader, fed a PUBLISH, a PUBACK and a PUBLISH with a two-byte
# length split at every offset, gives back the same three packets each time.
READER_SPLITS = """
const done = arguments[arguments.length - 1];
import("/ui/mqttws.js").then(({ PacketReader, publishPacket, readPublish }) => {
  const bytes = (text) => new TextEncoder().encode(text);
  const stream = new Uint8Array([...publishPacket(7, "a/b", bytes("hi"), 1, false), 0x40, 2, 0, 7,
                                 ...publishPacket(0, "long", bytes("x".repeat(300)), 0, true)]);
  const failures = [];
  for (let cut = 0; cut <= stream.length; cut++) {
    const reader = new PacketReader();
    const packets = [...reader.push(stream.slice(0, cut)), ...reader.push(stream.slice(cut))];
    const seen = packets.map((p) => (p.type === 3 ? { ...readPublish(p), payload: p.body.length } : { type: p.type }));
    const ok = packets.length === 3 && seen[0].topic === "a/b" && seen[0].id === 7 && seen[0].qos === 1 &&
               seen[1].type === 4 && seen[2].topic === "long" && seen[2].retain && readPublish(packets[2]).payload.length === 300;
    if (!ok || reader.buffer.length) failures.push(cut);
  }
  done({ length: stream.length, failures });
});
"""


def test_the_panels_packet_reader_takes_packets_split_at_every_offset(cluster, browser):
    open_page(browser, cluster[0], "websocket")
    result = browser.execute_async_script(READER_SPLITS)
    assert result["length"] > 300 and result["failures"] == []


def test_with_a_token_only_the_login_form_shows_until_the_token_is_given(browser, screens, tmp_path):
    with MeshdProcess(str(tmp_path / "locked"), "--api-token", TOKEN, http=True, node_id="locked") as node:
        browser.get(f"http://{node.http_addr}/")
        wait_until(browser, lambda: browser.find_element(By.ID, "login").is_displayed(), "the login form")
        assert not browser.find_element(By.ID, "nav").is_displayed()
        assert not browser.find_element(By.ID, "page").is_displayed()
        browser.save_screenshot(str(screens / "login.png"))

        browser.find_element(By.ID, "token").send_keys("wrong")
        browser.find_element(By.CSS_SELECTOR, "#login button").click()
        wait_until(browser, lambda: "refused" in text(browser, "login-error"), "the refusal")
        assert not browser.find_element(By.ID, "nav").is_displayed()

        browser.find_element(By.ID, "token").send_keys(TOKEN)
        browser.find_element(By.CSS_SELECTOR, "#login button").click()
        wait_until(browser, lambda: member_states(browser) == {"locked": "alive"}, "the cluster page, logged in")
        assert TOKEN not in browser.current_url
        browser.find_element(By.ID, "logout").click()
        wait_until(browser, lambda: browser.find_element(By.ID, "login").is_displayed(), "the login form again")
        assert TOKEN not in node.output()  # no secret in the node's log
        browser.execute_script("sessionStorage.clear()")


def test_a_killed_node_shows_suspect_then_dead_within_the_detection_time(cluster, browser, screens):
    open_page(browser, cluster[0], "cluster")
    browser.find_element(By.CSS_SELECTOR, "#refresh option[value='500']").click()
    wait_until(browser, lambda: member_states(browser).get("n2") == "alive", "n2 alive")
    cluster[2].kill()
    killed = time.monotonic()
    # The worst case at LAN timing: a probe period and its timeout, then the longest
    # suspicion (a lone accuser), then a refresh of the page.
    detection = LAN.probe_interval + LAN.probe_timeout + LAN.suspicion_mult * LAN.suspicion_max_timeout_mult * LAN.probe_interval + 1
    wait_until(browser, lambda: member_states(browser).get("n2") == "suspect", "n2 suspect", timeout=detection)
    browser.save_screenshot(str(screens / "cluster-suspect.png"))
    wait_until(browser, lambda: member_states(browser).get("n2") == "dead", "n2 dead", timeout=detection)
    assert time.monotonic() - killed < detection
    assert member_states(browser) == {"n0": "alive", "n1": "alive", "n2": "dead"}
    # n0 and n1 lost n2: a partition, current and in the history, n2 on the other side
    wait_until(browser, lambda: [row[2:5] for row in cells(browser, "partitions")] == [["n0, n1", "n2", "majority"]],
               "the partition")
    wait_until(browser, lambda: [row[1:4] for row in cells(browser, "partition-history")] == [["detected", "n0/1", "n2"]],
               "the partition's history")
    browser.save_screenshot(str(screens / "cluster-dead.png"))
