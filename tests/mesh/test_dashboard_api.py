"""What the dashboard reads and is served from (issue 25): its static files at `/`,
`GET /api/v1/node`, route versions per origin, held counts, last contact, and the
token: the files carry no data, the data needs the token. The page itself is tested
in a real browser in tests/browser/."""

from __future__ import annotations

import urllib.error
import urllib.request
from typing import Any

import trio

from clock import TrioClock
from mesh.broker import BrokerStats
from mesh.http_client import request_json
from mesh.node_stats import RateHistory, Sample, rates
from session_store.store import StoreStats
from tests.support import Client, wait_for


def get(node, path: str, headers: dict[str, str] | None = None) -> tuple[int, Any, bytes]:
    request = urllib.request.Request(f"http://127.0.0.1:{node.ports['http']}{path}", headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read()


def test_the_page_and_its_files_are_served_with_a_policy_that_keeps_them_to_their_own_origin(node):
    status, headers, body = get(node, "/")
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert b'<script type="module" src="/ui/app.js">' in body
    assert "default-src 'self'" in headers["Content-Security-Policy"]
    for name in ("app.js", "pages.js", "dom.js", "chart.js", "mqttws.js", "style.css"):
        status, headers, body = get(node, f"/ui/{name}")
        assert status == 200 and body, name
    status, _, _ = get(node, "/ui/secrets.txt")
    assert status == 404


def test_with_a_token_the_files_are_served_but_no_data_without_it(node_factory):
    node = node_factory(api_token="s3cret-token")
    status, _, body = get(node, "/")
    assert status == 200 and b'id="login"' in body  # the login form is in the page
    for path in ("/api/v1/node", "/api/v1/cluster", "/api/v1/routes", "/api/v1/config"):
        assert get(node, path)[0] == 401, path
    status, _, _ = get(node, "/api/v1/node", {"Authorization": "Bearer s3cret-token"})
    assert status == 200


def test_node_reports_inflight_queued_store_size_and_route_versions(node):
    away = Client("away", version=5, clean=False)
    away.connect(node.mqtt_port, expiry=600)
    away.subscribe("d/#", 1)
    away.disconnect()
    pub = Client("pub", version=5)
    pub.connect(node.mqtt_port)
    for i in range(4):
        pub.publish(f"d/{i}", b"x", qos=1)
    addr = f"127.0.0.1:{node.ports['http']}"
    status, body = request_json(addr, "GET", "/api/v1/node")
    assert status == 200, body
    assert body["queued"] == 4 and body["inflight"] == 0
    assert body["sessions"] == 2 and body["connected_clients"] == 1 and body["subscriptions"] == 1
    assert body["messages_in_total"] == 4
    assert body["store_records_written_total"] > 0
    assert body["store_size_bytes"] > 0  # RocksDB's files on disk
    assert body["sample_interval_s"] == 5.0 and isinstance(body["rates"], list)

    def routes() -> Any:
        body = request_json(addr, "GET", "/api/v1/routes")[1]
        return body if body["routes"] else None

    body = wait_for(routes, what="the local route in the table")
    assert body["routes"] == [{"filter": "d/#", "nodes": ["test-node"]}]
    assert body["versions"]["test-node"]["version"] >= 1

    status, body = request_json(addr, "GET", "/api/v1/cluster")
    assert body["held"] == {}
    assert [m["id"] for m in body["members"]] == ["test-node"]
    assert body["members"][0]["last_contact_s"] is None  # we never hear from ourselves

    status, body = request_json(addr, "GET", "/api/v1/config")
    assert "max_inflight" in body["cluster_keys"] and "data_dir" not in body["cluster_keys"]

    # Counting over every session (this page, $SYS every 10 s, the clients list) gives
    # an idle session neither a subscriptions nor an inflight dict (64 bytes each).
    assert request_json(addr, "GET", "/api/v1/clients")[0] == 200
    idle = node.call(lambda: node.node.broker.sessions["pub"])
    assert idle._subscriptions is None and idle._inflight is None


def sample(t: float, m_in: int, m_out: int, records: int) -> Sample:
    return Sample(t, m_in, m_out, records, records // 2)


def test_rates_are_per_second_between_consecutive_samples():
    out = rates([sample(100, 0, 0, 0), sample(105, 50, 100, 10), sample(110, 50, 130, 10)])
    assert out == [
        {"t": 105, "messages_in_per_s": 10.0, "messages_out_per_s": 20.0, "store_records_per_s": 2.0,
         "store_commits_per_s": 1.0},
        {"t": 110, "messages_in_per_s": 0.0, "messages_out_per_s": 6.0, "store_records_per_s": 0.0,
         "store_commits_per_s": 0.0},
    ]


def test_the_history_keeps_ten_minutes_of_samples():
    history = RateHistory(broker=None, store=None, clock=None)
    assert history.samples.maxlen == 121  # 120 rates of 5 s
    for t in range(200):
        history.samples.append(sample(t * 5.0, t, t, t))
    assert len(history.rates()) == 120 and history.rates()[0]["t"] == 5.0 * 80



async def test_the_history_samples_every_five_seconds_of_the_nodes_clock(autojump_clock):
    class Broker:
        stats = BrokerStats()

    class Store:
        stats = StoreStats()

    broker = Broker()
    history = RateHistory(broker=broker, store=Store(), clock=TrioClock(wall_epoch=0.0))  # wall time is virtual time
    async with trio.open_nursery() as nursery:
        nursery.start_soon(history.run)
        await trio.sleep(1)
        broker.stats.messages_in[1] += 50  # 50 messages in the first five seconds
        await trio.sleep(11)
        nursery.cancel_scope.cancel()
    assert [s.t for s in history.samples] == [0.0, 5.0, 10.0]
    assert [r["messages_in_per_s"] for r in history.rates()] == [10.0, 0.0]
