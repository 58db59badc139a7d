"""Round trips of every packet type at every protocol level where it exists."""

from __future__ import annotations

import pytest

from mqtt import (
    EMPTY_PROPERTIES,
    Auth,
    Connack,
    Connect,
    Decoder,
    Disconnect,
    Pingreq,
    Pingresp,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    ReasonCode,
    Suback,
    Subscribe,
    Subscription,
    Unsuback,
    Unsubscribe,
    Will,
    encode,
)

from .helpers import check_splits, decode_one

USER = (("region", "eu-west"), ("région", "ünïcödé"), ("region", "dup-key-kept"))

RICH_CONNECT = Properties(
    session_expiry_interval=3600,
    receive_maximum=20,
    maximum_packet_size=1 << 20,
    topic_alias_maximum=10,
    request_response_information=1,
    request_problem_information=0,
    authentication_method="SCRAM-SHA-256",
    authentication_data=b"\x00\x01nonce",
    user_properties=USER,
)
RICH_WILL = Properties(
    will_delay_interval=30,
    payload_format_indicator=1,
    message_expiry_interval=120,
    content_type="text/plain",
    response_topic="replies/here",
    correlation_data=b"\xde\xad",
    user_properties=(("k", "v"),),
)
RICH_CONNACK = Properties(
    session_expiry_interval=0,
    receive_maximum=100,
    maximum_qos=1,
    retain_available=0,
    maximum_packet_size=65536,
    assigned_client_identifier="auto-123",
    topic_alias_maximum=5,
    reason_string="welcome",
    wildcard_subscription_available=1,
    subscription_identifier_available=1,
    shared_subscription_available=0,
    server_keep_alive=30,
    response_information="resp/",
    server_reference="other:1883",
    authentication_method="m",
    authentication_data=b"d",
    user_properties=USER,
)
RICH_PUBLISH = Properties(
    payload_format_indicator=0,
    message_expiry_interval=60,
    topic_alias=4,
    response_topic="r/t",
    correlation_data=b"c",
    content_type="application/json",
    user_properties=USER,
)
ACK_PROPS = Properties(reason_string="because", user_properties=(("a", "b"),))


def v3_packets(level: int) -> list:
    """Packets that exist at every level, in the form that survives a v3 round trip."""
    return [
        Connect("client-1", protocol_level=level),
        Connect("", clean_start=True, keep_alive=0, protocol_level=level),
        Connect(
            "c2", clean_start=False, keep_alive=65535, username="user", password=b"\x00pw\xff",
            will=Will("last/will", b"gone", qos=2, retain=True), protocol_level=level,
        ),
        Connect("c3", username="only-user", will=Will("w", b"", qos=1), protocol_level=level),
        Connack(),
        Connack(reason_code=ReasonCode.UNSUPPORTED_PROTOCOL_VERSION),
        Connack(reason_code=ReasonCode.CLIENT_IDENTIFIER_NOT_VALID),
        Connack(reason_code=ReasonCode.SERVER_UNAVAILABLE),
        Connack(reason_code=ReasonCode.BAD_USER_NAME_OR_PASSWORD),
        Connack(reason_code=ReasonCode.NOT_AUTHORIZED),
        Publish("a/b", b"hello"),
        Publish("a/b", b"", retain=True),
        Publish("$SYS/x", b"\x00" * 300, qos=1, packet_id=1),
        Publish("ü/ñ/中", b"x" * 20000, qos=2, dup=True, retain=True, packet_id=65535),
        Puback(1),
        Pubrec(2),
        Pubrel(3),
        Pubcomp(65535),
        Subscribe(10, (Subscription("a/+/c", 0), Subscription("#", 1), Subscription("$share/g/x/#", 2))),
        Suback(10, (0, 1, 2, 0x80)),
        Unsubscribe(11, ("a/+/c", "#")),
        Unsuback(11),
        Pingreq(),
        Pingresp(),
        Disconnect(),
    ]


def v5_packets() -> list:
    return [
        Connect("v5", properties=RICH_CONNECT, protocol_level=5),
        Connect(
            "v5w", clean_start=False, password=b"no-user-is-fine-in-v5",
            will=Will("w/t", b"bye", qos=1, retain=False, properties=RICH_WILL),
            properties=Properties(session_expiry_interval=10), protocol_level=5,
        ),
        Connack(True, 0, RICH_CONNACK),
        Connack(False, ReasonCode.QUOTA_EXCEEDED, Properties(reason_string="too many")),
        Connack(reason_code=ReasonCode.BANNED),
        Publish("t", b"p", 1, packet_id=5, properties=RICH_PUBLISH),
        Publish("", b"aliased", 0, properties=Properties(topic_alias=4)),
        Publish("t/x", b"", 2, packet_id=9, properties=Properties(subscription_identifiers=(1, 268435455))),
        Puback(1, ReasonCode.NO_MATCHING_SUBSCRIBERS),
        Puback(1, 0, ACK_PROPS),
        Pubrec(2, ReasonCode.QUOTA_EXCEEDED, ACK_PROPS),
        Pubrel(3, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND),
        Pubcomp(4, 0, ACK_PROPS),
        Subscribe(
            12,
            (
                Subscription("a/#", 2, no_local=True, retain_as_published=True, retain_handling=2),
                Subscription("$share/grp/s/+", 1, retain_handling=1),
            ),
            Properties(subscription_identifiers=(77,), user_properties=(("x", "y"),)),
        ),
        Suback(12, (2, 0x8F, 0x9E, 0xA1, 0xA2, 0x97), ACK_PROPS),
        Unsubscribe(13, ("a/#",), Properties(user_properties=(("x", "y"),))),
        Unsuback(13, (0x00, 0x11, 0x87), ACK_PROPS),
        Unsuback(14, (0,)),
        Disconnect(ReasonCode.DISCONNECT_WITH_WILL),
        Disconnect(ReasonCode.SESSION_TAKEN_OVER, Properties(reason_string="moved", server_reference="b:1883")),
        Disconnect(0, Properties(session_expiry_interval=0)),  # client -> server
        Auth(),
        Auth(ReasonCode.CONTINUE_AUTHENTICATION, Properties(authentication_method="m", authentication_data=b"\x01")),
        Auth(ReasonCode.REAUTHENTICATE, Properties(authentication_method="m")),
    ]


