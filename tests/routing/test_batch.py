"""The batched forward frame (`fwdb`): what a sender encodes is what a receiver reads,
in one decode of the whole frame."""

from __future__ import annotations

import cbor2
import pytest

from gossip import wire
from mqtt import EMPTY_PROPERTIES, Properties
from routing.batch import (FWDB, RESENT, LinkItem, Queued, fwdb_body, held_seqs, link_item, open_gates, sent_before,
                           unpack, unpack_fwd)
from routing.forward import ForwardTarget
from routing.wire import ForwardedItem
from session_store import records
from session_store.model import Message

MSG = Message("s/1", b"hi", 1, False, EMPTY_PROPERTIES, None, "pub", 42, "A")
PROPS = Properties(content_type="text/plain", user_properties=(("k", "v"),), message_expiry_interval=30)
RICH = Message("s/2", b"\x00" * 300, 2, True, PROPS, 1_700_000_000.5, None, 7, None)


def test_a_frame_of_items_reads_back_as_the_messages_and_their_targets() -> None:
    items = [
        LinkItem(MSG),
        LinkItem(RICH, ForwardTarget(False, (("g", "s/#"), ("h", "+/2")), True, True), ("B", "C")),
    ]
    frame = wire.decode_frame_body(fwdb_body("A", "3.1", 9, items))
    assert (frame["t"], frame["from"], frame["e"], frame["s"]) == (FWDB, "A", "3.1", 9)
    first, second = (unpack(i) for i in frame["m"])
    assert records.message_map(first[0]) == records.message_map(MSG)
    assert first[1:] == (True, [], False, False, ())
    assert records.message_map(second[0]) == records.message_map(RICH)
    assert second[1:] == (False, [("g", "s/#"), ("h", "+/2")], True, True, ("B", "C"))


def test_a_batch_sent_again_carries_the_resend_mark_and_a_first_send_none() -> None:
    # Optional: a receiver that restarted takes a resent batch as new, and must know
    # its messages may have reached their subscribers already.
    items = [LinkItem(MSG)]
    assert RESENT not in wire.decode_frame_body(fwdb_body("A", "3.1", 9, items))
    assert wire.decode_frame_body(fwdb_body("A", "3.1", 9, items, resent=True))[RESENT] is True


@pytest.mark.parametrize("n", [0, 1, 23, 24, 255, 256])
def test_frames_of_every_size_decode(n: int) -> None:
    items = [LinkItem(Message("t", str(i).encode(), 0, False, EMPTY_PROPERTIES)) for i in range(n)]
    frame = wire.decode_frame_body(fwdb_body("A", "1.1", 1, items))
    assert [int(unpack(i)[0].payload) for i in frame["m"]] == list(range(n))


def test_the_same_item_in_the_older_frame_is_what_earlier_versions_read() -> None:
    data = cbor2.loads(cbor2.dumps(LinkItem(MSG, also=("B", "C")).fwd_item()))
    item = ForwardedItem.from_wire(data)
    assert records.message_map(item.message) == records.message_map(MSG) and item.also == ("B", "C")
    assert unpack_fwd(data)[1:] == (True, [], False, False, ("B", "C"))


def test_each_share_of_a_message_reads_back_in_the_older_frame() -> None:
    a, b = LinkItem(MSG), LinkItem(MSG, ForwardTarget(False, (("g", "s/#"),), False))
    assert unpack_fwd(cbor2.loads(cbor2.dumps(a.fwd_item())))[1:] == (True, [], False, False, ())
    assert unpack_fwd(cbor2.loads(cbor2.dumps(b.fwd_item())))[1:] == (False, [("g", "s/#")], False, False, ())


@pytest.mark.parametrize("bad", [
    [], "x", ["s/1", b"hi", 1, False, None, None, 42, None, None, None, 1],  # 11 elements
    ["s/1", "not bytes", 1, False, None, None, 42, None, None, None, 1, None],
    ["s/1", b"hi", 3, False, None, None, 42, None, None, None, 1, None],
    ["s/1", b"hi", 1, False, "soon", None, 42, None, None, None, 1, None],
    ["s/1", b"hi", 1, False, None, None, 42, None, {"nonsense": 1}, None, 1, None],
    ["s/1", b"hi", 1, False, None, None, 42, None, None, None, 1, [["g"]]],
])
def test_malformed_items_raise_value_errors(bad: object) -> None:
    with pytest.raises(ValueError):
        unpack(bad)


