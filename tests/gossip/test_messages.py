"""Typed SWIM records at the codec edge: the bytes on the wire are those of the
previous version (literal bytes captured from it), every field is checked on the
way in, and malformed input is counted by reason."""

from __future__ import annotations

import random

import cbor2
import pytest

from gossip import wire
from gossip.config import LAN
from gossip.events import MemberState
from gossip.messages import (
    Ack,
    Alive,
    Dead,
    MalformedMessage,
    MemberEntry,
    Message,
    Nack,
    Ping,
    PingReq,
    PushPull,
    StreamAck,
    StreamPing,
    Suspect,
    User,
    decode_message,
    decode_stream,
    encode,
)
from gossip.swim import _TIMER_HANDLERS, Swim, Timer

from .helpers import addr_of, packet

TS = 1700000000123456

# Encoded by the version before the typed records (positional lists), byte for byte.
PREVIOUS: list[tuple[Message, str]] = [
    (Ping(7, "b"), "836470696e67076162"),
    (Ack(7), "826361636b07"),
    (Nack(7), "82646e61636b07"),
    (PingReq(8, "c", "10.0.0.3", 7946, True), "866870696e675f7265710861636831302e302e302e33191f0af5"),
    (Alive("b", 3, "10.0.0.2", 7946, TS, 0), "8765616c6976656162036831302e302e302e32191f0a1b00060a241820224000"),
    (Suspect("b", 3, "a", TS, 1), "86677375737065637461620361611b00060a241820224001"),
    (Dead("b", 3, "a", TS, 2), "86646465616461620361611b00060a241820224002"),
    (User("cfg", "k1", "a", TS, 4, {"n": 1}, 0), "88647573657263636667626b3161611b00060a241820224004a1616e0100"),
]

PREVIOUS_PUSH_PULL = bytes.fromhex(
    "a9617601617469707573685f70756c6c6466726f6d616167636c7573746572656d65736864646a6f696ef5657265706c79f4676d656d"
    "62657273828661616831302e302e302e31191f0a65616c697665001b00060a24181e40008661626831302e302e302e32191f0a64646561"
    "64021b00060a241825e1206475736572a166726f757465738201026a62726f61646361737473818763636667626b3161611b00060a2418"
    "20224004a1616e0100"
)


@pytest.mark.parametrize("msg, hex_bytes", PREVIOUS, ids=[type(m).__name__ for m, _ in PREVIOUS])
def test_messages_encode_to_the_previous_versions_bytes_and_back(msg: Message, hex_bytes: str) -> None:
    old = bytes.fromhex(hex_bytes)
    assert encode(msg) == old
    raw = cbor2.loads(old)
    assert decode_message(raw) == msg and type(decode_message(raw)) is type(msg)


def test_a_packet_of_the_previous_version_decodes_to_records() -> None:
    data = bytes.fromhex("a4617601617468636f6d706f756e646466726f6d6161616d82836470696e67076162826361636b07")
    assert wire.PacketEncoder("a").packet([encode(Ping(7, "b")), encode(Ack(7))]) == data
    sender, raws = wire.decode_packet(data)
    assert sender == "a" and [decode_message(r) for r in raws] == [Ping(7, "b"), Ack(7)]


def test_push_pull_frame_is_the_previous_versions() -> None:
    members = [
        MemberEntry("a", "10.0.0.1", 7946, MemberState.ALIVE, 0, 1700000000000000),
        MemberEntry("b", "10.0.0.2", 7946, MemberState.DEAD, 2, 1700000000500000),
    ]
    pp = PushPull(
        "a", "meshd", True, False, [m.to_wire() for m in members], {"routes": [1, 2]},
        [User("cfg", "k1", "a", TS, 4, {"n": 1}, 0).retained()],
    )
    assert pp.to_wire() == PREVIOUS_PUSH_PULL
    got = decode_stream(PREVIOUS_PUSH_PULL)
    assert got == pp
    assert isinstance(got, PushPull) and [MemberEntry.from_wire(m) for m in got.members] == members
    assert type(MemberEntry.from_wire(got.members[1]).state) is MemberState


def test_stream_ping_and_ack_round_trip() -> None:
    ping = StreamPing("a", 9, "b")
    assert decode_stream(ping.to_wire()) == ping
    assert cbor2.loads(StreamAck("b", 9).to_wire()) == {"v": 1, "t": "ack", "from": "b", "seq": 9}


@pytest.mark.parametrize(
    "raw, reason",
    [
        (["ping"], "bad_ping"),
        (["ping", "7", "b"], "bad_ping"),
        (["ack", 1.5], "bad_ack"),
        (["ping_req", 1, "c", "h", 7946, 1], "bad_ping_req"),  # want_nack must be a bool
        (["alive", "q", "z", "q", 1, 1, 0], "bad_alive"),
        (["suspect", "b", 1, None, 1, 0], "bad_suspect"),
        (["dead", "b", 1, "a", 1], "bad_dead"),
        (["user", "k", ["unhashable"], "o", 1, 1, None, 0], "bad_user"),
    ],
)
def test_wrong_shapes_are_refused_with_a_reason(raw: list[object], reason: str) -> None:
    with pytest.raises(MalformedMessage) as info:
        decode_message(raw)
    assert info.value.reason == reason


def test_malformed_input_is_counted_by_reason() -> None:
    sw = Swim("a", addr_of("a"), now=0.0, rng=random.Random(1), config=LAN)
    sw.receive(b"\xff\xff", addr_of("x"), 1.0)
    sw.receive(packet("x", ["alive", "q", "z", "q", 1, 1, 0], ["ping", 1, "a"]), addr_of("x"), 1.0)
    sw.receive(packet("x", ["warp", 1]), addr_of("x"), 1.0)
    assert sw.stats.malformed == 2 and sw.stats.unknown_type == 1
    assert sw.stats.malformed_by_reason == {"not_cbor": 1, "bad_alive": 1}
    # the well-formed ping beside the bad alive was still answered
    assert [cbor2.loads(d)["m"][0] for _, d in sw.datagrams_to_send(1.0)] == [["ack", 1]]


def test_a_bug_in_a_handler_is_not_counted_as_malformed(monkeypatch: pytest.MonkeyPatch) -> None:
    sw = Swim("a", addr_of("a"), now=0.0, rng=random.Random(1), config=LAN)

    def broken(self: Swim, *args: object) -> None:
        raise KeyError("a bug")

    monkeypatch.setattr(Swim, "_on_ping", broken)
    from gossip import swim as swim_module

    monkeypatch.setitem(swim_module._RECEIVERS, wire.PING, swim_module._route(Ping.from_wire, Swim._on_ping))
    with pytest.raises(KeyError):
        sw.receive(packet("x", ["ping", 1, "a"]), addr_of("x"), 1.0)


def test_every_timer_kind_has_a_handler() -> None:
    assert set(_TIMER_HANDLERS) == set(Timer)
