"""Durable streams on one real node: real paho clients, real RocksDB, a real process."""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
import urllib.request

import pytest

from mesh.http_client import request_json
from tests.streams.helpers import StreamClient, position, user_properties
from tests.support import MeshdProcess, run_cli, wait_for

STREAMS = json.dumps([{"filter": "plant/#", "max_messages": 1000}, {"filter": "opt/#", "keep": "opt-in"}])


@pytest.fixture
def node(tmp_path):
    with MeshdProcess(str(tmp_path / "n"), "--streams", STREAMS, "--sys-interval", "0", http=True,
                      node_id="n1") as n:
        yield n


def publisher(node: MeshdProcess, version: int = 5) -> StreamClient:
    c = StreamClient(f"pub-{version}", version=version)
    c.connect(node.port)
    return c


def test_replay_from_earliest_then_live_with_positions(node):
    pub = publisher(node)
    for i in range(20):
        pub.publish(f"plant/{i % 3}/temp", str(i), qos=1)
    pub.publish("other/x", "not a stream", qos=1)

    sub = StreamClient("consumer")
    sub.connect(node.port)
    codes, props = sub.replay("plant/#", "earliest")
    assert codes == [1] and props["stream"] == "plant/#"
    got = sub.expect(20)
    assert [m.payload.decode() for m in got] == [str(i) for i in range(20)]
    positions = [position(m) for m in got]
    assert positions == sorted(positions) and len(set(positions)) == 20

    for i in range(20, 25):
        pub.publish(f"plant/{i % 3}/temp", str(i), qos=1)
    live = sub.expect(5)
    assert [m.payload.decode() for m in live] == [str(i) for i in range(20, 25)]
    assert position(live[0]) > positions[-1]
    sub.expect_none()

    # Resume after the 10th message: exactly the ones after it.
    again = StreamClient("consumer-2")
    again.connect(node.port)
    assert again.replay("plant/+/temp", positions[9])[0] == [1]
    rest = again.expect(15)
    assert [m.payload.decode() for m in rest] == [str(i) for i in range(10, 25)]
    again.expect_none()

    _, body = request_json(node.http_addr, "GET", "/api/v1/streams")
    plant = next(s for s in body["streams"] if s["filter"] == "plant/#")
    assert plant["messages"] == 25 and plant["bytes"] > 0 and plant["max_messages"] == 1000
    metrics = urllib.request.urlopen(f"http://{node.http_addr}/metrics", timeout=10).read().decode()
    assert 'meshd_stream_messages{stream="plant/#"} 25' in metrics
    assert "meshd_stream_appended_total 25" in metrics and "meshd_stream_replays_total 2" in metrics


def test_replay_from_an_rfc3339_time(node):
    pub = publisher(node)
    for i in range(3):
        pub.publish("plant/t", str(i), qos=1)
    # The node's wall clock is this machine's: once it passed the next millisecond, the
    # next messages' stamps are later than the first three's.
    started = time.time()
    wait_for(lambda: time.time() >= started + 0.002, what="two milliseconds to pass")
    for i in range(3, 6):
        pub.publish("plant/t", str(i), qos=1)
    first = StreamClient("all")
    first.connect(node.port)
    assert first.replay("plant/t", "earliest")[0] == [1]
    positions = [position(m) for m in first.expect(6)]
    wall_ms = int(positions[3][:12], 16)
    assert wall_ms > int(positions[2][:12], 16)
    # The 4th message's stamp as an RFC 3339 time: that message and the later ones.
    when = datetime.fromtimestamp(wall_ms / 1000, tz=timezone.utc).isoformat(timespec="milliseconds")
    later = StreamClient("later")
    later.connect(node.port)
    assert later.replay("plant/t", when)[0] == [1]
    assert [position(m) for m in later.expect(3)] == positions[3:]
    later.expect_none()


