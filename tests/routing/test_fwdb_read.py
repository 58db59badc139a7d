"""The `fwdb` frame read by hand (`routing.batch.read_fwdb`): for every frame it reads,
what it reads is what cbor2's decoding and `unpack` read; anything else (malformed,
truncated, unusual) it leaves to cbor2 (None), and it never raises."""

from __future__ import annotations

import os
from typing import Callable

import cbor2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gossip import wire
from mqtt import EMPTY_PROPERTIES, Properties
from routing.batch import FWDB, RESENT, LinkItem, Unpacked, fwdb_body, read_fwdb, unpack, unpack_read
from routing.forward import ForwardTarget
from session_store import records
from session_store.model import Message

SCALE = float(os.environ.get("MQTT_HYPOTHESIS_SCALE", "1"))  # as tests/mqtt/test_hypothesis.py
PROPS = Properties(content_type="text/plain", user_properties=(("k", "v"),), message_expiry_interval=30)
PLAIN = ForwardTarget(True, (), False)
MESSAGES = [
    Message("s/1", b"hi", 1, False, EMPTY_PROPERTIES, None, "pub", 42, "A"),
    Message("", b"", 0, False, EMPTY_PROPERTIES, None, None, 0, None),
    Message("é/ü/名前", b"\xff" * 23, 1, True, EMPTY_PROPERTIES, None, "p" * 23, 23, "n" * 24),
    Message("t" * 300, b"x" * 70_000, 2, False, EMPTY_PROPERTIES, None, "q" * 256, 2**32, "B"),
    Message("a/b", b"x" * 256, 1, False, EMPTY_PROPERTIES, None, "pub", 2**64 - 1, "A"),
    Message("s/2", b"\x00" * 300, 2, True, PROPS, 1_700_000_000.5, None, 7, None),  # properties, expiry: cbor2's
    Message("a/b", b"x", 0, False, EMPTY_PROPERTIES, None, "pub", 1_790_000_000_000_000, "A"),  # a node's ids
    Message("a/b", b"x", 0, False, EMPTY_PROPERTIES, None, "pub", 300, "A"),
]
SHARES = [PLAIN, ForwardTarget(False, (("g", "s/#"), ("h", "+/2")), True, True), ForwardTarget(True, (), True, True)]


def _outcome(read: Callable[[object], Unpacked], item: object) -> object:
    """An item as the cluster sees it: its message's fields and its share, or the
    error it raises."""
    try:
        msg, *share = read(item)
    except Exception as exc:
        return type(exc)
    return records.message_map(msg), (msg.topic, msg.payload, msg.qos, msg.retain, msg.properties, msg.expires_at,
                                      msg.publisher, msg.msg_id, msg.origin), share


def _same_as_cbor2(body: bytes) -> bool:
    """Whether `read_fwdb` reads `body` as cbor2 and `unpack` do (or leaves it to them)."""
    fast = read_fwdb(body)
    if fast is None:
        return False
    frame = wire.decode_frame_body(body)  # must not raise: the hand reader took it
    epoch, seq, resent, items = fast
    assert (frame["t"], frame["e"], frame["s"], frame.get(RESENT) is True) == (FWDB, epoch, seq, resent)
    assert [_outcome(unpack_read, i) for i in items] == [_outcome(unpack, i) for i in frame["m"]]
    return True


def test_every_frame_the_sender_writes_reads_as_cbor2_reads_it() -> None:
    items = [LinkItem(m, share, also) for m in MESSAGES for share in SHARES for also in ((), ("B", "C"))]
    for resent in (False, True):
        for n in (0, 1, 23, 24, 255, 256, len(items)):
            assert _same_as_cbor2(fwdb_body("A", "3.1", 2**40, items[:n], resent))


def test_a_frame_with_a_tag_anywhere_is_left_to_cbor2() -> None:
    bignum = Message("a/b", b"x", 1, False, EMPTY_PROPERTIES, None, "pub", 2**64, "A")  # tag 2
    body = fwdb_body("A", "3.1", 9, [LinkItem(MESSAGES[0]), LinkItem(bignum)])
    assert read_fwdb(body) is None
    assert unpack(wire.decode_frame_body(body)["m"][1])[0].msg_id == 2**64


def test_the_common_item_is_read_by_hand_and_the_others_by_cbor2() -> None:
    body = fwdb_body("A", "3.1", 9, [LinkItem(MESSAGES[0]), LinkItem(MESSAGES[0], SHARES[2]),
                                     LinkItem(MESSAGES[5], SHARES[1])])
    read = read_fwdb(body)
    assert read is not None
    plain, other_share, rare = read[3]
    # For plain subscribers only: the message alone, which the receiver takes as such.
    assert type(plain) is Message and unpack_read(plain)[1:] == (True, [], False, False, ())
    assert type(other_share) is tuple and unpack_read(other_share)[1:] == (True, [], True, True, ())
    assert type(rare) is list  # properties, an expiry, groups: cbor2's


