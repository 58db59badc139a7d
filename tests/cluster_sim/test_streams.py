"""Durable streams on the cluster simulator (virtual time, deterministic by seed): a
replay merged from three nodes' parts in publish order, then live; a node down when
the replay starts is reported missing and its part delivered when it is back."""

from __future__ import annotations

import json
from typing import Any, Mapping

import trio

from simulation.cluster import SimCluster
from streams.service import READ_QUERY, StreamService
from tests.cluster_sim.helpers import sim

STREAMS = json.dumps([{"filter": "plant/#"}])


def stream_filters(c: SimCluster, node_id: str) -> list[str]:
    streams = c.running(node_id).broker.streams
    assert isinstance(streams, StreamService)
    return [s.filter for s in streams.specs]


async def publish_round_robin(c: SimCluster, start: int, count: int) -> list[bytes]:
    payloads = []
    for i in range(start, start + count):
        node = c.node_ids[i % len(c.node_ids)]
        pub = c.clients.get(f"pub-{node}") or await c.connect(node, f"pub-{node}")
        payload = f"{node}-{i}".encode()
        await pub.publish(f"plant/{node}", payload, qos=1)
        payloads.append(payload)
    return payloads


def test_replay_merges_three_parts_in_publish_order_then_live() -> None:
    async def scenario(c: SimCluster) -> None:
        stored = await publish_round_robin(c, 0, 30)
        sub = await c.connect("n1", "consumer")
        await sub.subscribe("$replay/earliest/plant/#", 1)
        await c.wait_for(lambda: len(sub.received) >= 30, 10, "the replay")
        assert sub.payloads() == stored  # one clock in the simulator: position order is publish order
        live = await publish_round_robin(c, 30, 9)
        await c.wait_for(lambda: len(sub.received) >= 39, 10, "the live messages")
        await c.run_for(1.0)
        assert sub.payloads() == stored + live

    sim(scenario, streams=STREAMS)


def test_a_node_down_at_the_start_is_missing_then_recovered() -> None:
    async def scenario(c: SimCluster) -> None:
        stored = await publish_round_robin(c, 0, 30)
        await c.kill("n2")
        await c.wait_for(lambda: c.running("n0").gossip.member_state("n2") == "dead", 30, "n2 held dead")
        sub = await c.connect("n0", "consumer")
        await sub.subscribe("$replay/earliest/plant/#", 1)
        await c.wait_for(lambda: any(m.topic == "$replay/missing/n2" for m in sub.received), 10, "the missing marker")
        await c.wait_for(lambda: len(sub.received) >= 21, 10, "the parts of n0 and n1")
        assert [m.payload for m in sub.received if m.topic.startswith("plant/")] == [p for p in stored if not p.startswith(b"n2")]
        await c.restart("n2")
        await c.wait_for(lambda: any(m.topic == "$replay/recovered/n2" for m in sub.received), 30, "n2's part")
        assert sub.payloads("plant/n2") == [p for p in stored if p.startswith(b"n2")]
        assert sub.received[-1].topic == "$replay/recovered/n2"

    sim(scenario, streams=STREAMS)


def test_a_node_killed_while_it_reads_its_page_is_missing_then_recovered() -> None:
    """Its kernel closes the read's socket with an orderly end (the network closes a
    dead node's streams as a kernel does): the reader must not take that for an older
    version that holds no part, which would end the replay without n2's part and
    without a marker."""

    async def scenario(c: SimCluster) -> None:
        stored = await publish_round_robin(c, 0, 30)
        c.net.kernel_close = True
        reading = trio.Event()

        async def dies_while_reading(peer: str, args: Mapping[str, Any]) -> object:
            reading.set()
            await trio.sleep_forever()

        streams = c.running("n2").broker.streams
        assert isinstance(streams, StreamService)
        streams.queries.handle(READ_QUERY, dies_while_reading)
        sub = await c.connect("n0", "consumer")
        await sub.subscribe("$replay/earliest/plant/#", 1)
        await c.wait_for(reading.is_set, 10, "n2 reading its page")
        await c.kill("n2")
        await c.wait_for(lambda: any(m.topic == "$replay/missing/n2" for m in sub.received), 10, "the missing marker")
        await c.restart("n2")
        await c.wait_for(lambda: any(m.topic == "$replay/recovered/n2" for m in sub.received), 30, "n2's part")
        assert sorted(m.payload for m in sub.received if m.topic.startswith("plant/")) == sorted(stored)
        assert sub.payloads("plant/n2") == [p for p in stored if p.startswith(b"n2")]

    sim(scenario, streams=STREAMS)


def test_streams_set_at_run_time_on_one_node_apply_on_every_node() -> None:
    async def scenario(c: SimCluster) -> None:
        code, body = await c.api("n0", "PUT", "/api/v1/config/streams", {"value": [{"filter": "ota/#"}]})
        assert code == 200, body
        await c.wait_for(lambda: all(stream_filters(c, n) == ["ota/#"] for n in c.node_ids), 10,
                         "every node takes the stream")
        pub = await c.connect("n2", "pub")
        await pub.publish("ota/fw", b"v2", qos=1)
        sub = await c.connect("n1", "consumer")
        await sub.subscribe("$replay/earliest/ota/#", 1)
        await c.wait_for(lambda: sub.payloads() == [b"v2"], 10, "the message kept on n2")
        code, body = await c.api("n2", "GET", "/api/v1/streams")
        assert code == 200 and isinstance(body, dict) and body["streams"][0]["messages"] == 1

    sim(scenario)
