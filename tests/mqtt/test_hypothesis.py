"""Property-based tests: round trips of generated packets, and fuzzing the decoder."""

from __future__ import annotations

import dataclasses
import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mqtt.decoder as decoder_module
from mqtt import Connect, Decoder, MQTTError, encode, patch_publish

from .helpers import decoder_for, role_for
from .strategies import level_and_packet, levels, packets, publishes

# MQTT_HYPOTHESIS_SCALE=10 for a long soak; the default keeps the folder fast.
SCALE = float(os.environ.get("MQTT_HYPOTHESIS_SCALE", "1"))


def _settings(examples: int) -> settings:
    return settings(
        max_examples=max(1, int(examples * SCALE)), deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )



@_settings(250)
@given(level_and_packet(), st.data())
def test_roundtrip_any_chunking(level_packet, data):
    level, packet = level_packet
    encoded = encode(packet, level)
    # random chunk boundaries
    cuts = sorted(data.draw(st.lists(st.integers(0, len(encoded)), max_size=4)))
    decoder = decoder_for(packet, level)
    got = []
    prev = 0
    for cut in cuts + [len(encoded)]:
        decoder.feed(encoded[prev:cut])
        prev = cut
        got.extend(decoder)
        if cut < len(encoded):
            assert got == []
    assert got == [packet]
    assert encode(got[0], level) == encoded


@_settings(120)
@given(level_and_packet())
def test_every_proper_prefix_needs_more_data(level_packet):
    level, packet = level_packet
    encoded = encode(packet, level)
    for cut in range(len(encoded)):
        decoder = decoder_for(packet, level)
        decoder.feed(encoded[:cut])
        assert decoder.next_packet() is None


@_settings(200)
@given(levels.flatmap(lambda lvl: st.tuples(st.just(lvl), publishes(lvl, from_server=True))),
       st.integers(1, 0xFFFF), st.booleans() | st.none())
def test_patch_publish_matches_encoding(level_publish, new_id, dup):
    level, pub = level_publish
    if not pub.qos:
        pub = dataclasses.replace(pub, qos=1, packet_id=1)
    encoded = encode(pub, level)
    want = dataclasses.replace(pub, packet_id=new_id, dup=pub.dup if dup is None else dup)
    assert patch_publish(encoded, packet_id=new_id, dup=dup) == encode(want, level)


ROLES_LEVELS = st.sampled_from(
    [("server", None), ("server", 3), ("server", 4), ("server", 5),
     ("client", None), ("client", 4), ("client", 5)]
)


def _feed_all(role: str, level: int | None, chunks: list[bytes]) -> None:
    decoder = Decoder(role=role, protocol_level=level)
    try:
        for chunk in chunks:
            decoder.feed(chunk)
            for _packet in decoder:
                pass
    except MQTTError:
        pass  # the only exceptions allowed out of the decoder


@_settings(1500)
@given(ROLES_LEVELS, st.lists(st.binary(max_size=40), max_size=6))
def test_arbitrary_bytes_raise_only_mqtt_errors(role_level, chunks):
    _feed_all(*role_level, chunks)


@_settings(600)
@given(level_and_packet(), st.data())
def test_mutated_encodings_raise_only_mqtt_errors(level_packet, data):
    """Random bytes rarely get past the fixed header; mutated real packets reach deep."""
    level, packet = level_packet
    encoded = bytearray(encode(packet, level))
    for _ in range(data.draw(st.integers(1, 3))):
        op = data.draw(st.sampled_from(["flip", "set", "drop", "insert"]))
        i = data.draw(st.integers(0, len(encoded) - 1))
        if op == "flip":
            encoded[i] ^= 1 << data.draw(st.integers(0, 7))
        elif op == "set":
            encoded[i] = data.draw(st.integers(0, 255))
        elif op == "drop" and len(encoded) > 1:
            del encoded[i]
        else:
            encoded.insert(i, data.draw(st.integers(0, 255)))
    role = decoder_for(packet, level).role
    start_level = None if type(packet).__name__ == "Connect" else level
    _feed_all(role, start_level, [bytes(encoded), b"\xc0\x00\xd0\x00" * 2])


@_settings(150)
@given(levels.flatmap(lambda lvl: st.tuples(st.just(lvl), st.lists(packets(lvl), max_size=8))),
       st.data(), st.sampled_from([1, 7, 1 << 16]))
def test_packet_streams_in_any_chunking(level_packets, data, compact_at):
    """Many packets back to back, cut anywhere, with buffer compaction at any point."""
    level, stream = level_packets
    server_side = [p for p in stream if role_for(p) == "server" and not isinstance(p, Connect)]
    encoded = b"".join(encode(p, level) for p in server_side)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(encoded)), max_size=10)))
    saved = decoder_module._COMPACT_AT
    decoder_module._COMPACT_AT = compact_at
    try:
        decoder = Decoder(role="server", protocol_level=level)
        got = []
        prev = 0
        for cut in cuts + [len(encoded)]:
            decoder.feed(encoded[prev:cut])
            prev = cut
            got.extend(decoder)
    finally:
        decoder_module._COMPACT_AT = saved
    assert got == server_side
    assert decoder.buffered == 0
