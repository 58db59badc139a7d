"""A table of malformed inputs, each with the reason code the decoder must raise.

Each case is raw bytes assembled by hand (not by our encoder), so a shared bug in the
encoder and the decoder cannot hide. `match` pins the rule that fired, so a case cannot
pass because some other check rejected the bytes first.
"""

from __future__ import annotations

import re

import pytest

from mqtt import (
    Decoder,
    MalformedPacket,
    MQTTError,
    PacketTooLarge,
    ProtocolError,
    Publish,
    RemoteProtocolError,
    UnsupportedProtocolVersion,
    encode,
)
from mqtt.reason_codes import CONNACK_REASONS, DISCONNECT_REASONS
from tests.mqtt.helpers import pkt, props, s, u16


def connect(name: bytes = b"MQTT", level: int = 4, flags: int = 0x02, body: bytes | None = None,
            cprops: bytes | None = None) -> bytes:
    if body is None:
        body = s("cid")
    head = s(name) + bytes((level, flags)) + u16(60)
    if level == 5:
        head += props() if cprops is None else cprops
    return pkt(0x10, head + body)


def publish5(topic: bytes | str, pprops: bytes, qos: int = 0, payload: bytes = b"x") -> bytes:
    pid = u16(1) if qos else b""
    return pkt(0x30 | qos << 1, s(topic) + pid + pprops + payload)


def subscribe(filters: list[tuple[str, int]], level: int = 5, pid: int = 1) -> bytes:
    body = u16(pid) + (props() if level == 5 else b"")
    for topic_filter, options in filters:
        body += s(topic_filter) + bytes((options,))
    return pkt(0x82, body)


def unsubscribe(filters: list[str], level: int = 5, pid: int = 1) -> bytes:
    body = u16(pid) + (props() if level == 5 else b"")
    return pkt(0xA2, body + b"".join(s(f) for f in filters))


S, C = "server", "client"
M, P, TF, TN, TL, UV = 0x81, 0x82, 0x8F, 0x90, 0x95, 0x84

