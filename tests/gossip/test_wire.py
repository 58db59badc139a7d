"""CBOR envelope, compound packets, frames, the broadcast queue and the keyring."""

from __future__ import annotations

import base64

import cbor2
import pytest

from gossip import wire
from gossip.broadcasts import TransmitLimitedQueue
from gossip.keyring import OVERHEAD, DecryptError, Keyring, parse_key


def test_compound_packet_is_one_versioned_envelope() -> None:
    enc = wire.PacketEncoder("n1")
    parts = [wire.encode_part(["ping", 1, "n2"]), wire.encode_part(["ack", 9])]
    data = enc.packet(parts)
    env = cbor2.loads(data)
    assert env == {"v": 1, "t": "compound", "from": "n1", "m": [["ping", 1, "n2"], ["ack", 9]]}
    assert wire.decode_packet(data) == ("n1", env["m"])
    assert len(data) <= enc.overhead + sum(len(p) for p in parts)


@pytest.mark.parametrize("n", [0, 1, 23, 24, 255, 256, 300])
def test_array_header_sizes(n: int) -> None:
    enc = wire.PacketEncoder("x")
    parts = [wire.encode_part(["ack", i]) for i in range(n)]
    sender, msgs = wire.decode_packet(enc.packet(parts))
    assert sender == "x" and [m[1] for m in msgs] == list(range(n))


def test_udp_envelope_must_be_compound() -> None:
    with pytest.raises(wire.MalformedPacket):
        wire.decode_packet(cbor2.dumps({"v": 1, "t": "ping", "from": "a", "m": [["ping", 1, "a"]]}))


def test_unknown_version_is_its_own_error() -> None:
    with pytest.raises(wire.UnsupportedVersion):
        wire.decode_packet(cbor2.dumps({"v": 7, "t": "ping", "from": "a"}))
    with pytest.raises(wire.MalformedPacket):
        wire.decode_packet(b"\x00garbage")


def test_frames_round_trip_and_are_bounded() -> None:
    body = wire.encode_frame_body("push_pull", "a", {"members": []})
    framed = wire.frame(body)
    assert wire.frame_length(framed[:4]) == len(body)
    assert wire.decode_frame_body(framed[4:])["from"] == "a"
    with pytest.raises(wire.MalformedPacket):
        wire.frame_length((wire.MAX_FRAME + 1).to_bytes(4, "big"))


def test_queue_fewest_transmits_first_newest_first() -> None:
    q = TransmitLimitedQueue()
    q.queue("a", b"A" * 10)
    q.queue("b", b"B" * 10)
    assert q.get(0, 10, 5) == [b"B" * 10]  # newest first among equals, only one fits
    assert q.get(0, 10, 5) == [b"A" * 10]  # now a has fewer transmits
    assert q.get(0, 100, 2) == [b"B" * 10, b"A" * 10]
    assert len(q) == 0  # both hit the limit of 2


def test_queue_invalidates_by_key() -> None:
    q = TransmitLimitedQueue()
    q.queue(("u", "cfg", "k"), b"old")
    q.queue(("u", "cfg", "k"), b"new")
    assert len(q) == 1 and q.get(0, 100, 3) == [b"new"]


def test_queue_respects_overhead() -> None:
    q = TransmitLimitedQueue()
    q.queue("a", b"x" * 50)
    assert q.get(60, 100, 3) == []
    assert q.get(50, 100, 3) == [b"x" * 50]


def test_keyring_seal_open_and_rotation() -> None:
    k1, k2 = b"1" * 32, b"2" * 16
    ring = Keyring([k1])
    sealed = ring.seal(b"hello", b"udp")
    assert len(sealed) == 5 + OVERHEAD and b"hello" not in sealed
    assert ring.open(sealed, b"udp") == b"hello"
    with pytest.raises(DecryptError):
        ring.open(sealed, b"tcp")  # bound to its channel
    # rotation: install k2 everywhere, switch, old packets still open, then drop k1
    other = Keyring([k1])
    other.add(k2)
    other.use(k2)
    new_sealed = other.seal(b"rotated")
    with pytest.raises(DecryptError):
        ring.open(new_sealed)
    ring.add(k2)
    assert ring.open(new_sealed) == b"rotated"
    other.remove(k1)
    with pytest.raises(DecryptError):
        other.open(sealed, b"udp")
    with pytest.raises(ValueError):
        other.remove(k2)


def test_keyring_refuses_plaintext_and_tampering() -> None:
    ring = Keyring([b"k" * 16])
    plain = wire.PacketEncoder("a").packet([wire.encode_part(["ack", 1])])
    with pytest.raises(DecryptError):
        ring.open(plain)
    sealed = bytearray(ring.seal(b"data"))
    sealed[-1] ^= 1
    with pytest.raises(DecryptError):
        ring.open(bytes(sealed))


def test_parse_key_base64_or_passphrase() -> None:
    raw = bytes(range(32))
    assert parse_key(base64.b64encode(raw).decode()) == raw
    derived = parse_key("correct horse battery staple")
    assert len(derived) == 32 and derived == parse_key("correct horse battery staple")
    assert derived != parse_key("another passphrase")