def test_a_frame_from_older_writers_reads_the_same() -> None:
    # The envelope as a map through cbor2.dumps, as every earlier version wrote it.
    items = [LinkItem(m, share) for m in MESSAGES for share in SHARES]
    for resent in (False, True):
        fields: dict[str, object] = {"e": "3.1", "s": 5, "m": [i.fwdb_item() for i in items]}
        if resent:
            fields[RESENT] = True
        assert _same_as_cbor2(wire.encode_frame_body(FWDB, "A", fields))


@pytest.mark.parametrize("body", [
    b"", b"\xa6", b"\xff" * 40,
    wire.encode_frame_body("fwd", "A", {"e": "1", "s": 1, "m": []}),  # the older frame: cbor2's
    wire.encode_frame_body(FWDB, "A", {"s": 1, "e": "1", "m": []}),  # another key order: cbor2's
    wire.encode_frame_body(FWDB, "A", {"e": "1", "s": -1, "m": []}),
    wire.encode_frame_body(FWDB, "A", {"e": "1", "s": 1, "m": [], RESENT: False}),
    wire.encode_frame_body(FWDB, "A", {"e": "1", "s": 1, "m": []}) + b"\x00",  # trailing bytes
    cbor2.dumps({"v": wire.VERSION, "t": FWDB, "from": "A", "e": "1", "s": 1, "m": cbor2.CBORTag(99, [])}),
])
def test_what_is_not_a_frame_in_the_written_form_is_left_to_cbor2(body: bytes) -> None:
    assert read_fwdb(body) is None


def test_every_truncation_and_every_corrupted_byte_is_refused_or_read_as_cbor2_reads_it() -> None:
    small = [m for m in MESSAGES if len(m.payload) < 1000 and len(m.topic) < 100]
    body = fwdb_body("A", "3.1", 9, [LinkItem(m, share) for m in small for share in SHARES[:2]]
                     + [LinkItem(MESSAGES[5], SHARES[1], ("B",))], resent=True)
    for n in range(len(body)):
        assert read_fwdb(body[:n]) is None
    for i in range(0, len(body), 7):
        for value in (0x00, 0x17, 0x18, 0x1F, 0x3B, 0x5F, 0x7F, 0x9F, 0xBF, 0xC0, 0xF4, 0xF6, 0xF7, 0xFB, 0xFF):
            corrupted = body[:i] + bytes((value,)) + body[i + 1:]
            try:
                wire.decode_frame_body(corrupted)
            except wire.WireError:
                assert read_fwdb(corrupted) is None  # cbor2 refuses it: so does the hand reader
                continue
            if read_fwdb(corrupted) is not None:
                assert _same_as_cbor2(corrupted)


_text = st.text(max_size=30)
_values = st.one_of(st.none(), st.booleans(), st.integers(min_value=-2**64, max_value=2**64 - 1), _text,
                    st.binary(max_size=40), st.floats(allow_nan=False), st.lists(_text, max_size=3),
                    st.dictionaries(_text, st.integers(-2**64, 2**64 - 1), max_size=2))


@st.composite
def _wire_items(draw: st.DrawFn) -> list[object]:
    """A fwdb item as cbor2 writes one: mostly well-formed, any field possibly odd
    (never a tag: a frame with one is left to cbor2 whole)."""
    item: list[object] = [draw(_text), draw(st.binary(max_size=300)), draw(st.integers(0, 2)), draw(st.booleans()),
                          None, draw(st.none() | _text), draw(st.integers(0, 2**64 - 1)), draw(st.none() | _text),
                          None, None, draw(st.integers(0, 7)), None]
    for i in draw(st.lists(st.integers(0, 11), max_size=3)):
        item[i] = draw(_values)
    if draw(st.integers(0, 9)) == 0:
        item = item[:draw(st.integers(0, 13))] if draw(st.booleans()) else item + [None]
    return item


@settings(max_examples=max(1, int(300 * SCALE)), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(items=st.lists(_wire_items(), max_size=8), seq=st.integers(0, 2**64 - 1), resent=st.booleans(),
       sender=_text, epoch=_text)
def test_frames_cbor2_writes_read_as_cbor2_reads_them(items: list[object], seq: int, resent: bool, sender: str,
                                                      epoch: str) -> None:
    fields: dict[str, object] = {"e": epoch, "s": seq, "m": items}
    if resent:
        fields[RESENT] = True
    assert _same_as_cbor2(wire.encode_frame_body(FWDB, sender, fields))


@settings(max_examples=max(1, int(300 * SCALE)), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=200), cut=st.integers(0, 400))
def test_arbitrary_bytes_never_raise(data: bytes, cut: int) -> None:
    body = fwdb_body("A", "1", 1, [LinkItem(MESSAGES[0]), LinkItem(MESSAGES[2])])
    for candidate in (data, body[:cut] + data, body[:1] + data):
        if read_fwdb(candidate) is not None:
            assert _same_as_cbor2(candidate)