def test_v311_replay_topic_form(node):
    pub = publisher(node, version=4)
    for i in range(5):
        pub.publish("plant/a", str(i), qos=1)
    sub = StreamClient("old", version=4)
    sub.connect(node.port)
    assert sub.subscribe_codes("$replay/earliest/plant/a") == [1]
    got = sub.expect(5)
    assert [m.payload.decode() for m in got] == [str(i) for i in range(5)]
    assert {m.topic for m in got} == {"plant/a"}
    pub.publish("plant/a", "live", qos=1)
    assert sub.expect(1)[0].payload == b"live"
    assert sub.unsubscribe("$replay/earliest/plant/a") is not None
    pub.publish("plant/a", "after", qos=1)
    sub.expect_none()


def test_opt_in_stream_keeps_only_persist_1(node):
    pub = publisher(node)
    pub.publish("opt/a", "kept", qos=1, properties={"UserProperty": [("persist", "1")]})
    pub.publish("opt/a", "not kept", qos=1)
    sub = StreamClient("c")
    sub.connect(node.port)
    assert sub.replay("opt/#", "earliest")[0] == [1]
    got = sub.expect(1)
    assert got[0].payload == b"kept" and user_properties(got[0].properties)["persist"] == "1"
    sub.expect_none()


def test_bad_replays_get_suback_codes_and_keep_the_connection(node):
    sub = StreamClient("bad")
    sub.connect(node.port)
    assert sub.replay("nostream/#", "earliest")[0] == [0x8F]
    assert sub.replay("plant/#", "not-a-position")[0] == [0x83]
    assert sub.replay("$share/g/plant/#", "earliest")[0] == [0x83]
    assert sub.subscribe_codes("$replay/earliest") == [0x8F]
    # Still connected: a good replay works on the same connection.
    assert sub.replay("plant/#", "2020-01-01T00:00:00Z")[0] == [1]
    assert sub.disconnects.empty()


def test_ctl_streams_and_cluster_config_put(node):
    pub = publisher(node)
    pub.publish("plant/1", "x", qos=1)
    out = run_cli(["ctl", "--http", node.http_addr, "streams"])
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split()[:4] == ["FILTER", "KEEP", "MESSAGES", "BYTES"]
    assert lines[1].split()[:3] == ["plant/#", "all", "1"]
    # A stream added at run time (a cluster config event) keeps from then on.
    status, body = request_json(node.http_addr, "PUT", "/api/v1/config/streams",
                                {"value": [{"filter": "ota/#", "max_messages": 3}]})
    assert status == 200, body
    status, body = request_json(node.http_addr, "PUT", "/api/v1/config/streams", {"value": [{"max_age_s": 1}]})
    assert status == 400 and "filter is required" in json.dumps(body)
    for i in range(5):
        pub.publish("ota/fw", str(i), qos=1)
    sub = StreamClient("ota")
    sub.connect(node.port)
    assert sub.replay("ota/#", "earliest")[0] == [1]
    got = sub.expect(5)
    assert [m.payload for m in got] == [b"0", b"1", b"2", b"3", b"4"]
    # Retention (max_messages 3) cuts the two oldest within a compaction round.
    wait_for(lambda: request_json(node.http_addr, "GET", "/api/v1/streams")[1]["streams"][0]["messages"] == 3,
             what="retention to cut ota/#")
    late = StreamClient("ota-late")
    late.connect(node.port)
    codes, props = late.replay("ota/#", "earliest")
    assert codes == [1] and props.get("truncated") == "1"
    got = late.expect(4)
    assert got[0].topic == "$replay/truncated/n1" and user_properties(got[0].properties)["truncated"] == "1"
    assert [m.payload for m in got[1:]] == [b"2", b"3", b"4"]


def test_acl_denied_replay_is_0x87(tmp_path):
    acl = tmp_path / "acl.toml"
    acl.write_text('[[rule]]\npermission = "deny"\naction = "subscribe"\ntopics = ["plant/secret/#"]\n')
    with MeshdProcess(str(tmp_path / "acl-node"), "--streams", STREAMS, "--acl-file", str(acl)) as n:
        sub = StreamClient("denied")
        sub.connect(n.port)
        assert sub.replay("plant/secret/#", "earliest")[0] == [0x87]
        assert sub.subscribe_codes("$replay/earliest/plant/secret/x") == [0x87]
        assert sub.replay("plant/open/#", "earliest")[0] == [1]
        assert sub.disconnects.empty()
