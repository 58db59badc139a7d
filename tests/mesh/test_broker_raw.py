"""Broker rules checked byte by byte with a raw socket client built on our codec."""

from __future__ import annotations

import socket
import time

import pytest

from mqtt import (
    Connect,
    Decoder,
    Disconnect,
    Pingreq,
    Pingresp,
    Properties,
    Puback,
    Publish,
    Pubrec,
    Pubrel,
    Subscribe,
    Subscription,
    encode,
)
from tests.support import Client


class Raw:
    def __init__(self, port: int, level: int = 5) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.level = level
        self.decoder = Decoder(role="client", protocol_level=level)

    def send(self, packet) -> None:
        self.sock.sendall(encode(packet, self.level))

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv(self, timeout: float = 5.0):
        """Next packet, or None when the server closed the connection."""
        deadline = time.monotonic() + timeout
        while True:
            packet = self.decoder.next_packet()
            if packet is not None:
                return packet
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no packet")
            self.sock.settimeout(left)
            data = self.sock.recv(65536)
            if not data:
                return None
            self.decoder.feed(data)

    def connect(self, client_id: str = "raw", **kw):
        self.send(Connect(client_id=client_id, protocol_level=self.level, **kw))
        ack = self.recv()
        assert type(ack).__name__ == "Connack", ack
        return ack

    def closed(self, timeout: float = 5.0) -> bool:
        """True if the server closes the connection (after any packets it sends)."""
        try:
            while self.recv(timeout) is not None:
                pass
            return True
        except (ConnectionResetError, BrokenPipeError):
            return True

    def close(self) -> None:
        self.sock.close()


def recv_until_close(raw: Raw) -> list:
    out = []
    while True:
        try:
            p = raw.recv()
        except (ConnectionResetError, BrokenPipeError):
            return out
        if p is None:
            return out
        out.append(p)


def test_malformed_packet_gets_0x81_and_others_keep_working(node):
    good = Client("good", version=5)
    good.connect(node.mqtt_port)
    good.subscribe("ok", 1)
    raw = Raw(node.mqtt_port)
    raw.connect()
    # PUBLISH with QoS 3 is malformed.
    raw.send_bytes(bytes([0x36, 0x05, 0x00, 0x01, ord("a"), 0x00, 0x01]))
    packets = recv_until_close(raw)
    assert [(type(p).__name__, p.reason_code) for p in packets] == [("Disconnect", 0x81)]
    good.publish("ok", b"still here", qos=1)
    assert good.expect(1)[0].payload == b"still here"


def test_protocol_error_second_connect_gets_0x82(node):
    raw = Raw(node.mqtt_port)
    raw.connect()
    raw.send(Connect(client_id="raw", protocol_level=5))
    packets = recv_until_close(raw)
    assert [(type(p).__name__, p.reason_code) for p in packets] == [("Disconnect", 0x82)]


def test_packet_too_large_gets_0x95(node_factory):
    node = node_factory(max_packet_size=1024)
    raw = Raw(node.mqtt_port)
    ack = raw.connect()
    assert ack.properties.maximum_packet_size == 1024
    raw.send(Publish(topic="big", payload=b"x" * 4096))
    packets = recv_until_close(raw)
    assert [(type(p).__name__, p.reason_code) for p in packets] == [("Disconnect", 0x95)]


def test_huge_remaining_length_rejected_from_the_header(node):
    raw = Raw(node.mqtt_port)
    raw.connect()
    # Fixed header announcing ~256 MB; the body never comes.
    raw.send_bytes(bytes([0x30, 0xFF, 0xFF, 0xFF, 0x7F]))
    packets = recv_until_close(raw)
    assert [(type(p).__name__, p.reason_code) for p in packets] == [("Disconnect", 0x95)]


def test_wildcard_in_publish_topic_rejected(node):
    raw = Raw(node.mqtt_port)
    raw.connect()
    raw.send_bytes(encode(Publish(topic="a/b", payload=b"x"), 5).replace(b"a/b", b"a/+"))
    packets = recv_until_close(raw)
    assert [(type(p).__name__, p.reason_code) for p in packets] == [("Disconnect", 0x90)]


def test_v311_malformed_just_closes(node):
    raw = Raw(node.mqtt_port, level=4)
    raw.connect()
    raw.send_bytes(bytes([0x36, 0x05, 0x00, 0x01, ord("a"), 0x00, 0x01]))
    assert recv_until_close(raw) == []


def test_first_packet_not_connect_closes(node):
    raw = Raw(node.mqtt_port)
    raw.send(Pingreq())
    assert recv_until_close(raw) == []


def test_connect_timeout_closes(node_factory):
    node = node_factory(connect_timeout=0.5)
    raw = Raw(node.mqtt_port)
    t0 = time.monotonic()
    assert recv_until_close(raw) == []
    assert 0.4 <= time.monotonic() - t0 < 4


def test_unsupported_protocol_version(node):
    raw = Raw(node.mqtt_port, level=4)
    connect = bytearray(encode(Connect(client_id="x", protocol_level=4), 4))
    connect[8] = 9  # protocol level byte
    raw.send_bytes(bytes(connect))
    packets = recv_until_close(raw)
    assert len(packets) == 1 and type(packets[0]).__name__ == "Connack"
    assert packets[0].reason_code == 0x84  # v3 return code 1, decoded back to 0x84


