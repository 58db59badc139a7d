"""In `sync` durability the publisher's PUBACK waits for the store's synced write;
in `batch` it does not (the loss window is bounded by durability_batch_ms instead)."""

from __future__ import annotations

import threading
import time

import pytest

from tests.support import Client


def gate_store(node) -> threading.Event:
    """Hold every store write until the returned event is set."""
    gate = threading.Event()
    store = node.node.store
    real = store.write_batch

    def gated(batch, *, sync):
        gate.wait(10)
        real(batch, sync=sync)

    store.write_batch = gated
    return gate


@pytest.mark.parametrize("durability, ack_waits", [("sync", True), ("batch", False)])
def test_puback_waits_for_sync_only_in_sync_mode(node_factory, durability, ack_waits):
    node = node_factory(durability=durability, durability_batch_ms=5)
    sub = Client("offline-sub", version=5, clean=False)
    sub.connect(node.mqtt_port, expiry=600)
    sub.subscribe("d/#", 1)
    sub.disconnect()
    time.sleep(0.2)
    gate = gate_store(node)
    pub = Client("pub", version=5)
    pub.connect(node.mqtt_port)
    info = pub.publish("d/1", b"x", qos=1, wait=False)
    info.wait_for_publish(0.7)
    assert info.is_published() is (not ack_waits)
    gate.set()
    info.wait_for_publish(5)
    assert info.is_published()


def test_clean_subscribers_never_wait_for_the_disk(node):
    sub = Client("clean-sub", version=5)
    sub.connect(node.mqtt_port)
    sub.subscribe("c/#", 1)
    gate = gate_store(node)
    try:
        pub = Client("pub", version=5)
        pub.connect(node.mqtt_port)
        info = pub.publish("c/1", b"x", qos=1, wait=False)
        info.wait_for_publish(2)
        assert info.is_published()
    finally:
        gate.set()


def test_queue_overflow_keeps_newest_and_counts_drops(node_factory):
    node = node_factory(max_queued_messages=5)
    sub = Client("small", version=5, clean=False)
    sub.connect(node.mqtt_port, expiry=600)
    sub.subscribe("o/#", 1)
    sub.disconnect()
    pub = Client("pub", version=5)
    pub.connect(node.mqtt_port)
    for i in range(12):
        pub.publish("o/x", str(i).encode(), qos=1)
    again = Client("small", version=5, clean=False)
    again.connect(node.mqtt_port, expiry=600)
    assert [m.payload for m in again.expect(5)] == [str(i).encode() for i in range(7, 12)]
    again.expect_none()
    assert node.call(lambda: node.node.broker.stats.dropped_queue_full) == 7


@pytest.mark.parametrize("queue_qos0", [False, True])
def test_qos0_queued_for_offline_sessions_only_when_configured(node_factory, queue_qos0):
    node = node_factory(queue_qos0=queue_qos0)
    sub = Client("q0", version=5, clean=False)
    sub.connect(node.mqtt_port, expiry=600)
    sub.subscribe("z/#", 0)
    sub.disconnect()
    pub = Client("pub", version=5)
    pub.connect(node.mqtt_port)
    pub.publish("z/1", b"zero", qos=1)  # delivered at the subscription's QoS 0
    again = Client("q0", version=5, clean=False)
    again.connect(node.mqtt_port, expiry=600)
    if queue_qos0:
        assert again.expect(1)[0].payload == b"zero"
    else:
        again.expect_none(0.5)
