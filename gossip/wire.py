"""The gossip wire format: one versioned CBOR envelope, compound UDP packets.

A UDP packet is ``{"v": 1, "t": "compound", "from": <node id>, "m": [msg, ...]}``
where each ``msg`` is a CBOR array whose first item names its type, e.g.
``["ping", seq, target]``: arrays are about half the size of maps and twice as fast
to decode, which is what lets one core simulate a thousand nodes.  Packets are
assembled from pre-encoded parts, so a broadcast is CBOR-encoded once however often
it is retransmitted, and the packet size is known exactly before sending.

Message layouts (after the type)::

    ping      seq, target id
    ack       seq
    nack      seq
    ping_req  seq, target id, target host, target port, want nack
    alive     node, incarnation, host, port, origin ts (µs), hops
    suspect   node, incarnation, accuser, origin ts (µs), hops
    dead      node, incarnation, declared by (== node: left), origin ts (µs), hops
    user      kind, key, origin, origin ts (µs), origin seq, payload, hops
TCP (push-pull) frames are one envelope behind a 4-byte big-endian length.

``gossip.messages`` turns the arrays into typed records and back; this module only
frames and checks envelopes.
"""

from __future__ import annotations

import struct
from typing import Any, Mapping

import cbor2

VERSION = 1
MAX_FRAME = 8 * 1024 * 1024

# message types
PING = "ping"
ACK = "ack"
NACK = "nack"
PING_REQ = "ping_req"
ALIVE = "alive"
SUSPECT = "suspect"
DEAD = "dead"
USER = "user"
PUSH_PULL = "push_pull"
COMPOUND = "compound"


# A decoded CBOR map from the network: ``t`` and ``from`` are checked strings, the
# other values are whatever the peer sent (their readers check them).
Envelope = dict[str, Any]


class WireError(Exception):
    """A packet or frame we must drop (counted by the caller, never fatal);
    ``reason`` is the short label it is counted under."""

    def __init__(self, message: str, *, reason: str = "malformed") -> None:
        super().__init__(message)
        self.reason = reason


class MalformedPacket(WireError):
    pass


class UnsupportedVersion(WireError):
    def __init__(self, message: str) -> None:
        super().__init__(message, reason="bad_version")


def encode_part(msg: list[object]) -> bytes:
    return cbor2.dumps(msg)


def array_header(n: int) -> bytes:
    if n < 24:
        return bytes((0x80 + n,))
    if n < 256:
        return bytes((0x98, n))
    return b"\x99" + struct.pack(">H", n)


class PacketEncoder:
    """Builds compound packets for one sender from pre-encoded parts."""

    # array header of up to 65535 parts is at most 3 bytes
    HEADER_SLACK = 3

    def __init__(self, sender: str) -> None:
        self.prefix = (
            b"\xa4"
            + cbor2.dumps("v") + cbor2.dumps(VERSION)
            + cbor2.dumps("t") + cbor2.dumps(COMPOUND)
            + cbor2.dumps("from") + cbor2.dumps(sender)
            + cbor2.dumps("m")
        )
        self.overhead = len(self.prefix) + self.HEADER_SLACK

    def packet(self, parts: list[bytes]) -> bytes:
        return self.prefix + array_header(len(parts)) + b"".join(parts)


def decode_packet(data: bytes) -> tuple[str, list[list[object]]]:
    """Return (sender, messages) or raise WireError."""
    env = _decode_envelope(data)
    if env["t"] != COMPOUND:
        raise MalformedPacket(f"UDP envelope of type {env['t']!r}", reason="not_compound")
    parts = env.get("m")
    if not isinstance(parts, list):
        raise MalformedPacket("compound without message list", reason="no_messages")
    for part in parts:
        if not isinstance(part, list) or not part or not isinstance(part[0], str):
            raise MalformedPacket("compound part is not a typed array", reason="untyped_message")
    return env["from"], parts


def _decode_envelope(data: bytes) -> Envelope:
    try:
        env = cbor2.loads(data)
    except Exception as exc:  # cbor2 raises several types on hostile input
        raise MalformedPacket(f"not CBOR: {exc}", reason="not_cbor") from None
    if not isinstance(env, dict):
        raise MalformedPacket("envelope is not a map", reason="bad_envelope")
    if env.get("v") != VERSION:
        raise UnsupportedVersion(f"version {env.get('v')!r}")
    if not isinstance(env.get("t"), str) or not isinstance(env.get("from"), str):
        raise MalformedPacket("envelope lacks t or from", reason="bad_envelope")
    return env


def encode_frame_body(msg_type: str, sender: str, fields: Mapping[str, object]) -> bytes:
    env: dict[str, object] = {"v": VERSION, "t": msg_type, "from": sender}
    env.update(fields)
    return cbor2.dumps(env)


def decode_frame_body(data: bytes) -> Envelope:
    """The envelope of a stream frame: a map whose ``t`` and ``from`` are strings
    (the rest is the caller's to check)."""
    return _decode_envelope(data)


def frame(body: bytes) -> bytes:
    """Length-prefix one (possibly encrypted) frame body for a TCP stream."""
    if len(body) > MAX_FRAME:
        raise WireError(f"frame of {len(body)} bytes exceeds {MAX_FRAME}")
    return struct.pack(">I", len(body)) + body


def frame_length(header: bytes) -> int:
    n = int.from_bytes(header, "big")
    if len(header) != 4:
        raise MalformedPacket(f"frame header of {len(header)} bytes", reason="bad_frame")
    if n > MAX_FRAME:
        raise MalformedPacket(f"frame of {n} bytes exceeds {MAX_FRAME}", reason="frame_too_large")
    return n
