"""SWIM messages as typed records, converted to and from the wire's CBOR arrays here
and only here.

On the wire every message is an array whose first item names its type, then the
fields in the order below (``gossip.wire`` documents the layouts): records
``to_wire()`` into exactly those arrays, so the bytes are those of every earlier
version.  ``decode_message`` checks the shape and the type of every field and
raises ``MalformedMessage`` (with a short ``reason`` for the counters) on anything
else, so the state machine only ever sees well-formed records.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Union

from . import wire
from .events import MemberState


class MalformedMessage(wire.MalformedPacket):
    """A message inside a well-formed packet or frame that we must drop."""


def _bad(kind: str, raw: list[object]) -> MalformedMessage:
    return MalformedMessage(f"{kind}: bad fields {raw!r:.120}", reason=f"bad_{kind}")


class Ping(NamedTuple):
    seq: int
    target: str  # the member we mean (another may have taken its address)

    def to_wire(self) -> list[object]:
        return [wire.PING, self.seq, self.target]

    @classmethod
    def from_wire(cls, raw: list[object]) -> Ping:
        if len(raw) == 3:
            _, seq, target = raw
            if type(seq) is int and type(target) is str:
                return cls(seq, target)
        raise _bad(wire.PING, raw)


class Ack(NamedTuple):
    seq: int

    def to_wire(self) -> list[object]:
        return [wire.ACK, self.seq]

    @classmethod
    def from_wire(cls, raw: list[object]) -> Ack:
        if len(raw) == 2 and type(raw[1]) is int:
            return cls(raw[1])
        raise _bad(wire.ACK, raw)


class Nack(NamedTuple):
    seq: int

    def to_wire(self) -> list[object]:
        return [wire.NACK, self.seq]

    @classmethod
    def from_wire(cls, raw: list[object]) -> Nack:
        if len(raw) == 2 and type(raw[1]) is int:
            return cls(raw[1])
        raise _bad(wire.NACK, raw)


class PingReq(NamedTuple):
    seq: int
    target: str
    host: str
    port: int
    want_nack: bool

    def to_wire(self) -> list[object]:
        return [wire.PING_REQ, self.seq, self.target, self.host, self.port, self.want_nack]

    @classmethod
    def from_wire(cls, raw: list[object]) -> PingReq:
        if len(raw) == 6:
            _, seq, target, host, port, want_nack = raw
            if type(seq) is int and type(target) is str and type(host) is str and type(port) is int and type(want_nack) is bool:
                return cls(seq, target, host, port, want_nack)
        raise _bad(wire.PING_REQ, raw)


class Alive(NamedTuple):
    node: str
    incarnation: int
    host: str
    port: int
    origin_ts_us: int
    hops: int

    def to_wire(self) -> list[object]:
        return [wire.ALIVE, self.node, self.incarnation, self.host, self.port, self.origin_ts_us, self.hops]

    @classmethod
    def from_wire(cls, raw: list[object]) -> Alive:
        if len(raw) == 7:
            _, node, inc, host, port, ots, hops = raw
            if (type(node) is str and type(inc) is int and type(host) is str and type(port) is int
                    and type(ots) is int and type(hops) is int):
                return cls(node, inc, host, port, ots, hops)
        raise _bad(wire.ALIVE, raw)


class Suspect(NamedTuple):
    node: str
    incarnation: int
    accuser: str
    origin_ts_us: int
    hops: int

    def to_wire(self) -> list[object]:
        return [wire.SUSPECT, self.node, self.incarnation, self.accuser, self.origin_ts_us, self.hops]

    @classmethod
    def from_wire(cls, raw: list[object]) -> Suspect:
        if len(raw) == 6:
            _, node, inc, by, ots, hops = raw
            if type(node) is str and type(inc) is int and type(by) is str and type(ots) is int and type(hops) is int:
                return cls(node, inc, by, ots, hops)
        raise _bad(wire.SUSPECT, raw)


class Dead(NamedTuple):
    node: str
    incarnation: int
    declared_by: str  # == node: the member left
    origin_ts_us: int
    hops: int

    def to_wire(self) -> list[object]:
        return [wire.DEAD, self.node, self.incarnation, self.declared_by, self.origin_ts_us, self.hops]

    @classmethod
    def from_wire(cls, raw: list[object]) -> Dead:
        if len(raw) == 6:
            _, node, inc, by, ots, hops = raw
            if type(node) is str and type(inc) is int and type(by) is str and type(ots) is int and type(hops) is int:
                return cls(node, inc, by, ots, hops)
        raise _bad(wire.DEAD, raw)


class User(NamedTuple):
    """A user broadcast; (kind, key) names what it replaces, (origin ts, origin seq,
    origin) orders versions."""

    kind: str
    key: str
    origin: str
    origin_ts_us: int
    origin_seq: int
    payload: object  # CBOR-encodable, the subscriber's business
    hops: int

    def to_wire(self) -> list[object]:
        return [wire.USER, *self]

    def retained(self) -> list[object]:
        """The push-pull form: the same array without its type tag."""
        return list(self)

    @classmethod
    def from_retained(cls, raw: object) -> User:
        if isinstance(raw, list):
            return cls.from_wire([wire.USER, *raw])
        raise _bad(wire.USER, [raw])

    @classmethod
    def from_wire(cls, raw: list[object]) -> User:
        if len(raw) == 8:
            _, kind, key, origin, ots, seq, payload, hops = raw
            if (type(kind) is str and type(key) is str and type(origin) is str and type(ots) is int
                    and type(seq) is int and type(hops) is int):
                return cls(kind, key, origin, ots, seq, payload, hops)
        raise _bad(wire.USER, raw)


Message = Union[Ping, Ack, Nack, PingReq, Alive, Suspect, Dead, User]

DECODERS: dict[object, Callable[[list[object]], Message]] = {
    wire.PING: Ping.from_wire,
    wire.ACK: Ack.from_wire,
    wire.NACK: Nack.from_wire,
    wire.PING_REQ: PingReq.from_wire,
    wire.ALIVE: Alive.from_wire,
    wire.SUSPECT: Suspect.from_wire,
    wire.DEAD: Dead.from_wire,
    wire.USER: User.from_wire,
}


def decode_message(raw: list[object]) -> Message:
    """A compound part (an array whose first item is a str) as its record."""
    decode = DECODERS.get(raw[0])
    if decode is None:
        raise MalformedMessage(f"unknown message type {raw[0]!r:.40}", reason="unknown_type")
    return decode(raw)


def encode(msg: Message) -> bytes:
    """One pre-encoded compound part."""
    return wire.encode_part(msg.to_wire())


# ---------------------------------------------------------------------- push-pull


class MemberEntry(NamedTuple):
    """One member of a push-pull state exchange."""

    node: str
    host: str
    port: int
    state: MemberState
    incarnation: int
    changed_us: int  # the sender's trace clock, when it last saw the state change

    def to_wire(self) -> list[object]:
        return member_entry_wire(*self)

    @classmethod
    def from_wire(cls, raw: object) -> MemberEntry:
        # a push-pull carries one entry per member (a thousand, in a large cluster):
        # the state goes through a dict, not the (slower) enum constructor
        if type(raw) is list and len(raw) == 6:
            node, host, port, state, inc, changed_us = raw
            if (type(node) is str and type(host) is str and type(port) is int and type(state) is str
                    and type(inc) is int and type(changed_us) is int):
                member_state = _STATE_OF.get(state)
                if member_state is not None:
                    return tuple.__new__(cls, (node, host, port, member_state, inc, changed_us))
        raise MalformedMessage(f"push-pull member entry {raw!r:.120}", reason="bad_member_entry")


def member_entry_wire(node: str, host: str, port: int, state: MemberState, incarnation: int, changed_us: int) -> list[object]:
    """``MemberEntry(...).to_wire()`` without building the record first: a push-pull
    frame holds one entry per member."""
    return [node, host, port, _WIRE_STATE[state], incarnation, changed_us]


_WIRE_STATE: dict[MemberState, str] = {s: s.value for s in MemberState}
_STATE_OF: dict[str, MemberState] = {s.value: s for s in MemberState}


class PushPull(NamedTuple):
    """A full state exchange over a stream (a join, a periodic exchange, or the answer)."""

    sender: str
    cluster: str
    join: bool
    reply: bool
    members: list[list[object]]  # MemberEntry arrays, decoded one by one (a bad one is skipped)
    user: dict[str, object]  # push-pull providers' states by name
    broadcasts: list[list[object]]  # retained User arrays, decoded one by one

    def to_wire(self) -> bytes:
        return wire.encode_frame_body(
            wire.PUSH_PULL,
            self.sender,
            {
                "cluster": self.cluster, "join": self.join, "reply": self.reply, "members": self.members,
                "user": self.user, "broadcasts": self.broadcasts,
            },
        )

    @classmethod
    def from_envelope(cls, env: dict[str, object]) -> PushPull:
        sender, cluster, members = env["from"], env.get("cluster"), env.get("members")
        if not isinstance(sender, str) or not isinstance(cluster, str) or not isinstance(members, list):
            raise MalformedMessage("push-pull without cluster or members", reason="bad_push_pull")
        user, broadcasts = env.get("user"), env.get("broadcasts")
        return cls(
            sender, cluster, bool(env.get("join")), bool(env.get("reply")), members,
            user if isinstance(user, dict) else {}, broadcasts if isinstance(broadcasts, list) else [],
        )


class StreamPing(NamedTuple):
    """memberlist's TCP fallback ping."""

    sender: str
    seq: int
    target: str

    def to_wire(self) -> bytes:
        return wire.encode_frame_body(wire.PING, self.sender, {"seq": self.seq, "target": self.target})


class StreamAck(NamedTuple):
    sender: str
    seq: int

    def to_wire(self) -> bytes:
        return wire.encode_frame_body(wire.ACK, self.sender, {"seq": self.seq})


StreamRequest = Union[PushPull, StreamPing, StreamAck]


def decode_stream(body: bytes) -> StreamRequest:
    """A stream frame body as a record; raises ``WireError`` (``UnsupportedVersion``,
    ``MalformedPacket``) for what must be dropped."""
    env = wire.decode_frame_body(body)
    t, sender = env["t"], env["from"]
    if t == wire.PING:
        seq, target = env.get("seq"), env.get("target")
        if type(seq) is int and type(target) is str:
            return StreamPing(sender, seq, target)
        raise MalformedMessage("stream ping without seq or target", reason="bad_stream_ping")
    if t == wire.ACK:
        seq = env.get("seq")
        if type(seq) is int:
            return StreamAck(sender, seq)
        raise MalformedMessage("stream ack without seq", reason="bad_stream_ack")
    if t == wire.PUSH_PULL:
        return PushPull.from_envelope(env)
    raise MalformedMessage(f"stream frame of type {t!r}", reason="unknown_stream_type")