# (id, role, level, data, reason code, message regex)
CASES = [
    # --- fixed header
    ("remaining-length-5-bytes", S, 4, b"\x30\xff\xff\xff\xff\x01", M, "longer than four"),
    ("remaining-length-not-minimal", S, 4, b"\x30\x80\x00", M, "minimally"),
    ("packet-type-0", S, 4, b"\x00\x00", M, "reserved packet type"),
    ("pubrel-flags-0", S, 4, pkt(0x60, u16(1)), M, "reserved flag bits"),
    # 3.1's DUP on a resent PUBREL (0x6A) is for level 3 only; 3.1.1 and 5.0 fix the flags.
    ("pubrel-dup-v311", S, 4, pkt(0x6A, u16(1)), M, "reserved flag bits"),
    ("pubrel-dup-v5", S, 5, pkt(0x6A, u16(1)), M, "reserved flag bits"),
    ("pubrel-other-flags-v31", S, 3, pkt(0x6E, u16(1)), M, "reserved flag bits"),
    ("subscribe-flags-0", S, 4, b"\x80" + subscribe([("a", 0)], 4)[1:], M, "reserved flag bits"),
    ("unsubscribe-flags-3", S, 4, b"\xa3" + unsubscribe(["a"], 4)[1:], M, "reserved flag bits"),
    ("puback-flags", S, 4, pkt(0x42, u16(1)), M, "reserved flag bits"),
    ("connect-flags", S, None, b"\x11" + connect()[1:], M, "reserved flag bits"),
    ("pingreq-flags", S, 4, b"\xc1\x00", M, "reserved flag bits"),
    ("disconnect-flags", S, 4, b"\xe8\x00", M, "reserved flag bits"),
    ("publish-qos-3", S, 4, pkt(0x36, s("t") + u16(1)), M, "QoS 3"),
    ("publish-qos0-dup", S, 4, pkt(0x38, s("t")), M, "DUP"),
    ("auth-on-v311", S, 4, b"\xf0\x00", M, "AUTH is reserved"),
    # --- body shorter / longer than the remaining length says
    ("publish-topic-past-end", S, 4, pkt(0x30, u16(10) + b"abc"), M, "runs past the end"),
    ("publish-no-packet-id", S, 4, pkt(0x32, s("t") + b"\x00"), M, "too short for its packet id"),
    ("puback-1-byte", S, 4, pkt(0x40, b"\x01"), M, "too short"),
    ("connect-truncated", S, None, connect()[:-1].replace(b"\x10\x0f", b"\x10\x0e"), M, "ends early"),
    ("connect-trailing-byte", S, None, connect(body=s("cid") + b"!"), M, "left over"),
    ("pingreq-with-body", S, 4, pkt(0xC0, b"\x00"), M, "with a body"),
    ("pingresp-with-body", C, 4, pkt(0xD0, b"\x00"), M, "with a body"),
    ("puback-v311-3-bytes", S, 4, pkt(0x40, u16(1) + b"\x00"), M, "longer than two bytes"),
    ("disconnect-v311-body", S, 4, pkt(0xE0, b"\x00"), M, "with a body before MQTT 5"),
    ("unsuback-v311-trailing", C, 4, pkt(0xB0, u16(1) + b"\x00"), M, "left over"),
    ("connack-v311-trailing", C, 4, pkt(0x20, b"\x00\x00\x00"), M, "left over"),
    ("props-length-past-end", S, 5, pkt(0x30, s("t") + b"\x05\x01"), M, "property length runs past"),
    ("prop-value-past-section", S, 5, pkt(0x30, s("t") + b"\x02\x02\x00\x00\x00\x01"), M, "ends early"),
    ("puback-v5-props-trailing", S, 5, pkt(0x40, u16(1) + b"\x00" + props() + b"\x00"), M, "left over"),
    # --- UTF-8
    ("utf8-invalid-byte", S, 4, pkt(0x30, s(b"\xff") + b"x"), M, "UTF-8"),
    ("utf8-overlong", S, 4, pkt(0x30, s(b"\xc0\xaf") + b"x"), M, "UTF-8"),
    ("utf8-surrogate", S, 4, pkt(0x30, s(b"a\xed\xa0\x80") + b"x"), M, "UTF-8"),
    ("utf8-truncated-sequence", S, 4, pkt(0x30, s(b"\xe4\xb8") + b"x"), M, "UTF-8"),
    ("utf8-nul", S, 4, pkt(0x30, s(b"a\x00b") + b"x"), M, "U\\+0000"),
    ("utf8-nul-in-client-id", S, None, connect(body=s(b"c\x00")), M, "U\\+0000"),
    ("utf8-nul-in-user-property", S, 5, publish5("t", props(b"\x26" + s("k") + s(b"\x00"))), M, "U\\+0000"),
    ("utf8-bad-filter", S, 4, pkt(0x82, u16(1) + s(b"\xfe") + b"\x00"), M, "UTF-8"),
    # --- CONNECT
    ("connect-mqtt-level-3", S, None, connect(b"MQTT", 3), UV, "not MQTT"),
    ("connect-mqisdp-level-4", S, None, connect(b"MQIsdp", 4), UV, "not MQTT"),
    ("connect-level-6", S, None, connect(b"MQTT", 6), UV, "not MQTT"),
    ("connect-level-0", S, None, connect(b"MQTT", 0), UV, "not MQTT"),
    # MQTT-3.1.2-1: not MQTT at all: malformed, closed without a CONNACK (as Mosquitto 2.0.11);
    # MQTT or MQIsdp with a level that is not theirs gets 0x84 (MQTT-3.1.2-2).
    ("connect-unknown-name", S, None, connect(b"HTTP", 4), M, "is not MQTT"),
    ("connect-reserved-flag", S, None, connect(flags=0x03), M, "reserved flag is set"),
    ("connect-will-qos-no-will", S, None, connect(flags=0x0A), M, "without the will flag"),
    ("connect-will-retain-no-will", S, None, connect(flags=0x22), M, "without the will flag"),
    ("connect-will-qos-3", S, None, connect(flags=0x1E, body=s("c") + s("w") + s("x")), M, "will QoS 3"),
    ("connect-password-no-user-v311", S, None, connect(flags=0x42, body=s("c") + s("pw")), M, "password without"),
    ("connect-password-no-user-v31", S, None, connect(b"MQIsdp", 3, flags=0x42, body=s("c") + s("pw")), M, "password without"),
    ("connect-will-topic-wildcard", S, None, connect(flags=0x06, body=s("c") + s("w/#") + s("x")), TN, "wildcard"),
    ("connect-user-flag-no-user", S, None, connect(flags=0x82), M, "ends early"),
    ("second-connect-bad-level", S, 4, connect(b"MQTT", 9), P, "second CONNECT"),
    # --- properties
    ("prop-unknown-id", S, 5, publish5("t", props(b"\x7f\x00")), M, "unknown property"),
    ("prop-unknown-id-0", S, 5, publish5("t", props(b"\x00")), M, "unknown property"),
    # 2.2.2.2: an identifier not valid for its packet type is a Malformed Packet (0x81),
    # in every packet type (Mosquitto 2.0.11 answers 0x81 too).
    ("prop-not-allowed-topic-alias-in-connect", S, None, connect(level=5, cprops=props(b"\x23" + u16(1))), M, "not allowed in CONNECT"),
    ("prop-not-allowed-will-delay-in-publish", S, 5, publish5("t", props(b"\x18" + bytes(4))), M, "not allowed in PUBLISH"),
    ("prop-not-allowed-reason-string-in-subscribe", S, 5,
     pkt(0x82, u16(1) + props(b"\x1f" + s("r")) + s("a") + b"\x00"), M, "not allowed in SUBSCRIBE"),
    ("prop-not-allowed-in-will", S, None,
     connect(level=5, flags=0x06, body=s("c") + props(b"\x11" + bytes(4)) + s("w") + s("x")), M, "not allowed in WILL"),
    ("prop-session-expiry-in-publish", S, 5, publish5("t", props(b"\x11" + bytes(4))), M, "not allowed in PUBLISH"),
    ("prop-session-expiry-in-subscribe", S, 5,
     pkt(0x82, u16(1) + props(b"\x11" + bytes(4)) + s("a") + b"\x00"), M, "not allowed in SUBSCRIBE"),
    ("prop-session-expiry-in-unsubscribe", S, 5,
     pkt(0xA2, u16(1) + props(b"\x11" + bytes(4)) + s("a")), M, "not allowed in UNSUBSCRIBE"),
    ("prop-session-expiry-in-puback", S, 5, pkt(0x40, u16(1) + b"\x00" + props(b"\x11" + bytes(4))), M, "not allowed in PUBACK"),
    ("prop-duplicate", S, 5, publish5("t", props(b"\x02" + bytes(4), b"\x02" + bytes(4))), P, "appears twice"),
    ("prop-duplicate-content-type", S, 5, publish5("t", props(b"\x03" + s("a"), b"\x03" + s("a"))), P, "appears twice"),
    ("prop-receive-maximum-0", S, None, connect(level=5, cprops=props(b"\x21" + u16(0))), P, "receive_maximum must not be 0"),
    ("prop-maximum-packet-size-0", S, None, connect(level=5, cprops=props(b"\x27" + bytes(4))), P, "maximum_packet_size must not be 0"),
    ("prop-topic-alias-0", S, 5, publish5("t", props(b"\x23" + u16(0))), P, "topic_alias must not be 0"),
    ("prop-payload-format-2", S, 5, publish5("t", props(b"\x01\x02")), P, "payload_format_indicator must be 0 or 1"),
    ("prop-request-problem-2", S, None, connect(level=5, cprops=props(b"\x17\x02")), P, "request_problem_information must be 0 or 1"),
    ("prop-request-response-2", S, None, connect(level=5, cprops=props(b"\x19\x05")), P, "request_response_information must be 0 or 1"),
    ("prop-maximum-qos-2", C, 5, pkt(0x20, b"\x00\x00" + props(b"\x24\x02")), P, "maximum_qos must be 0 or 1"),
    ("prop-subscription-id-0", S, 5, pkt(0x82, u16(1) + props(b"\x0b\x00") + s("a") + b"\x00"), P, "subscription_identifiers must not be 0"),
    ("prop-subscription-id-twice-in-subscribe", S, 5,
     pkt(0x82, u16(1) + props(b"\x0b\x01", b"\x0b\x02") + s("a") + b"\x00"), P, "given twice"),
    ("prop-subscription-id-from-client", S, 5, publish5("t", props(b"\x0b\x01")), P, "subscription identifier"),
    ("prop-session-expiry-in-server-disconnect", C, 5, pkt(0xE0, b"\x00" + props(b"\x11" + bytes(4))), P, "session expiry"),
    ("auth-data-without-method-connect", S, None, connect(level=5, cprops=props(b"\x16" + s(b"d"))), P, "no authentication method"),
    ("auth-data-without-method-connack", C, 5, pkt(0x20, b"\x00\x00" + props(b"\x16" + s(b"d"))), P, "no authentication method"),
    ("auth-data-without-method-auth", S, 5, pkt(0xF0, b"\x18" + props(b"\x16" + s(b"d"))), P, "no authentication method"),
    # --- packet ids
    ("publish-qos1-packet-id-0", S, 4, pkt(0x32, s("t") + u16(0)), P, "packet id 0"),
    ("publish-qos2-packet-id-0", S, 5, pkt(0x34, s("t") + u16(0) + props()), P, "packet id 0"),
    ("puback-packet-id-0", S, 4, pkt(0x40, u16(0)), P, "packet id 0"),
    ("pubrec-packet-id-0", S, 4, pkt(0x50, u16(0)), P, "packet id 0"),
    ("pubrel-packet-id-0", S, 4, pkt(0x62, u16(0)), P, "packet id 0"),
    ("pubcomp-packet-id-0", C, 5, pkt(0x70, u16(0)), P, "packet id 0"),
    ("subscribe-packet-id-0", S, 4, subscribe([("a", 0)], 4, pid=0), P, "packet id 0"),
    ("unsubscribe-packet-id-0", S, 4, unsubscribe(["a"], 4, pid=0), P, "packet id 0"),
    ("suback-packet-id-0", C, 4, pkt(0x90, u16(0) + b"\x00"), P, "packet id 0"),
    ("unsuback-packet-id-0", C, 4, pkt(0xB0, u16(0)), P, "packet id 0"),
    # --- topic names
    ("publish-topic-plus", S, 4, pkt(0x30, s("a/+") + b"x"), TN, "wildcard"),
    ("publish-topic-hash", S, 5, publish5("a/#", props()), TN, "wildcard"),
    ("publish-topic-embedded-plus", S, 4, pkt(0x30, s("a+b") + b"x"), TN, "wildcard"),
    ("publish-empty-topic-v5", S, 5, publish5("", props()), P, "empty topic name and no topic alias"),
    ("publish-empty-topic-v311", S, 4, pkt(0x30, s("") + b"x"), M, "empty topic name"),
    ("publish-empty-topic-v31", S, 3, pkt(0x30, s("") + b"x"), M, "empty topic name"),
    # --- SUBSCRIBE / UNSUBSCRIBE
    ("subscribe-empty", S, 5, pkt(0x82, u16(1) + props()), P, "without subscriptions"),
    ("subscribe-empty-v311", S, 4, pkt(0x82, u16(1)), P, "without subscriptions"),
    ("unsubscribe-empty", S, 5, pkt(0xA2, u16(1) + props()), P, "without topic filters"),
    ("unsubscribe-empty-v311", S, 4, pkt(0xA2, u16(1)), P, "without topic filters"),
    ("subscribe-options-reserved-v5", S, 5, subscribe([("a", 0x40)]), M, "reserved bits"),
    ("subscribe-options-reserved-bit7-v5", S, 5, subscribe([("a", 0x81)]), M, "reserved bits"),
    ("subscribe-options-reserved-v311", S, 4, subscribe([("a", 0x04)], 4), M, "reserved bits"),
    ("subscribe-retain-handling-3", S, 5, subscribe([("a", 0x30)]), M, "retain handling 3"),
    ("subscribe-qos-3-v5", S, 5, subscribe([("a", 0x03)]), M, "QoS 3"),
    ("subscribe-qos-3-v311", S, 4, subscribe([("a", 0x03)], 4), M, "QoS 3"),
    ("subscribe-no-options-byte", S, 4, pkt(0x82, u16(1) + s("a")), M, "ends early"),
    ("filter-hash-not-last", S, 5, subscribe([("a/#/b", 0)]), TF, "'#' must be"),
    ("filter-plus-partial", S, 5, subscribe([("a+", 0)]), TF, "'\\+' must be"),
    ("filter-plus-partial-mid", S, 4, subscribe([("a/b+/c", 0)], 4), TF, "'\\+' must be"),
    ("filter-hash-partial", S, 5, subscribe([("#a", 0)]), TF, "'#' must be"),
    ("filter-hash-suffix", S, 5, subscribe([("a/b#", 0)]), TF, "'#' must be"),
    ("filter-empty", S, 5, subscribe([("", 0)]), TF, "empty"),
    ("filter-second-invalid", S, 5, subscribe([("ok/+", 1), ("bad#", 0)]), TF, "'#' must be"),
    ("unsubscribe-filter-invalid", S, 4, unsubscribe(["a/#/b"], 4), TF, "'#' must be"),
    ("unsubscribe-filter-empty", S, 5, unsubscribe([""]), TF, "empty"),
    ("shared-empty-group", S, 5, subscribe([("$share//a", 0)]), TF, "empty group"),
    ("shared-no-filter", S, 5, subscribe([("$share/g", 0)]), TF, "no topic filter"),
    ("shared-empty-filter", S, 5, subscribe([("$share/g/", 0)]), TF, "no topic filter"),
    ("shared-bare", S, 4, subscribe([("$share", 0)], 4), TF, "no group"),
    ("shared-group-wildcard", S, 5, subscribe([("$share/g+/a", 0)]), TF, "wildcard"),
    ("shared-group-hash", S, 5, subscribe([("$share/#/a", 0)]), TF, "wildcard"),
    ("shared-bad-filter", S, 5, subscribe([("$share/g/a/#/b", 0)]), TF, "'#' must be"),
    ("shared-no-local", S, 5, subscribe([("$share/g/a", 0x04)]), P, "no_local on a shared"),
    # --- direction and order
    ("server-gets-connack", S, 4, pkt(0x20, b"\x00\x00"), P, "must not receive CONNACK"),
    ("server-gets-suback", S, 4, pkt(0x90, u16(1) + b"\x00"), P, "must not receive SUBACK"),
    ("server-gets-unsuback", S, 4, pkt(0xB0, u16(1)), P, "must not receive UNSUBACK"),
    ("server-gets-pingresp", S, 4, b"\xd0\x00", P, "must not receive PINGRESP"),
    ("client-gets-connect", C, 4, connect(), P, "must not receive CONNECT"),
    ("client-gets-subscribe", C, 4, subscribe([("a", 0)], 4), P, "must not receive SUBSCRIBE"),
    ("client-gets-unsubscribe", C, 4, unsubscribe(["a"], 4), P, "must not receive UNSUBSCRIBE"),
    ("client-gets-pingreq", C, 4, b"\xc0\x00", P, "must not receive PINGREQ"),
    ("first-packet-not-connect", S, None, pkt(0x30, s("t") + b"x"), P, "first packet must be CONNECT"),
    ("first-packet-pingreq", S, None, b"\xc0\x00", P, "first packet must be CONNECT"),
    ("client-first-packet-not-connack", C, None, pkt(0x30, s("t") + b"x"), P, "first packet must be CONNACK"),
    # --- reason codes and CONNACK
    ("connack-reserved-flags", C, 4, pkt(0x20, b"\x02\x00"), M, "reserved flag bits"),
    ("connack-v311-return-code-6", C, 4, pkt(0x20, b"\x00\x06"), M, "reserved"),
    ("connack-v5-undefined-reason", C, 5, pkt(0x20, b"\x00\x01" + props()), M, "not defined"),
    ("connack-session-present-refused", C, 5, pkt(0x20, b"\x01\x87" + props()), P, "session is present"),
    ("puback-undefined-reason", S, 5, pkt(0x40, u16(1) + b"\x92"), M, "not defined"),
    ("pubrel-undefined-reason", S, 5, pkt(0x62, u16(1) + b"\x10"), M, "not defined"),
    ("suback-undefined-reason", C, 5, pkt(0x90, u16(1) + props() + b"\x03"), M, "not defined"),
    ("suback-v311-undefined-code", C, 4, pkt(0x90, u16(1) + b"\x87"), M, "not defined"),
    ("suback-no-codes", C, 4, pkt(0x90, u16(1)), P, "without reason codes"),
    ("unsuback-undefined-reason", C, 5, pkt(0xB0, u16(1) + props() + b"\x01"), M, "not defined"),
    ("disconnect-undefined-reason", S, 5, pkt(0xE0, b"\x01"), M, "not defined"),
    ("auth-undefined-reason", S, 5, pkt(0xF0, b"\x80" + props()), M, "not defined"),
]


