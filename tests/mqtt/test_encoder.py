"""Encoder-side checks: what cannot be encoded raises LocalProtocolError; patch_publish, split_publish."""

from __future__ import annotations

from typing import Any

import pytest

import native
from mqtt import (
    Auth,
    Connack,
    Connect,
    Decoder,
    Disconnect,
    LocalProtocolError,
    Properties,
    Puback,
    Publish,
    Suback,
    Subscribe,
    Subscription,
    Unsubscribe,
    Will,
    encode,
    patch_publish,
    split_publish,
)

# Values of the wrong type, to check that encoding refuses them at run time.
WRONG_TYPE_TEXT: Any = "text"
WRONG_TYPE_PAIRS: Any = (("a",),)


@pytest.mark.parametrize(
    ("packet", "level"),
    [
        pytest.param(Publish("t", b"x", qos=1), 4, id="qos1-without-packet-id"),
        pytest.param(Publish("t", b"x", qos=2, packet_id=0), 5, id="packet-id-0"),
        pytest.param(Publish("t", b"x", qos=1, packet_id=70000), 4, id="packet-id-too-big"),
        pytest.param(Publish("t", b"x", dup=True), 4, id="dup-on-qos0"),
        pytest.param(Publish("a/+", b"x"), 4, id="wildcard-topic"),
        pytest.param(Publish("a/#", b"x"), 5, id="hash-topic"),
        pytest.param(Publish("", b"x"), 4, id="empty-topic-v311"),
        pytest.param(Publish("", b"x"), 5, id="empty-topic-no-alias"),
        pytest.param(Publish("a\ud800", b"x"), 4, id="lone-surrogate"),
        pytest.param(Publish("t", properties=Properties(session_expiry_interval=1)), 5, id="prop-not-allowed"),
        pytest.param(Publish("t", properties=Properties(topic_alias=0)), 5, id="topic-alias-0"),
        pytest.param(Publish("t", properties=Properties(payload_format_indicator=2)), 5, id="pfi-2"),
        pytest.param(Publish("t", properties=Properties(message_expiry_interval=-1)), 5, id="negative-u32"),
        pytest.param(Publish("t", properties=Properties(user_properties=WRONG_TYPE_PAIRS)), 5, id="bad-user-property"),
        pytest.param(Auth(), 4, id="auth-on-v311"),
        pytest.param(Auth(0x87), 5, id="auth-bad-reason"),
        pytest.param(Puback(1, 0x92), 5, id="puback-bad-reason"),
        pytest.param(Disconnect(0x01), 5, id="disconnect-bad-reason"),
        pytest.param(Connack(reason_code=0x10), 5, id="connack-bad-reason"),
        pytest.param(Connack(True, 0x87), 4, id="connack-session-present-on-refusal"),
        pytest.param(Suback(1, (0x11,)), 5, id="suback-bad-reason"),
        pytest.param(Subscribe(1, ()), 4, id="subscribe-empty"),
        pytest.param(Subscribe(1, (Subscription("a/#/b"),)), 4, id="subscribe-bad-filter"),
        pytest.param(Subscribe(1, (Subscription("a", no_local=True),)), 4, id="no-local-on-v311"),
        pytest.param(Subscribe(1, (Subscription("$share/g/a", no_local=True),)), 5, id="no-local-shared"),
        pytest.param(
            Subscribe(1, (Subscription("a"),), Properties(subscription_identifiers=(1, 2))), 5,
            id="two-subscription-ids",
        ),
        pytest.param(Unsubscribe(1, ()), 4, id="unsubscribe-empty"),
        pytest.param(Connect("c", password=b"p"), 4, id="password-without-user-v311"),
        pytest.param(Connect("c", protocol_level=4), 5, id="connect-level-mismatch"),
        pytest.param(Connect("c", will=Will("w/+", b"")), 4, id="will-topic-wildcard"),
        pytest.param(Connect("c\x00"), 4, id="nul-in-client-id"),
        pytest.param(Publish("t"), 6, id="level-6"),
        pytest.param(Connack(), 2, id="level-2"),
    ],
)
def test_cannot_encode(packet, level):
    with pytest.raises(LocalProtocolError):
        encode(packet, level)


def test_a_text_payload_is_refused():
    # Pure Python refuses it at the encoding; the mypyc-compiled packets (native) check
    # their field types at run time, so there it is refused at construction already.
    refused = TypeError if native.status().compiled else LocalProtocolError
    with pytest.raises(refused):
        encode(Publish("t", WRONG_TYPE_TEXT), 4)


@pytest.mark.parametrize(
    "build",
    [
        lambda: Publish("t", qos=3),
        lambda: Puback(0),
        lambda: Puback(65536),
        lambda: Subscription("a", qos=3),
        lambda: Subscription("a", retain_handling=3),
        lambda: Will("w", b"", qos=5),
        lambda: Connect("c", protocol_level=6),
        lambda: Connect("c", protocol_level=4, protocol_name="MQIsdp"),
        lambda: Connect("c", keep_alive=70000),
        lambda: Subscribe(0, (Subscription("a"),)),
    ],
)
def test_invalid_packets_cannot_be_built(build):
    with pytest.raises(LocalProtocolError):
        build()


