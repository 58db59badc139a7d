"""Durable streams across three real `meshd` processes (real TCP mesh, real RocksDB,
real paho clients): a replay merged from every node's part, then live messages while
publishing goes on; a resume after a disconnect; kill -9 of a node holding part of the
stream during a replay, whose part arrives when it is back."""

from __future__ import annotations

import json
import threading

import pytest

from tests.cluster.test_membership_processes import view
from tests.cluster.test_mesh_processes import start_cluster
from tests.streams.helpers import StreamClient, position, user_properties
from tests.support import wait_for

STREAMS = json.dumps([{"filter": "plant/#"}])


@pytest.fixture
def cluster(tmp_path):
    nodes = start_cluster(tmp_path, extra={name: ("--streams", STREAMS, "--max-inflight", "16") for name in "ABC"})
    try:
        for n in nodes.values():
            wait_for(lambda n=n: sum(v == "alive" for v in view(n).values()) == 3, what=f"{n.node_id} sees 3 alive")
        yield nodes
    finally:
        for n in nodes.values():
            n.__exit__()


def publishers(cluster) -> dict[str, StreamClient]:
    pubs = {}
    for name, node in cluster.items():
        pubs[name] = StreamClient(f"pub-{name}")
        pubs[name].connect(node.port)
    return pubs


def publish_round(pubs: dict[str, StreamClient], i: int) -> list[str]:
    payloads = []
    for name, pub in pubs.items():
        payload = f"{name}-{i}"
        pub.publish(f"plant/{name}/{i % 4}", payload, qos=1)
        payloads.append(payload)
    return payloads


def by_origin(received) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for m in received:
        pos = position(m)
        out.setdefault(pos.split("-", 2)[2], []).append(pos)
    return out


def test_replay_merged_from_three_nodes_then_live_while_publishing(cluster):
    pubs = publishers(cluster)
    stored = [p for i in range(150) for p in publish_round(pubs, i)]

    sub = StreamClient("consumer")
    sub.connect(cluster["A"].port)
    live: list[str] = []
    stop = threading.Event()

    def keep_publishing() -> None:
        i = 150
        while not stop.is_set() and i < 400:
            live.extend(publish_round(pubs, i))
            i += 1

    publishing = threading.Thread(target=keep_publishing)
    publishing.start()
    try:
        codes, props = sub.replay("plant/#", "earliest")
        assert codes == [1] and "missing" not in props
        first = sub.expect(len(stored), timeout=30)
    finally:
        stop.set()
        publishing.join(30)
    rest = sub.expect(len(stored) + len(live) - len(first), timeout=30)
    sub.expect_none(0.5)
    received = first + rest
    payloads = [m.payload.decode() for m in received]
    assert len(payloads) == len(set(payloads)), "a message came twice"
    assert set(payloads) == set(stored) | set(live), "a message is missing"
    positions = [position(m) for m in received]
    # The stored part comes merged from the three nodes in position order ...
    assert positions[:len(stored)] == sorted(positions[:len(stored)])
    assert {p.split("-")[0] for p in payloads[:len(stored)]} == {"A", "B", "C"}
    # ... and each node's messages, replayed or live, in that node's order.
    for origin, mine in by_origin(received).items():
        assert mine == sorted(mine), origin

    # Resume after a position, after a disconnect: exactly the messages after it.
    sub.disconnect()
    cut = positions[len(stored) // 2]
    again = StreamClient("consumer-again")
    again.connect(cluster["B"].port)
    assert again.replay("plant/#", cut)[0] == [1]
    expected = sorted(p for p in positions if p > cut)
    got = again.expect(len(expected), timeout=30)
    assert [position(m) for m in got] == expected
    again.expect_none(0.5)

    # MQTT 3.1.1: the $replay/<from>/<filter> form, on the third node.
    old = StreamClient("old", version=4)
    old.connect(cluster["C"].port)
    assert old.subscribe_codes("$replay/earliest/plant/A/#") == [1]
    mine = [p for p in payloads if p.startswith("A-")]
    assert [m.payload.decode() for m in old.expect(len(mine), timeout=30)] == sorted(mine, key=lambda p: int(p[2:]))


def test_kill9_of_a_node_during_a_replay_its_part_arrives_when_it_is_back(cluster):
    pubs = publishers(cluster)
    stored = [p for i in range(600) for p in publish_round(pubs, i)]  # every one acknowledged
    for pub in pubs.values():
        pub.disconnect()

    gate = threading.Event()
    sub = StreamClient("consumer")
    inner = sub.c.on_message

    def slow_consumer(c, u, msg):  # holds the first message: the replay waits on the window
        gate.wait(30)
        inner(c, u, msg)

    sub.c.on_message = slow_consumer
    sub.connect(cluster["A"].port)
    assert sub.replay("plant/#", "earliest")[0] == [1]
    cluster["C"].kill()
    gate.set()
    # Every message of A and B, then the marker saying C's part is missing.
    received = []
    while not any(m.topic == "$replay/missing/C" for m in received):
        received.extend(sub.expect(1, timeout=30))
    marker = next(m for m in received if m.topic == "$replay/missing/C")
    assert user_properties(marker.properties)["missing"] == "C"

    cluster["C"].start()
    while not any(m.topic == "$replay/recovered/C" for m in received):
        received.extend(sub.expect(1, timeout=60))
    messages = [m for m in received if not m.topic.startswith("$replay/")]
    payloads = [m.payload.decode() for m in messages]
    assert sorted(payloads) == sorted(stored), "an acknowledged message was lost or repeated"
    from_c = [m.payload.decode() for m in messages if position(m).endswith("-C")]
    assert from_c == [f"C-{i}" for i in range(600)], "C's part in C's order"
    sub.expect_none(0.5)