def _decode_until_error(decoder: Decoder, chunks: list[bytes]) -> RemoteProtocolError:
    with pytest.raises(RemoteProtocolError) as info:
        for chunk in chunks:
            decoder.feed(chunk)
            for _packet in decoder:
                pass
    return info.value


@pytest.mark.parametrize(
    ("role", "level", "data", "code", "match"),
    [pytest.param(*case[1:], id=case[0]) for case in CASES],
)
def test_malformed(role, level, data, code, match):
    err = _decode_until_error(Decoder(role=role, protocol_level=level), [data])
    assert err.reason_code == code, err
    assert re.search(match, err.message), err.message
    # The same error whatever the chunking.
    err2 = _decode_until_error(
        Decoder(role=role, protocol_level=level), [data[i : i + 1] for i in range(len(data))]
    )
    assert (type(err2), err2.reason_code, err2.message) == (type(err), err.reason_code, err.message)


def test_case_ids_are_unique():
    ids = [case[0] for case in CASES]
    assert len(ids) == len(set(ids))


def test_error_classes_carry_their_codes():
    err = _decode_until_error(Decoder(protocol_level=4), [b"\x30\xff\xff\xff\xff\x01"])
    assert isinstance(err, MalformedPacket)
    err = _decode_until_error(Decoder(), [connect(b"MQTT", 7)])
    assert isinstance(err, UnsupportedProtocolVersion)
    err = _decode_until_error(Decoder(protocol_level=4), [pkt(0x40, u16(0))])
    assert isinstance(err, ProtocolError)


