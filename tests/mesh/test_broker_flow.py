"""Back-pressure, $SYS, and the WebSocket endpoint's rules."""

from __future__ import annotations

import socket
import time

import pytest

from mesh.connection import OUTBOX_LIMIT
from mqtt import Connect, Subscribe, Subscription, encode
from tests.support import Client


def test_slow_qos0_consumer_is_bounded_and_others_keep_flowing(node):
    # A subscriber that never reads its socket.
    slow = socket.create_connection(("127.0.0.1", node.mqtt_port))
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow.sendall(encode(Connect(client_id="slow", protocol_level=5), 5))
    slow.sendall(encode(Subscribe(packet_id=1, subscriptions=(Subscription("flood", 0),)), 5))
    healthy = Client("healthy", version=5)
    healthy.connect(node.mqtt_port)
    healthy.subscribe("ping", 1)
    time.sleep(0.2)
    pub = Client("pub", version=5)
    pub.connect(node.mqtt_port)
    payload = b"x" * 8192
    for _ in range(2000):  # ~16 MB towards a reader that takes nothing
        pub.publish("flood", payload, qos=0, wait=False)
    pub.publish("ping", b"alive", qos=1)
    assert healthy.expect(1)[0].payload == b"alive"

    def state():
        broker = node.node.broker
        conn = broker.connections["slow"]
        return broker.stats.dropped_slow_consumer, conn._outbox_bytes

    deadline = time.monotonic() + 10
    dropped, outbox = node.call(state)
    while dropped == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
        dropped, outbox = node.call(state)
    assert dropped > 0
    assert outbox <= OUTBOX_LIMIT + len(payload) + 64
    slow.close()


def test_sys_topics_published_retained(node_factory):
    node = node_factory(sys_interval=0.2)
    c = Client("sys", version=5)
    c.connect(node.mqtt_port)
    c.subscribe("$SYS/broker/#", 0)
    seen = {}
    deadline = time.monotonic() + 5
    wanted = ("$SYS/broker/uptime", "$SYS/broker/messages/received")

    def complete() -> bool:
        return seen.get("$SYS/broker/clients/connected") == b"1" and all(t in seen for t in wanted)

    # The first (retained) values may predate this client; the next round counts it.
    # Until every topic is seen: the round that says "1" may be the first message to
    # arrive, ahead of the others.
    while not complete() and time.monotonic() < deadline:
        m = c.expect(1)[0]
        seen[m.topic] = m.payload
    assert seen["$SYS/broker/clients/connected"] == b"1"
    assert b"seconds" in seen["$SYS/broker/uptime"]
    assert "$SYS/broker/messages/received" in seen
    # Plain '#' must not see them.
    other = Client("other", version=5)
    other.connect(node.mqtt_port)
    other.subscribe("#", 0)
    other.expect_none(0.5)


def ws_handshake(port: int, path: str, protocol: str | None) -> bytes:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    req = (
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
    )
    if protocol:
        req += f"Sec-WebSocket-Protocol: {protocol}\r\n"
    s.sendall((req + "\r\n").encode())
    data = s.recv(4096)
    s.close()
    return data


def test_websocket_path_and_subprotocol(node):
    port = node.ports["ws"]
    ok = ws_handshake(port, "/mqtt", "mqtt")
    assert ok.startswith(b"HTTP/1.1 101")
    assert b"sec-websocket-protocol: mqtt" in ok.lower()
    assert ws_handshake(port, "/other", "mqtt").startswith(b"HTTP/1.1 404")
    assert ws_handshake(port, "/mqtt", "chat").startswith(b"HTTP/1.1 400")