def test_receive_maximum_enforced_on_inbound_qos2(node_factory):
    node = node_factory(receive_maximum=3)
    raw = Raw(node.mqtt_port)
    raw.connect()
    for pid in range(1, 4):
        raw.send(Publish(topic="r", payload=b"x", qos=2, packet_id=pid))
        assert type(raw.recv()).__name__ == "Pubrec"
    raw.send(Publish(topic="r", payload=b"x", qos=2, packet_id=4))
    packets = recv_until_close(raw)
    assert [(type(p).__name__, p.reason_code) for p in packets] == [("Disconnect", 0x93)]


def test_qos2_inbound_exactly_once(node):
    sub = Client("s", version=5)
    sub.connect(node.mqtt_port)
    sub.subscribe("q2", 2)
    raw = Raw(node.mqtt_port)
    raw.connect()
    raw.send(Publish(topic="q2", payload=b"once", qos=2, packet_id=7))
    assert isinstance(raw.recv(), Pubrec)
    raw.send(Publish(topic="q2", payload=b"once", qos=2, packet_id=7, dup=True))  # retransmit
    assert isinstance(raw.recv(), Pubrec)
    raw.send(Pubrel(packet_id=7))
    assert type(raw.recv()).__name__ == "Pubcomp"
    assert [m.payload for m in sub.expect(1)] == [b"once"]
    sub.expect_none()
    raw.send(Pubrel(packet_id=99))
    comp = raw.recv()
    assert comp.reason_code == 0x92  # packet identifier not found


def test_keepalive_enforced_at_one_and_a_half(node):
    raw = Raw(node.mqtt_port)
    raw.connect(keep_alive=1)
    raw.send(Pingreq())
    assert isinstance(raw.recv(), Pingresp)
    t0 = time.monotonic()
    packets = recv_until_close(raw)
    elapsed = time.monotonic() - t0
    assert [(type(p).__name__, p.reason_code) for p in packets] == [("Disconnect", 0x8D)]
    assert 1.3 <= elapsed < 3.5


def test_outbound_window_bounded_by_client_receive_maximum(node):
    raw = Raw(node.mqtt_port)
    raw.connect(client_id="slow", properties=Properties(receive_maximum=2))
    raw.send(Subscribe(packet_id=1, subscriptions=(Subscription("w", qos=1),)))
    assert type(raw.recv()).__name__ == "Suback"
    pub = Client("p", version=5)
    pub.connect(node.mqtt_port)
    for i in range(5):
        pub.publish("w", str(i).encode(), qos=1)
    first = [raw.recv(), raw.recv()]
    assert [p.payload for p in first] == [b"0", b"1"]
    with pytest.raises(TimeoutError):
        raw.recv(timeout=0.5)  # window full: nothing more until an ack
    raw.send(Puback(packet_id=first[0].packet_id))
    assert raw.recv().payload == b"2"


def test_unacked_messages_resent_with_dup_on_resume(node):
    raw = Raw(node.mqtt_port)
    raw.connect(client_id="dupper", clean_start=False, properties=Properties(session_expiry_interval=60))
    raw.send(Subscribe(packet_id=1, subscriptions=(Subscription("d", qos=1),)))
    raw.recv()
    pub = Client("p", version=5)
    pub.connect(node.mqtt_port)
    pub.publish("d", b"unacked", qos=1)
    first = raw.recv()
    assert (first.payload, first.dup) == (b"unacked", False)
    raw.close()
    time.sleep(0.2)
    raw2 = Raw(node.mqtt_port)
    ack = raw2.connect(client_id="dupper", clean_start=False, properties=Properties(session_expiry_interval=60))
    assert ack.session_present
    again = raw2.recv()
    assert (again.payload, again.dup, again.packet_id) == (b"unacked", True, first.packet_id)


def test_outbound_topic_alias(node):
    raw = Raw(node.mqtt_port)
    raw.connect(client_id="al", properties=Properties(topic_alias_maximum=5))
    raw.send(Subscribe(packet_id=1, subscriptions=(Subscription("long/topic/name", qos=0),)))
    raw.recv()
    pub = Client("p", version=5)
    pub.connect(node.mqtt_port)
    pub.publish("long/topic/name", b"1", qos=1)
    pub.publish("long/topic/name", b"2", qos=1)
    a, b = raw.recv(), raw.recv()
    assert (a.topic, a.properties.topic_alias) == ("long/topic/name", 1)
    assert (b.topic, b.properties.topic_alias, b.payload) == ("", 1, b"2")


def test_disconnect_cannot_raise_zero_expiry(node):
    raw = Raw(node.mqtt_port)
    raw.connect(client_id="z")
    raw.send(Disconnect(properties=Properties(session_expiry_interval=100)))
    packets = recv_until_close(raw)
    assert [(type(p).__name__, p.reason_code) for p in packets] == [("Disconnect", 0x82)]


def test_topic_alias_above_maximum_gets_0x94(node_factory):
    node = node_factory(topic_alias_maximum=2)
    raw = Raw(node.mqtt_port)
    ack = raw.connect()
    assert ack.properties.topic_alias_maximum == 2
    raw.send(Publish(topic="a", payload=b"x", properties=Properties(topic_alias=3)))
    packets = recv_until_close(raw)
    assert [(type(p).__name__, p.reason_code) for p in packets] == [("Disconnect", 0x94)]
