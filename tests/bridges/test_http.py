"""HTTP bridges and the webhook action against a small local HTTP server: messages
POSTed as JSON in order; a target answering 500 or hanging keeps them queued, shows the
error in the API and metrics and affects no other bridge; a 4xx drops the message
(counted); the webhook action goes through the same queue."""

from __future__ import annotations

import json
from typing import Any, Callable, Iterator

import pytest
import trio

from bridges.actions import bridge_factory, webhook_factory
from mesh.http_client import request_json
from tests.bridges.http_target import HttpTarget
from tests.bridges.helpers import bridge_manager
from tests.support import Client, RunningNode, wait_for


@pytest.fixture
def target() -> Iterator[HttpTarget]:
    t = HttpTarget().start()
    yield t
    t.stop()


def api(node: RunningNode, method: str, path: str, body: object = None) -> tuple[int, Any]:
    return request_json(f"127.0.0.1:{node.ports['http']}", method, path, body)


def bridge(node: RunningNode, bridge_id: str) -> dict[str, Any]:
    status, body = api(node, "GET", f"/api/v1/bridges/{bridge_id}")
    assert status == 200, body
    return body


def metric(node: RunningNode, name: str, bridge_id: str) -> float | None:
    _, text = api(node, "GET", "/metrics")
    for line in str(text).splitlines():
        if line.startswith(f'{name}{{bridge="{bridge_id}"}} '):
            return float(line.split()[-1])
    return None


def test_http_bridge_posts_in_order_and_survives_500_and_hangs(node_factory: Callable[..., RunningNode],
                                                               target: HttpTarget) -> None:
    other = HttpTarget().start()
    try:
        node = node_factory(bridges=json.dumps([
            {"id": "hook", "type": "http", "url": target.url, "egress": ["h/#"], "headers": {"X-Token": "t1"},
             "timeout_s": 0.5, "backoff_min_s": 0.05, "backoff_max_s": 0.2},
            {"id": "other", "type": "http", "url": other.url, "egress": ["h/#"]},
        ]))
        pub = Client("pub", version=5)
        pub.connect(node.mqtt_port)
        pub.publish("h/1", b"one", qos=1)
        wait_for(lambda: len(target.received) == 1, what="first POST")
        assert target.received[0]["topic"] == "h/1" and target.received[0]["payload"] == "one"
        assert target.headers[0]["X-Token"] == "t1"
        assert bridge(node, "hook")["config"]["headers"] == {"X-Token": "***"}  # sent, never shown

        target.mode = "fail"
        for i in (2, 3, 4):
            pub.publish(f"h/{i}", str(i).encode(), qos=1)  # acknowledged: queued durably
        wait_for(lambda: (bridge(node, "hook")["status"]["last_error"] or "").startswith("HTTP 500"),
                 what="the 500 in the API")
        assert "upstream exploded" in bridge(node, "hook")["status"]["last_error"]
        assert metric(node, "meshd_bridge_queued", "hook") == 3
        # The other bridge is not held up by this one's failing target.
        wait_for(lambda: len(other.received) == 4, what="the other bridge's POSTs")

        target.mode = "hang"
        wait_for(lambda: bridge(node, "hook")["status"]["last_error"] == "no answer within 0.5 s", what="the hang")
        assert metric(node, "meshd_bridge_connected", "hook") == 0
        _, status_body = api(node, "GET", "/api/v1/status")  # the node answers meanwhile
        assert status_body["node_id"]

        target.mode = "ok"
        target.release()
        wait_for(lambda: len(target.received) >= 4, what="the queue drained")
        topics = [m["topic"] for m in target.received]
        assert topics[:4] == ["h/1", "h/2", "h/3", "h/4"]  # in order (a timed-out POST may come twice)
        wait_for(lambda: metric(node, "meshd_bridge_queued", "hook") == 0)
        assert metric(node, "meshd_bridge_sent_total", "hook") == 4
        assert metric(node, "meshd_bridge_dropped_total", "hook") == 0
    finally:
        other.stop()


def test_a_message_the_target_refuses_is_dropped_and_counted(node_factory: Callable[..., RunningNode],
                                                            target: HttpTarget) -> None:
    node = node_factory(bridges=json.dumps([{"id": "hook", "type": "http", "url": target.url, "egress": ["h/#"]}]))
    target.mode = "reject"
    pub = Client("pub", version=5)
    pub.connect(node.mqtt_port)
    pub.publish("h/bad", b"x", qos=1)
    wait_for(lambda: metric(node, "meshd_bridge_dropped_total", "hook") == 1, what="the drop counted")
    assert "HTTP 400" in bridge(node, "hook")["status"]["last_error"]
    target.mode = "ok"
    pub.publish("h/good", b"y", qos=1)
    wait_for(lambda: [m["topic"] for m in target.received] == ["h/good"], what="the next one through")


def test_webhook_and_bridge_actions_go_through_the_queue(node_factory: Callable[..., RunningNode],
                                                         target: HttpTarget) -> None:
    node = node_factory(bridges=json.dumps([{"id": "http-out", "type": "http", "url": target.url}]))
    assert node.node is not None
    manager = bridge_manager(node.node)
    webhook = node.call(webhook_factory(manager), {"type": "webhook", "url": target.url + "?w=1",
                                                   "headers": {"X-Rule": "r1"}, "timeout_s": 2})
    action = node.call(bridge_factory(manager), {"type": "bridge", "bridge": "http-out", "topic": "t/${device}"})

    async def run_actions() -> None:
        await webhook.run({"device": "d7", "temp": 31.5}, None)
        await action.run({"device": "d8", "temp": 12}, None)

    trio.from_thread.run(run_actions, trio_token=node._token)
    wait_for(lambda: len(target.received) == 2, what="both POSTs")
    assert {json.dumps(m, sort_keys=True) for m in target.received} == {
        '{"device": "d7", "temp": 31.5}', '{"device": "d8", "temp": 12}'}
    _, listing = api(node, "GET", "/api/v1/bridges")
    sources = {b["id"]: b["source"] for b in listing["bridges"]}
    assert sources["http-out"] == "file" and [s for s in sources.values() if s == "webhook"] == ["webhook"]
    with pytest.raises(ValueError, match="url"):
        webhook_factory(manager)({"url": "ftp://nope"})
    with pytest.raises(ValueError, match="bridge"):
        bridge_factory(manager)({"bridge": "no such id!", "topic": "x"})