def test_duplicate_user_properties_and_several_subscription_ids_are_fine():
    data = pkt(0x30, s("t") + props(b"\x26" + s("k") + s("v"), b"\x26" + s("k") + s("v"),
                                    b"\x0b\x01", b"\x0b\x02") + b"x")
    decoder = Decoder(role="client", protocol_level=5)
    decoder.feed(data)
    packet = decoder.next_packet()
    assert packet.properties.user_properties == (("k", "v"), ("k", "v"))
    assert packet.properties.subscription_identifiers == (1, 2)


@pytest.mark.parametrize("first", [0x6A, 0x8A, 0xAA])
def test_v31_dup_flag_on_pubrel_subscribe_unsubscribe_is_accepted(first):
    """MQTT 3.1 sets DUP on a resent PUBREL, SUBSCRIBE or UNSUBSCRIBE (3.1 section 3.6)."""
    body = {0x6A: u16(7), 0x8A: u16(7) + s("a") + b"\x00", 0xAA: u16(7) + s("a")}[first]
    decoder = Decoder(role="server", protocol_level=3)
    decoder.feed(pkt(first, body))
    packet = decoder.next_packet()
    assert packet is not None and packet.packet_id == 7


def test_packet_too_large_after_only_the_fixed_header():
    decoder = Decoder(protocol_level=4, max_packet_size=1 << 20)
    decoder.feed(b"\x30")
    assert decoder.next_packet() is None
    decoder.feed(b"\xff\xff\xff\x7f")  # remaining length 268435455: 256 MB
    with pytest.raises(PacketTooLarge) as info:
        decoder.next_packet()
    assert info.value.reason_code == 0x95
    assert decoder.buffered == 0  # nothing of the body was waited for or kept