def test_an_acknowledged_batch_opens_each_gate_once_and_names_its_held_messages() -> None:
    from routing.batch import AckGate
    from routing.forward import PLAIN_REPLAY

    gate = AckGate()
    gate.waiting = 3
    items = [LinkItem(MSG, gate=gate), LinkItem(MSG, gate=gate), LinkItem(RICH, PLAIN_REPLAY, held_seq=17), LinkItem(MSG)]
    assert open_gates(items) and gate.waiting == 1
    assert held_seqs(items) == [17]
    assert not open_gates([LinkItem(MSG)])  # QoS 0 forwards: no gate, nothing to release


def _cbor2_frame(items: list[LinkItem], resent: bool) -> bytes:
    """What the frame was before `fwdb_body` wrote it by hand: the envelope with each
    item as `fwdb_item`, in one `cbor2.dumps`."""
    fields: dict[str, object] = {"e": "3.1", "s": 300, "m": [i.fwdb_item() for i in items]}
    if resent:
        fields[RESENT] = True
    return wire.encode_frame_body(FWDB, "A", fields)


@pytest.mark.parametrize("resent", [False, True])
def test_the_hand_written_frame_is_byte_for_byte_what_cbor2_writes(resent: bool) -> None:
    odd = [
        Message("", b"", 0, False, EMPTY_PROPERTIES, None, None, 0, None),
        Message("é/ü/名前", b"\xff" * 23, 1, True, EMPTY_PROPERTIES, 12.0, "p" * 23, 23, "n" * 24),
        Message("t" * 255, b"x" * 24, 2, False, PROPS, None, "q" * 256, 255, "B"),
        # (A float, as declared: compiled code reads an int there as a float.)
        Message("t" * 256, b"x" * 255, 0, False, EMPTY_PROPERTIES, 1_700_000_000.0, "pub", 256, "A"),
        Message("t" * 65536, b"x" * 65536, 1, False, EMPTY_PROPERTIES, None, "pub", 65535, "A"),
        Message("a/b", b"x" * 256, 1, False, EMPTY_PROPERTIES, None, "pub", 65536, "A"),
        Message("a/b", b"x", 1, False, EMPTY_PROPERTIES, None, "pub", 2**32 - 1, "A"),
        Message("a/b", b"x", 1, False, EMPTY_PROPERTIES, None, "pub", 2**32, "A"),
        Message("a/b", b"x", 1, False, EMPTY_PROPERTIES, None, "pub", 1_790_000_000_000_000, "A"),  # a node's ids
        Message("a/b", b"x", 1, False, EMPTY_PROPERTIES, None, "pub", 2**64 - 1, "A"),
        Message("a/b", b"x", 1, False, EMPTY_PROPERTIES, None, "pub", 2**64, "A"),
    ]
    items = [LinkItem(MSG), LinkItem(RICH, ForwardTarget(False, (("g", "s/#"), ("h", "+/2")), True, True), ("B", "C"))]
    items += [LinkItem(m, share) for m in odd
              for share in (ForwardTarget(True, (), False), ForwardTarget(True, (("g", "a/+"),), True, False))]
    for n in (0, 1, 23, 24, len(items)):
        assert fwdb_body("A", "3.1", 300, items[:n], resent) == _cbor2_frame(items[:n], resent)
    many = [LinkItem(Message("t", str(i).encode(), 0, False, EMPTY_PROPERTIES, msg_id=i)) for i in range(300)]
    assert fwdb_body("A", "3.1", 300, many, resent) == _cbor2_frame(many, resent)


def test_a_message_queued_as_itself_is_written_as_its_plain_item() -> None:
    # A QoS 0 forward to plain subscribers only is queued without a LinkItem
    # (`routing.batch.Queued`): the same bytes as `LinkItem(msg)` with the plain share.
    plain = [Message("s/1", b"hi", 0, False, EMPTY_PROPERTIES, None, "pub", 1_790_000_000_000_000 + i, "A")
             for i in range(3)]
    mixed: list[Queued] = [plain[0], LinkItem(MSG), plain[1], LinkItem(RICH, ForwardTarget(False, (("g", "s/#"),), True)),
                           plain[2]]
    as_items = [link_item(i) for i in mixed]
    assert [type(i) for i in as_items] == [LinkItem] * 5 and as_items[1] is mixed[1]
    for resent in (False, True):
        assert fwdb_body("A", "3.1", 7, mixed, resent) == fwdb_body("A", "3.1", 7, as_items, resent)
    assert [records.message_map(unpack(i)[0]) for i in wire.decode_frame_body(fwdb_body("A", "3.1", 7, mixed))["m"]] \
        == [records.message_map(i.message) for i in as_items]
    # Never gated, held or sent before.
    assert not open_gates(plain) and held_seqs(plain) == [] and sent_before(mixed) == 0