def test_connect_level_3_is_named_mqisdp():
    assert Connect("c", protocol_level=3).protocol_name == "MQIsdp"
    assert encode(Connect("c", protocol_level=3), 3)[2:10] == b"\x00\x06MQIsdp"


def test_sequences_become_tuples():
    subscriptions: Any = [Subscription("a")]  # a list where the type says tuple
    topic_filters: Any = ["a"]
    if native.status().compiled:  # the compiled packets check the declared types
        with pytest.raises(TypeError):
            Subscribe(1, subscriptions)
        with pytest.raises(TypeError):
            Unsubscribe(1, topic_filters)
        return
    assert Subscribe(1, subscriptions).subscriptions == (Subscription("a"),)
    assert Unsubscribe(1, topic_filters).topic_filters == ("a",)


@pytest.mark.parametrize("level", [3, 4, 5])
@pytest.mark.parametrize("payload_size", [0, 100, 200, 20000, 3_000_000])
def test_patch_publish(level, payload_size):
    """patch_publish == encoding again, across 1..4-byte remaining lengths."""
    props = Properties(user_properties=(("k", "v"),), message_expiry_interval=9) if level == 5 else Properties()
    pub = Publish("some/topic", b"p" * payload_size, qos=1, packet_id=1, properties=props)
    data = encode(pub, level)
    for packet_id, dup in [(2, None), (65535, True), (None, True), (300, False)]:
        patched = patch_publish(data, packet_id=packet_id, dup=dup)
        want = Publish(
            "some/topic", b"p" * payload_size, qos=1, dup=bool(dup), packet_id=packet_id or 1,
            properties=props,
        )
        assert patched == encode(want, level)
    # and the result decodes
    decoder = Decoder(protocol_level=level)
    decoder.feed(patch_publish(data, packet_id=77, dup=True))
    got = decoder.next_packet()
    assert (got.packet_id, got.dup, len(got.payload)) == (77, True, payload_size)


@pytest.mark.parametrize("level", [3, 4, 5])
@pytest.mark.parametrize("payload_size", [0, 100, 20000, 3_000_000])
@pytest.mark.parametrize("qos", [1, 2])
def test_split_publish(level, payload_size, qos):
    """head + packet id + tail == the same PUBLISH encoded with that id, across 1..4-byte
    remaining lengths (what a message's subscribers get from its one encoding)."""
    props = Properties(user_properties=(("k", "v"),), message_expiry_interval=9) if level == 5 else Properties()
    data = encode(Publish("some/topic", b"p" * payload_size, qos=qos, retain=True, packet_id=1, properties=props), level)
    head, tail = split_publish(data)
    for packet_id in (1, 2, 256, 65535):
        want = encode(Publish("some/topic", b"p" * payload_size, qos=qos, retain=True, packet_id=packet_id,
                              properties=props), level)
        assert head + packet_id.to_bytes(2, "big") + tail == want


@pytest.mark.parametrize("data", [encode(Publish("t", b"x"), 4), encode(Puback(1), 4)], ids=["qos0", "not-publish"])
def test_split_publish_refuses(data):
    with pytest.raises(LocalProtocolError):
        split_publish(data)


def test_patch_publish_clears_dup_and_keeps_qos_retain():
    pub = Publish("t", b"x", qos=2, retain=True, dup=True, packet_id=5)
    data = encode(pub, 4)
    assert patch_publish(data, dup=False) == encode(Publish("t", b"x", 2, True, False, 5), 4)
    assert patch_publish(data) == data


@pytest.mark.parametrize(
    "data",
    [encode(Publish("t", b"x"), 4), encode(Puback(1), 4)],
    ids=["qos0", "not-publish"],
)
def test_patch_publish_refuses(data):
    with pytest.raises(LocalProtocolError):
        patch_publish(data, packet_id=2)


def test_patch_publish_refuses_bad_packet_id():
    data = encode(Publish("t", b"x", qos=1, packet_id=1), 4)
    for bad in (0, 65536, -1):
        with pytest.raises(LocalProtocolError):
            patch_publish(data, packet_id=bad)


def test_v5_short_forms():
    # reason code and property length omitted when 0 and empty [MQTT-3.4.2.1, 3.14.2.1]
    assert encode(Puback(7), 5) == b"\x40\x02\x00\x07"
    assert encode(Puback(7, 0x10), 5) == b"\x40\x03\x00\x07\x10"
    assert encode(Puback(7, 0, Properties()), 5) == b"\x40\x02\x00\x07"
    assert encode(Disconnect(), 5) == b"\xe0\x00"
    assert encode(Auth(), 5) == b"\xf0\x00"
    assert encode(Puback(7, 0, Properties(reason_string="r")), 5) == b"\x40\x08\x00\x07\x00\x04\x1f\x00\x01r"