def test_packet_too_large_counts_the_whole_packet():
    data = encode(Publish("t", b"x" * 100), 4)  # 2-byte header + 103
    assert len(data) == 105
    ok = Decoder(protocol_level=4, max_packet_size=105)
    ok.feed(data)
    assert ok.next_packet() == Publish("t", b"x" * 100)
    too_small = Decoder(protocol_level=4)
    too_small.max_packet_size = 104  # settable after construction
    too_small.feed(data[:2])
    with pytest.raises(PacketTooLarge):
        too_small.next_packet()


def test_decoder_is_dead_after_an_error():
    decoder = Decoder(protocol_level=4)
    decoder.feed(pkt(0x40, u16(0)))
    with pytest.raises(ProtocolError) as first:
        decoder.next_packet()
    for call in (lambda: decoder.next_packet(), lambda: decoder.feed(b"\xc0\x00"), lambda: list(decoder)):
        with pytest.raises(ProtocolError) as again:
            call()
        assert again.value is first.value


def test_valid_packets_before_the_bad_one_come_out_first():
    decoder = Decoder(protocol_level=4)
    decoder.feed(b"\xc0\x00" + pkt(0x40, u16(5)) + pkt(0x40, u16(0)))
    assert decoder.next_packet() is not None
    assert decoder.next_packet() is not None
    with pytest.raises(ProtocolError):
        decoder.next_packet()


@pytest.mark.parametrize("case", [c for c in CASES if c[1] == S and c[2] is not None], ids=lambda c: c[0])
def test_errors_after_connect_are_valid_disconnect_reasons(case):
    """The broker answers a post-CONNECT error with DISCONNECT(reason_code) on v5."""
    assert case[4] in DISCONNECT_REASONS


@pytest.mark.parametrize("case", [c for c in CASES if c[2] is None and c[1] == S], ids=lambda c: c[0])
def test_errors_in_connect_are_valid_connack_reasons(case):
    """The broker answers a bad CONNECT with CONNACK(reason_code)."""
    assert case[4] in CONNACK_REASONS


def test_mqtt_error_is_the_only_base():
    for cls in (MalformedPacket, ProtocolError, PacketTooLarge, UnsupportedProtocolVersion):
        assert issubclass(cls, RemoteProtocolError) and issubclass(cls, MQTTError)
