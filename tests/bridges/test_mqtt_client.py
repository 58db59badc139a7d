"""The bridge's client machine against the project's server codec: CONNECT/CONNACK,
QoS 1 and 2 out (Delivered only at PUBACK / PUBCOMP), QoS 2 in handed out once, refusals
reported, and input split at every offset decoding the same."""

from __future__ import annotations

import pytest

from bridges.mqtt_client import (
    Arrived,
    ClientConnection,
    Connected,
    ConnectRefused,
    Delivered,
    Refused,
    Subscribed,
)
from mqtt import Connack, Decoder, Puback, Pubcomp, Publish, Pubrec, Pubrel, Suback, Subscribe, encode


def server_sees(data: bytes, level: int) -> list[object]:
    d = Decoder(role="server", protocol_level=level)
    d.feed(data)
    return list(d)


@pytest.mark.parametrize("level", [4, 5])
def test_connect_publish_and_acks(level: int) -> None:
    c = ClientConnection(client_id="b1", protocol_level=level, clean_start=False, session_expiry=60,
                         username="u", password="p")
    connect = server_sees(c.connect(0.0), level)[0]
    assert connect.client_id == "b1" and connect.username == "u" and not connect.clean_start
    events, _ = c.receive_data(encode(Connack(session_present=True), level), 0.0)
    assert events == [Connected(True, 65535)] and c.can_publish()
    p1 = server_sees(c.publish(11, "t", b"a", 1, False, 0.0), level)[0]
    p2 = server_sees(c.publish(12, "t", b"b", 2, True, 0.0), level)[0]
    assert (p1.qos, p2.qos, p2.retain) == (1, 2, True)
    events, out = c.receive_data(encode(Puback(p1.packet_id), level) + encode(Pubrec(p2.packet_id), level), 0.0)
    assert events == [Delivered(11)]  # QoS 2 is not delivered at PUBREC
    assert isinstance(server_sees(out, level)[0], Pubrel)
    events, _ = c.receive_data(encode(Pubcomp(p2.packet_id), level), 0.0)
    assert events == [Delivered(12)] and c.inflight_tokens() == []


def test_refusals_are_reported() -> None:
    c = ClientConnection(client_id="b1", protocol_level=5)
    events, _ = c.receive_data(encode(Connack(reason_code=0x87), 5), 0.0)
    assert events == [ConnectRefused(0x87)]
    c = ClientConnection(client_id="b1", protocol_level=5)
    c.receive_data(encode(Connack(), 5), 0.0)
    p = server_sees(c.publish(5, "t", b"x", 1, False, 0.0), 5)[0]
    events, _ = c.receive_data(encode(Puback(p.packet_id, 0x87), 5), 0.0)
    assert events == [Refused(5, 0x87)]
    sub = server_sees(c.subscribe([("a/#", 2, True)], 0.0), 5)[0]
    assert isinstance(sub, Subscribe) and sub.subscriptions[0].no_local
    events, _ = c.receive_data(encode(Suback(sub.packet_id, (0x87,)), 5), 0.0)
    assert events == [Subscribed((0x87,))]


def test_qos2_arrival_is_handed_out_once_until_pubrel() -> None:
    c = ClientConnection(client_id="b1", protocol_level=4)
    c.receive_data(encode(Connack(), 4), 0.0)
    pub = encode(Publish("t", b"x", 2, packet_id=9), 4)
    events, _ = c.receive_data(pub, 0.0)
    assert [type(e) for e in events] == [Arrived]
    assert isinstance(server_sees(c.accept(events[0].publish, 0.0), 4)[0], Pubrec)
    events, again = c.receive_data(pub, 0.0)  # resent before our PUBREC arrived: not handed out twice
    assert events == [] and isinstance(server_sees(again, 4)[0], Pubrec)
    events, out = c.receive_data(encode(Pubrel(9), 4), 0.0)
    assert isinstance(server_sees(out, 4)[0], Pubcomp)
    events, _ = c.receive_data(pub, 0.0)  # a new message with the id
    assert [type(e) for e in events] == [Arrived]


def test_input_split_at_every_offset() -> None:
    stream = encode(Connack(), 5) + encode(Publish("a/b", b"payload", 1, packet_id=3), 5) + encode(Suback(1, (1,)), 5)
    whole = ClientConnection(client_id="x", protocol_level=5)
    expected, _ = whole.receive_data(stream, 0.0)
    for cut in range(1, len(stream)):
        c = ClientConnection(client_id="x", protocol_level=5)
        first, _ = c.receive_data(stream[:cut], 0.0)
        second, _ = c.receive_data(stream[cut:], 0.0)
        assert first + second == expected
