"""Persistent sessions survive SIGKILL of the node: nothing acknowledged is lost."""

from __future__ import annotations

import time

import pytest

from mqtt import Properties, Puback, Subscribe, Subscription
from tests.mesh.test_broker_raw import Raw
from tests.support import TIMEOUT, Client, MeshdProcess

N = 2000


def publish_all(port: int, version: int, qos: int, n: int, topic: str = "data/x") -> None:
    pub = Client("publisher", version=version)
    pub.c.max_inflight_messages_set(200)
    pub.c.max_queued_messages_set(0)
    pub.connect(port)
    infos = [pub.publish(topic, str(i).encode(), qos=qos, wait=False) for i in range(n)]
    deadline = time.monotonic() + 60
    for info in infos:
        info.wait_for_publish(max(0.1, deadline - time.monotonic()))
        assert info.is_published(), "publisher did not get every PUBACK/PUBCOMP"
    pub.disconnect()


@pytest.mark.parametrize("version, qos", [(5, 1), (5, 2), (4, 1)])
def test_acknowledged_messages_survive_kill_9(tmp_path, version, qos):
    data = str(tmp_path / "data")
    queue_room = ("--max-queued-messages", "5000")
    node = MeshdProcess(data, *queue_room).start()
    try:
        sub = Client("keeper", version=version, clean=False)
        sub.connect(node.port, expiry=3600)
        sub.subscribe("data/#", qos)
        sub.disconnect()
        publish_all(node.port, version, qos, N)
        node.kill()
        node = MeshdProcess(data, *queue_room, port=node.port).start()
        sub2 = Client("keeper", version=version, clean=False)
        flags, _, _ = sub2.connect(node.port, expiry=3600)
        assert flags.session_present
        got = sub2.expect(N, timeout=60)
        assert [int(m.payload) for m in got] == list(range(N))
        sub2.expect_none(0.3)
        sub2.disconnect()
    finally:
        node.__exit__()


def test_inflight_redelivered_with_dup_after_kill_9(tmp_path):
    data = str(tmp_path / "data")
    node = MeshdProcess(data).start()
    props = Properties(session_expiry_interval=3600, receive_maximum=10)
    try:
        raw = Raw(node.port)
        raw.connect(client_id="slowpoke", clean_start=False, properties=props)
        raw.send(Subscribe(packet_id=1, subscriptions=(Subscription("f/#", 1),)))
        raw.recv()
        publish_all(node.port, 5, 1, 30, topic="f/x")
        first = [raw.recv() for _ in range(10)]  # read, never acknowledged
        assert [p.payload for p in first] == [str(i).encode() for i in range(10)]
        time.sleep(0.3)  # let the inflight records reach the disk (sync mode: they already have)
        node.kill()
        raw.close()
        node = MeshdProcess(data, port=node.port).start()
        raw = Raw(node.port)
        ack = raw.connect(client_id="slowpoke", clean_start=False, properties=props)
        assert ack.session_present
        again = [raw.recv() for _ in range(10)]
        assert [(p.payload, p.dup, p.packet_id) for p in again] == [(p.payload, True, p.packet_id) for p in first]
        rest = []
        for p in again:
            raw.send(Puback(packet_id=p.packet_id))
        while len(rest) < 20:
            p = raw.recv()
            rest.append(p)
            raw.send(Puback(packet_id=p.packet_id))
        assert [p.payload for p in rest] == [str(i).encode() for i in range(10, 30)]
        assert not any(p.dup for p in rest)
    finally:
        node.__exit__()


def test_session_expiry_enforced_across_restart(tmp_path):
    data = str(tmp_path / "data")
    with MeshdProcess(data) as node:
        c = Client("brief", version=5, clean=False)
        c.connect(node.port, expiry=2)
        c.subscribe("b/#", 1)
        c.disconnect()
        assert node.stop() == 0
    time.sleep(2.5)
    with MeshdProcess(data, port=node.port) as node:
        c = Client("brief", version=5, clean=False)
        flags, _, _ = c.connect(node.port, expiry=2)
        assert flags.session_present is False
        c.disconnect()


def test_session_within_expiry_kept_across_restart(tmp_path):
    data = str(tmp_path / "data")
    with MeshdProcess(data) as node:
        c = Client("durable", version=5, clean=False)
        c.connect(node.port, expiry=600)
        c.subscribe("b/#", 1)
        c.disconnect()
        node.kill()
    with MeshdProcess(data, port=node.port) as node:
        c = Client("durable", version=5, clean=False)
        flags, _, _ = c.connect(node.port, expiry=600)
        assert flags.session_present is True
        pub = Client("p", version=5)
        pub.connect(node.port)
        pub.publish("b/1", b"after restart", qos=1)
        assert c.expect(1)[0].payload == b"after restart"


def test_retained_and_will_survive_kill_9(tmp_path):
    data = str(tmp_path / "data")
    with MeshdProcess(data) as node:
        watcher = Client("watcher", version=5, clean=False)
        watcher.connect(node.port, expiry=600)
        watcher.subscribe("wills/#", 1)
        watcher.disconnect()
        pub = Client("p", version=5)
        pub.connect(node.port)
        pub.publish("state/lamp", b"on", qos=1, retain=True)
        doomed = Client("doomed", version=5, clean=False)
        doomed.connect(node.port, expiry=600, will=("wills/doomed", b"node died under me", 1, False))
        time.sleep(0.2)
        node.kill()
    with MeshdProcess(data, port=node.port) as node:
        s = Client("s", version=5)
        s.connect(node.port)
        s.subscribe("state/#", 1)
        (m,) = s.expect(1)
        assert (m.topic, m.payload, m.retain) == ("state/lamp", b"on", True)
        watcher = Client("watcher", version=5, clean=False)
        watcher.connect(node.port, expiry=600)
        (w,) = watcher.expect(1, timeout=TIMEOUT)
        assert (w.topic, w.payload) == ("wills/doomed", b"node died under me")
