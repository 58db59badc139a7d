"""A corpus of malformed and hostile packets sent to a running node over real sockets:
each gets the right reason code or a clean close, and a well-behaved client on the
same node keeps publishing and receiving throughout."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from mqtt import Connect, Decoder, Disconnect, Publish, Pubrel, Subscribe, Subscription, encode
from tests.support import Client

V5_CONNECT = encode(Connect(client_id="hostile", protocol_level=5), 5)
V4_CONNECT = encode(Connect(client_id="hostile4", protocol_level=4), 4)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n % 128, n // 128
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _publish_raw(topic: bytes, flags: int = 0, payload: bytes = b"x") -> bytes:
    body = len(topic).to_bytes(2, "big") + topic + (b"\x00" if flags & 0x06 == 0 else b"\x00\x01") + payload
    if flags & 0x06 == 0:
        body = len(topic).to_bytes(2, "big") + topic + b"\x00" + payload  # v5: empty property length
    return bytes([0x30 | flags]) + _varint(len(body)) + body


# (name, bytes after a v5 CONNECT, expected DISCONNECT reason or None for a plain close)
CORPUS = [
    ("reserved flags on PINGREQ", bytes([0xC1, 0x00]), 0x81),
    ("length past the end then close", bytes([0x30, 0x7F, 0x00, 0x01]), None),
    ("256 MB remaining length", bytes([0x30, 0xFF, 0xFF, 0xFF, 0x7F]), 0x95),
    ("5-byte remaining length", bytes([0x30, 0xFF, 0xFF, 0xFF, 0xFF, 0x01]), 0x81),
    ("invalid UTF-8 topic", _publish_raw(b"a/\xff\xfe"), 0x81),
    ("U+0000 in topic", _publish_raw(b"a\x00b"), 0x81),
    ("wildcard in topic name", _publish_raw(b"a/#"), 0x90),
    ("QoS 3 publish", _publish_raw(b"a", flags=0x06), 0x81),
    ("CONNECT twice", V5_CONNECT, 0x82),
    ("SUBSCRIBE with no filters", bytes([0x82, 0x03, 0x00, 0x01, 0x00]), 0x82),
    # Over max_topic_levels is a limit, not a protocol error: refused, connection kept.
    ("deep topic levels", encode(Publish(topic="/".join(["l"] * 200), payload=b"x", qos=1, packet_id=9), 5)
     + encode(Disconnect(), 5), ("Puback", 0x90)),
]


def read_until_close(sock: socket.socket, level: int = 5, timeout: float = 10.0) -> list:
    decoder = Decoder(role="client", protocol_level=level)
    packets = []
    sock.settimeout(timeout)
    while True:
        try:
            data = sock.recv(65536)
        except (ConnectionResetError, BrokenPipeError):
            return packets
        if not data:
            return packets
        decoder.feed(data)
        while (p := decoder.next_packet()) is not None:
            packets.append(p)


@pytest.fixture
def busy_node(node_factory):
    """A node with a client that publishes to itself the whole time; the test checks
    afterwards that every one of its messages came back."""
    node = node_factory(max_topic_levels=64)
    good = Client("good", version=5)
    good.connect(node.mqtt_port)
    good.subscribe("good/loop", 1)
    stop = threading.Event()
    sent = []

    def loop() -> None:
        i = 0
        while not stop.is_set():
            good.publish("good/loop", str(i).encode(), qos=1)
            sent.append(i)
            i += 1
            time.sleep(0.01)

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    yield node
    stop.set()
    t.join(10)
    got = [int(m.payload) for m in good.expect(len(sent), timeout=10)]
    assert got == sent, "the well-behaved client lost messages while the node was attacked"


@pytest.mark.parametrize("name, data, reason", CORPUS, ids=[c[0] for c in CORPUS])
def test_hostile_packet(busy_node, name, data, reason):
    with socket.create_connection(("127.0.0.1", busy_node.mqtt_port), timeout=10) as sock:
        sock.sendall(V5_CONNECT)
        sock.sendall(data)
        if name == "length past the end then close":
            sock.shutdown(socket.SHUT_WR)
        packets = read_until_close(sock)
    assert type(packets[0]).__name__ == "Connack"
    rest = packets[1:]
    if reason is None:
        assert rest == []
    elif isinstance(reason, tuple):
        assert [(type(p).__name__, p.reason_code) for p in rest] == [reason], name
    else:
        assert [(type(p).__name__, p.reason_code) for p in rest] == [("Disconnect", reason)], name


def test_pubrel_for_unknown_id_gets_0x92_and_the_connection_lives(busy_node):
    with socket.create_connection(("127.0.0.1", busy_node.mqtt_port), timeout=10) as sock:
        sock.sendall(V5_CONNECT + encode(Pubrel(packet_id=4242), 5) + encode(Disconnect(), 5))
        packets = read_until_close(sock)
    names = [(type(p).__name__, getattr(p, "reason_code", None)) for p in packets]
    assert names == [("Connack", 0), ("Pubcomp", 0x92)]


def test_v311_garbage_gets_a_clean_close(busy_node):
    with socket.create_connection(("127.0.0.1", busy_node.mqtt_port), timeout=10) as sock:
        sock.sendall(V4_CONNECT + bytes([0xC1, 0x00]))
        packets = read_until_close(sock, level=4)
    assert [type(p).__name__ for p in packets] == ["Connack"]


def test_slowloris_connect_is_cut_off(node_factory):
    node = node_factory(connect_timeout=1.0)
    with socket.create_connection(("127.0.0.1", node.mqtt_port), timeout=10) as sock:
        t0 = time.monotonic()
        try:
            for byte in V5_CONNECT[:-1]:
                sock.sendall(bytes([byte]))
                time.sleep(0.2)
        except (BrokenPipeError, ConnectionResetError):
            pass
        assert read_until_close(sock) == []
        assert time.monotonic() - t0 < 5


def test_subscribe_flood_of_bad_filters(busy_node):
    subs = tuple(Subscription(f"ok/{i}", 0) for i in range(50))
    with socket.create_connection(("127.0.0.1", busy_node.mqtt_port), timeout=10) as sock:
        sock.sendall(V5_CONNECT + encode(Subscribe(packet_id=1, subscriptions=subs), 5))
        raw = encode(Subscribe(packet_id=2, subscriptions=(Subscription("x", 0),)), 5).replace(b"\x00\x01x", b"\x00\x01#")
        sock.sendall(raw.replace(b"#\x00", b"#\x00"))
        bad = bytearray(encode(Subscribe(packet_id=3, subscriptions=(Subscription("a/b", 0),)), 5))
        bad[-4:-1] = b"#/b"  # '#' not last: invalid filter
        sock.sendall(bytes(bad))
        packets = read_until_close(sock)
    names = [type(p).__name__ for p in packets]
    assert names[:2] == ["Connack", "Suback"]
    assert names[-1] == "Disconnect" and packets[-1].reason_code == 0x8F