CASES = (
    [pytest.param(p, level, id=f"v{level}-{type(p).__name__}-{i}")
     for level in (3, 4, 5) for i, p in enumerate(v3_packets(level))]
    + [pytest.param(p, 5, id=f"v5rich-{type(p).__name__}-{i}") for i, p in enumerate(v5_packets())]
)


@pytest.mark.parametrize(("packet", "level"), CASES)
def test_roundtrip(packet, level):
    data = encode(packet, level)
    assert decode_one(packet, data, level) == packet


@pytest.mark.parametrize(("packet", "level"), CASES)
def test_every_split_and_prefix(packet, level):
    data = encode(packet, level)
    if len(data) > 2000:
        # The 20 kB payload: check a few splits around the header instead of 20000.
        data_cuts = [0, 1, 2, 3, 4, 10, len(data) // 2, len(data) - 1]
        from .helpers import decoder_for

        for cut in data_cuts:
            decoder = decoder_for(packet, level)
            decoder.feed(data[:cut])
            assert decoder.next_packet() is None
            decoder.feed(data[cut:])
            assert decoder.next_packet() == packet
        return
    check_splits(packet, data, level)


def test_many_packets_in_one_feed_come_out_in_order():
    packets = [Publish(f"t/{i}", bytes([i]), qos=1, packet_id=i + 1) for i in range(200)]
    decoder = Decoder(protocol_level=4)
    decoder.feed(b"".join(encode(p, 4) for p in packets))
    assert list(decoder.packets()) == packets
    assert decoder.next_packet() is None


def test_server_learns_protocol_level_from_connect():
    decoder = Decoder(role="server")
    assert decoder.protocol_level is None
    decoder.feed(encode(Connect("c", protocol_level=5), 5))
    decoder.feed(encode(Publish("t", b"x", properties=Properties(topic_alias=1)), 5))
    connect, publish = list(decoder)
    assert decoder.protocol_level == 5
    assert publish.properties.topic_alias == 1


def test_client_infers_level_from_connack():
    for level in (4, 5):
        decoder = Decoder(role="client")
        decoder.feed(encode(Connack(), level) + encode(Puback(1, 0x10), 5 if level == 5 else 4))
        assert decoder.next_packet() == Connack()
        assert decoder.protocol_level == level
        assert decoder.next_packet() == Puback(1, 0x10 if level == 5 else 0)


def test_v3_encoding_drops_v5_only_fields():
    pub = Publish("t", b"x", 1, packet_id=3, properties=RICH_PUBLISH)
    assert encode(pub, 4) == encode(Publish("t", b"x", 1, packet_id=3), 4)
    assert encode(Puback(3, 0x80, ACK_PROPS), 4) == b"\x40\x02\x00\x03"
    assert encode(Disconnect(0x8E), 4) == b"\xe0\x00"
    assert encode(Unsuback(5, (0x11,)), 4) == b"\xb0\x02\x00\x05"


def test_v3_connack_and_suback_codes_are_mapped():
    assert encode(Connack(reason_code=ReasonCode.BANNED), 4) == b"\x20\x02\x00\x05"
    assert encode(Connack(reason_code=ReasonCode.SERVER_BUSY), 4) == b"\x20\x02\x00\x03"
    assert encode(Connack(True), 4) == b"\x20\x02\x01\x00"
    assert encode(Connack(True), 3) == b"\x20\x02\x00\x00"  # 3.1 has no session present
    assert encode(Suback(1, (0, 2, 0x87, 0x8F)), 4) == b"\x90\x06\x00\x01\x00\x02\x80\x80"


def test_known_wire_bytes():
    # Hand-assembled from the spec, so the codec is not only consistent with itself.
    assert encode(Connect("ab", keep_alive=10), 4) == (
        b"\x10\x0e\x00\x04MQTT\x04\x02\x00\x0a\x00\x02ab"
    )
    assert encode(Publish("a/b", b"hi", 1, packet_id=10), 4) == b"\x32\x09\x00\x03a/b\x00\x0ahi"
    assert encode(Publish("a/b", b"hi", 1, packet_id=10), 5) == b"\x32\x0a\x00\x03a/b\x00\x0a\x00hi"
    assert encode(Subscribe(1, (Subscription("a", 1, no_local=True, retain_handling=2),)), 5) == (
        b"\x82\x07\x00\x01\x00\x00\x01a\x25"
    )
    assert encode(Pingreq(), 4) == b"\xc0\x00"
    assert encode(Disconnect(0x04), 5) == b"\xe0\x01\x04"
    # a two-byte remaining length: 200 bytes of payload
    data = encode(Publish("t", b"z" * 200), 4)
    assert data[:3] == b"\x30\xcb\x01"  # 203 = 0x4B + 1*128


def test_empty_properties_are_shared():
    decoder = Decoder(protocol_level=5)
    decoder.feed(encode(Publish("t", b"x"), 5) + encode(Puback(1, 0, EMPTY_PROPERTIES), 5))
    pub, ack = list(decoder)
    assert pub.properties is EMPTY_PROPERTIES
    assert ack.properties is EMPTY_PROPERTIES
