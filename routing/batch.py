"""Forwarded messages on a mesh link: the item a link queues, and its two encodings.

A link sends a run of queued items as one frame, in one of two formats:

- `fwd` (every version): `{"e", "s", "m": [[message map, plain, groups, keep
  retained(, replay)], ...]}`, each item as `routing.wire.ForwardedItem` reads it;
- `fwdb` (the batched frame, sent only to a peer whose `link_caps` answer named it):
  `{"e", "s", "m": [item, ...]}` where each item is one flat CBOR array of 12:

      topic, payload, qos, retain, expires at | null, publisher | null, msg id,
      origin | null, properties map | null, also [node, ...] | null,
      flags (1 plain, 2 keep retained, 4 replay), groups [[group, filter], ...] | null

  The first ten elements are the message's, the last two the receiver's share of it.
  A frame is written by `fwdb_body` in one join of its pieces (no map, no tuple per
  message: the bytes `cbor2.dumps` would give), and the receiver decodes the whole frame in
  one `cbor2.loads` into plain lists, from which `unpack` builds the `Message`
  directly (about a third of the `fwd` item's decoding and parsing).

Both carry the same batch sequence numbers (and the optional resend mark `RESENT`), so the receiver's duplicate filter and the
sender's resends do not care which format a batch went in.
"""

from __future__ import annotations

from typing import Final, Sequence, cast

import cbor2

from gossip import wire
from mqtt import EMPTY_PROPERTIES
from routing.forward import PLAIN_ONLY, ForwardTarget
from routing.wire import ALSO_SENT_TO, ForwardedItem, forwarded_to_wire
from session_store import records
from session_store.model import Message

FWDB = "fwdb"  # the batched frame's type, and the capability that names it
CAPABILITIES = (FWDB,)  # what this version announces in its link_hello and link_caps

# A batch sent again on a new connection (its acknowledgement never came) carries
# "r": true, in either format (optional: an older receiver ignores it, an older sender
# never sends it).  A receiver that takes it (it restarted meanwhile, so it does not
# know it took it before) may have delivered its messages already.
RESENT = "r"

PLAIN: Final = 1
KEEP_RETAINED: Final = 2
REPLAY: Final = 4

class AckGate:
    """Counts the remote nodes a publisher's PUBACK/PUBREC still waits for (each one
    acknowledges a forwarded message, or is given up on as down)."""

    __slots__ = ("waiting",)

    def __init__(self) -> None:
        self.waiting = 0


class LinkItem:
    """One forwarded message's share for one peer, queued on that peer's link until
    the peer acknowledges the batch that carried it.  The only object a forward makes
    per message and link (none for a QoS 0 message to plain subscribers only: `Queued`):
    the share is the broker's (`ForwardTarget`, most often the one shared `PLAIN_ONLY`),
    and the frame's array for it is built at the flush."""

    __slots__ = ("message", "share", "also", "gate", "held_seq", "sent")

    def __init__(self, message: Message, share: ForwardTarget = PLAIN_ONLY, also: tuple[str, ...] = (),
                 gate: AckGate | None = None, held_seq: int = 0) -> None:
        self.message = message
        self.share = share  # plain, groups, keep retained, replay: what the peer is to do with it
        self.also = also  # the nodes it went to for plain subscribers (when more than one)
        self.gate = gate  # what the publisher's acknowledgement waits on (QoS >= 1)
        self.held_seq = held_seq  # a replayed held message: its record goes once acknowledged
        # Sent once in a batch that was never acknowledged: the peer may have taken it,
        # so the batch that carries it again bears the resend mark.
        self.sent = False

    @property
    def qos(self) -> int:
        return self.message.qos

    @property
    def plain(self) -> bool:
        """Deliver to the receiver's plain subscribers."""
        return self.share.plain

    def fwd_item(self) -> list[object]:
        """This item in a `fwd` frame."""
        share = self.share
        m = records.message_map(self.message)
        if self.also:
            m[ALSO_SENT_TO] = list(self.also)
        return forwarded_to_wire(m, share.plain, share.groups, share.keep_retained, share.replay)

    def fwdb_item(self) -> tuple[object, ...]:
        """This item in a `fwdb` frame (a tuple encodes as the same CBOR array as a list)."""
        msg = self.message
        props = msg.properties
        also = self.also
        share = self.share
        groups = share.groups
        return (msg.topic, msg.payload, msg.qos, msg.retain, msg.expires_at, msg.publisher, msg.msg_id, msg.origin,
                None if props is EMPTY_PROPERTIES else records.properties_to_map(props), list(also) if also else None,
                (PLAIN if share.plain else 0) | (KEEP_RETAINED if share.keep_retained else 0) | (REPLAY if share.replay else 0),
                [list(g) for g in groups] if groups else None)


# What a link queues for its peer: a `LinkItem`, or a QoS 0 message forwarded to the
# peer's plain subscribers only (the common case) as the `Message` itself: such an item
# has the shared `PLAIN_ONLY` share, no `also`, no gate, is never held or replayed, and
# is never marked `sent` (only QoS >= 1 items are held and sent again), so it needs no
# object of its own (a `LinkItem` made and freed per message cost about 5 % of the
# publishing node's time).
Queued = LinkItem | Message


def link_item(item: Queued) -> LinkItem:
    """`item` as a `LinkItem` (for the paths that want one: the older frame)."""
    return item if isinstance(item, LinkItem) else LinkItem(item)


def open_gates(items: Sequence[Queued]) -> bool:
    """Items acknowledged by their peer, or given up: each one's gate waits for one node
    less.  Whether any item had a gate (compiled: a loop per acknowledged batch)."""
    released = False
    for item in items:
        if isinstance(item, LinkItem):
            gate = item.gate
            if gate is not None:
                gate.waiting -= 1
                released = True
    return released


def held_seqs(items: Sequence[Queued]) -> list[int]:
    """The held-message numbers of the replayed items among `items`."""
    return [item.held_seq for item in items if isinstance(item, LinkItem) and item.held_seq]


def sent_before(items: Sequence[Queued]) -> int:
    """How many of `items` went in a batch that was never acknowledged (`LinkItem.sent`)."""
    return sum(1 for item in items if isinstance(item, LinkItem) and item.sent)


def fwdb_body(sender: str, epoch: str, seq: int, items: Sequence[Queued], resent: bool = False) -> bytes:
    """The envelope of a `fwdb` frame carrying `items` (before sealing); `resent` adds
    the optional resend mark (see `RESENT`).

    Written here, compiled, piece by piece into one join: the very bytes `cbor2.dumps`
    gives for the same envelope with each item as `LinkItem.fwdb_item` (the test holds
    them equal), at about half its time per item, and with no tuple per item.  Rare
    fields (properties, `also`, groups, an expiry) go through `cbor2.dumps` each."""
    parts: list[bytes] = [_MAP7 if resent else _MAP6, _ENVELOPE_FWDB, _text(sender), _KEY_E, _text(epoch),
                          _KEY_S, _uint(seq), _KEY_M, _head(0x80, len(items))]
    for item in items:
        _put_item(parts, item)
    if resent:
        parts.append(_RESENT_TRUE)
    return b"".join(parts)


def _put_item(parts: list[bytes], item: Queued) -> None:
    """One item's CBOR array of 12 (the fields of `LinkItem.fwdb_item`), appended.

    The common item (no expiry, properties, `also` or groups) is six pieces: the
    array's head with the topic, the payload's head, the payload, qos/retain/expiry,
    the publisher, the id, and the rest from the origin on (each of these kept)."""
    if isinstance(item, LinkItem):
        msg = item.message
        share = item.share
        also = item.also
    else:
        msg = item
        share = PLAIN_ONLY
        also = ()
    parts.append(_item_head(msg.topic))
    payload = msg.payload
    n = len(payload)
    parts.append(_BYTES_HEADS[n] if n < 0x100 else _head(0x40, n))
    parts.append(payload)
    qos = msg.qos
    expires_at = msg.expires_at
    if expires_at is None and 0 <= qos <= 2:
        parts.append(_QOS_RETAIN_NO_EXPIRY[2 * qos + (1 if msg.retain else 0)])
    else:
        parts.append(_uint(qos))
        parts.append(_TRUE if msg.retain else _FALSE)
        parts.append(_NULL if expires_at is None else cbor2.dumps(expires_at))
    publisher = msg.publisher
    parts.append(_NULL if publisher is None else _text(publisher))
    msg_id = msg.msg_id
    if 0x100000000 <= msg_id < 0x10000000000000000:
        # A node numbers its messages from its start time in microseconds (8 bytes).
        parts.append(_UINT64)
        parts.append(msg_id.to_bytes(8, "big"))
    elif 0x10000 <= msg_id < 0x100000000:
        parts.append(_UINT32)
        parts.append(msg_id.to_bytes(4, "big"))
    elif 0x100 <= msg_id < 0x10000:
        parts.append(_UINT16)
        parts.append(msg_id.to_bytes(2, "big"))
    else:
        parts.append(_uint(msg_id))
    flags = (PLAIN if share.plain else 0) | (KEEP_RETAINED if share.keep_retained else 0) | (REPLAY if share.replay else 0)
    props = msg.properties
    groups = share.groups
    origin = msg.origin
    if props is EMPTY_PROPERTIES and not also and not groups:
        parts.append(_plain_tail(origin, flags))
        return
    parts.append(_NULL if origin is None else _text(origin))
    parts.append(_NULL if props is EMPTY_PROPERTIES else cbor2.dumps(records.properties_to_map(props)))
    parts.append(cbor2.dumps(list(also)) if also else _NULL)
    parts.append(_SMALL_UINTS[flags])
    parts.append(cbor2.dumps([list(g) for g in groups]) if groups else _NULL)


def _item_head(topic: str) -> bytes:
    """An item's array head and its topic's text (kept, as `_text` keeps texts)."""
    encoded = _heads.get(topic)
    if encoded is None:
        encoded = _ARRAY12 + _text(topic)
        if len(_heads) >= _TEXTS_MAX:
            _heads.clear()
        _heads[topic] = encoded
    return encoded


def _plain_tail(origin: str | None, flags: int) -> bytes:
    """An item's last five fields when it has no properties, `also` or groups: origin,
    null, null, flags, null (kept per origin: nearly always this node)."""
    tails = _tails.get(origin)
    if tails is None:
        text = _NULL if origin is None else _text(origin)
        tails = [text + _NULL + _NULL + _SMALL_UINTS[f] + _NULL for f in range(8)]
        if len(_tails) >= _TEXTS_MAX:
            _tails.clear()
        _tails[origin] = tails
    return tails[flags]


def _head(major: int, n: int) -> bytes:
    """A CBOR head: major type (already shifted) and argument `n` >= 0."""
    if n < 24:
        return _SMALL_UINTS[n] if major == 0 else bytes((major | n,))
    if n < 0x100:
        return bytes((major | 24, n))
    if n < 0x10000:
        return bytes((major | 25,)) + n.to_bytes(2, "big")
    if n < 0x100000000:
        return bytes((major | 26,)) + n.to_bytes(4, "big")
    return bytes((major | 27,)) + n.to_bytes(8, "big")


def _uint(n: int) -> bytes:
    if 0 <= n < 24:
        return _SMALL_UINTS[n]
    if 0 <= n < 0x10000000000000000:
        return _head(0, n)
    return bytes(cbor2.dumps(n))  # negative or a bignum: cbor2's own


# Topics, publishers and origins repeat (the origin is always this node): each one's
# CBOR text is kept, up to `_TEXTS_MAX` of them (then the memory starts over).
_TEXTS_MAX = 4096
_texts: dict[str, bytes] = {}
_heads: dict[str, bytes] = {}  # topic -> the item's array head and the topic's text
_tails: dict[str | None, list[bytes]] = {}  # origin -> `_plain_tail` by flags


def _text(s: str) -> bytes:
    encoded = _texts.get(s)
    if encoded is None:
        raw = s.encode("utf-8")
        encoded = _head(0x60, len(raw)) + raw
        if len(_texts) >= _TEXTS_MAX:
            _texts.clear()
        _texts[s] = encoded
    return encoded


_SMALL_UINTS = [bytes((i,)) for i in range(24)]
_BYTES_HEADS = [bytes((0x40 | n,)) if n < 24 else bytes((0x58, n)) for n in range(0x100)]  # byte strings < 256
_UINT32 = b"\x1a"  # the head of an unsigned int in the next 4 bytes
_UINT16 = b"\x19"  # ... in the next 2
_UINT64 = b"\x1b"  # ... in the next 8
_NULL = b"\xf6"
_FALSE = b"\xf4"
_TRUE = b"\xf5"
_ARRAY12 = b"\x8c"
# qos (0-2), retain, no expiry: 3 bytes, by 2 * qos + retain
_QOS_RETAIN_NO_EXPIRY = [bytes((q, 0xF5 if r else 0xF4, 0xF6)) for q in range(3) for r in (0, 1)]
_MAP6 = b"\xa6"  # v, t, from, e, s, m
_MAP7 = b"\xa7"  # ... and the resend mark
_ENVELOPE_FWDB = bytes(cbor2.dumps("v") + cbor2.dumps(wire.VERSION) + cbor2.dumps("t") + cbor2.dumps(FWDB)
                       + cbor2.dumps("from"))
_KEY_E = bytes(cbor2.dumps("e"))
_KEY_S = bytes(cbor2.dumps("s"))
_KEY_M = bytes(cbor2.dumps("m"))
assert len(_KEY_E) == len(_KEY_S) == len(_KEY_M) == 2  # `_read_fwdb` compares two bytes
_RESENT_TRUE = bytes(cbor2.dumps(RESENT) + cbor2.dumps(True))


# A forwarded item read back (either format): the message, plain, groups, keep
# retained, replay, also (`routing.wire.ForwardedItem`'s fields, as one tuple: the
# receiver's loop makes no object per message beyond the `Message`).
Unpacked = tuple[Message, bool, list[tuple[str, str]], bool, bool, tuple[str, ...]]


def unpack_fwd(item: object) -> Unpacked:
    """One decoded `fwd` item; ValueError if it is not one."""
    f = ForwardedItem.from_wire(item)
    return f.message, f.plain, list(f.groups), f.keep_retained, f.replay, f.also


def unpack(item: object) -> Unpacked:
    """One decoded `fwdb` item; ValueError if it is not one."""
    if type(item) is not list or len(item) != 12:
        raise ValueError("a fwdb item is an array of 12")
    topic, payload, qos, retain, expires_at, publisher, msg_id, origin, props, also, flags, groups = item
    if (type(topic) is not str or type(payload) is not bytes or type(qos) is not int or not 0 <= qos <= 2
            or type(retain) is not bool or type(msg_id) is not int or type(flags) is not int
            or not (expires_at is None or isinstance(expires_at, (int, float)))
            or not (publisher is None or type(publisher) is str) or not (origin is None or type(origin) is str)):
        raise ValueError("bad fwdb item")
    msg = Message(topic, payload, qos, retain, records.properties_from_map(props) if props else EMPTY_PROPERTIES,
                  expires_at, publisher, msg_id, origin)
    return (msg, bool(flags & PLAIN), [(str(g), str(f)) for g, f in groups] if groups else [],
            bool(flags & KEEP_RETAINED), bool(flags & REPLAY), tuple(str(n) for n in also) if also else ())


def unpack_read(item: object) -> Unpacked:
    """One item of a frame `read_fwdb` read: decoded already, or (an item it left to
    cbor2) a decoded `fwdb` item; ValueError if it is not one."""
    if type(item) is Message:
        return item, True, [], False, False, ()
    if type(item) is tuple:
        return cast(Unpacked, item)
    return unpack(item)


# A `fwdb` frame read by hand: (epoch, seq, resent, items) where each item is a
# `Message` for plain subscribers only and nothing else (the common case: the receiver
# may take it as such without `unpack_read`), an `Unpacked`, or, for an item with
# anything beyond the common fields, cbor2's decoding of it (for `unpack_read`).
FwdbFrame = tuple[str, int, bool, list[object]]


def read_fwdb(body: bytes) -> FwdbFrame | None:
    """A `fwdb` envelope read without cbor2, or None when it is not one in the form
    `fwdb_body` (and cbor2) writes: the caller decodes it with cbor2 then, so that
    anything unexpected, malformed included, meets exactly what it met before.

    Compiled: the frame's items become the `Message`s directly (no list per item, no
    envelope map), about three times faster than `cbor2.loads` and `unpack`.  An item
    with a field beyond the common ones (an expiry, properties, `also`, groups, or any
    value of an unexpected type) is cut out whole and decoded by cbor2; a frame with
    tags or indefinite lengths anywhere is cbor2's entirely (their meaning can reach
    across items)."""
    try:
        return _read_fwdb(body)
    except Exception:  # anything cbor2 would have to judge: it does, from the start
        return None


def _read_fwdb(body: bytes) -> FwdbFrame | None:
    end = len(body)
    first = body[0] if end else 0
    if first != 0xA6 and first != 0xA7:
        return None
    pos = 1 + len(_ENVELOPE_FWDB)
    if body[1:pos] != _ENVELOPE_FWDB:
        return None
    _sender, pos = _read_text(body, pos)
    if body[pos:pos + 2] != _KEY_E:
        return None
    epoch, pos = _read_text(body, pos + 2)
    if body[pos:pos + 2] != _KEY_S:
        return None
    seq, pos = _read_uint(body, pos + 2)
    if body[pos:pos + 2] != _KEY_M:
        return None
    pos += 2
    if body[pos] >> 5 != 4:
        return None
    count, pos = _read_arg(body, pos)
    items: list[object] = []
    for _ in range(count):
        item, pos = _read_item(body, pos)
        items.append(item)
    resent = False
    if first == 0xA7:
        if body[pos:pos + len(_RESENT_TRUE)] != _RESENT_TRUE:
            return None
        pos += len(_RESENT_TRUE)
        resent = True
    if pos != end:
        return None
    return epoch, seq, resent, items


def _read_item(body: bytes, start: int) -> tuple[object, int]:
    """One item from `start`: an `Unpacked` when its fields are the common ones, else
    cbor2's decoding of it; and where the next one starts."""
    pos = start
    if body[pos] == 0x8C:
        pos += 1
        if body[pos] >> 5 == 3:
            topic, pos = _read_text(body, pos)
            if body[pos] >> 5 == 2:
                n, pos = _read_arg(body, pos)
                payload = body[pos:pos + n]
                pos += n
                if len(payload) == n:
                    qos = body[pos]
                    retain = body[pos + 1]
                    if qos <= 2 and (retain == 0xF4 or retain == 0xF5) and body[pos + 2] == 0xF6:
                        pos += 3
                        publisher: str | None = None
                        if body[pos] == 0xF6:
                            pos += 1
                        elif body[pos] >> 5 == 3:
                            publisher, pos = _read_text(body, pos)
                        else:
                            return _cbor2_item(body, start)
                        if body[pos] >> 5 != 0:
                            return _cbor2_item(body, start)
                        msg_id, pos = _read_arg(body, pos)
                        origin: str | None = None
                        if body[pos] == 0xF6:
                            pos += 1
                        elif body[pos] >> 5 == 3:
                            origin, pos = _read_text(body, pos)
                        else:
                            return _cbor2_item(body, start)
                        flags = body[pos + 2]
                        if body[pos] == 0xF6 and body[pos + 1] == 0xF6 and flags < 24 and body[pos + 3] == 0xF6:
                            msg = Message(topic, payload, qos, retain == 0xF5, EMPTY_PROPERTIES, None, publisher, msg_id,
                                          origin)
                            if flags == PLAIN:
                                return msg, pos + 4  # for plain subscribers only: the message says it all
                            unpacked: Unpacked = (msg, bool(flags & PLAIN), [], bool(flags & KEEP_RETAINED),
                                                  bool(flags & REPLAY), ())
                            return unpacked, pos + 4
    return _cbor2_item(body, start)


def _cbor2_item(body: bytes, start: int) -> tuple[object, int]:
    """The item at `start` decoded by cbor2 (cut out by its extent), and its end."""
    end = _skip(body, start)
    return cbor2.loads(body[start:end]), end


def _skip(body: bytes, pos: int) -> int:
    """Where the CBOR data item at `pos` ends; ValueError for tags and indefinite
    lengths (left to cbor2 with the whole frame) and past the end."""
    todo = 1
    while todo:
        todo -= 1
        major = body[pos] >> 5
        if major == 6 or body[pos] & 0x1F > 27:
            raise ValueError("a tag or an indefinite length")
        n, pos = _read_arg(body, pos)
        if major == 2 or major == 3:
            pos += n
        elif major == 4:
            todo += n
        elif major == 5:
            todo += 2 * n
    if pos > len(body):
        raise ValueError("past the end")
    return pos


def _read_arg(body: bytes, pos: int) -> tuple[int, int]:
    """The argument of the head at `pos` (major type 0-5, or 7's simple values) and
    where the head ends; ValueError for an indefinite length or a reserved value."""
    info = body[pos] & 0x1F
    if info < 24:
        return info, pos + 1
    if pos + (1 << (info - 24)) >= len(body):
        raise ValueError("past the end")
    if info == 24:
        return body[pos + 1], pos + 2
    if info == 25:
        return int.from_bytes(body[pos + 1:pos + 3], "big"), pos + 3
    if info == 26:
        return int.from_bytes(body[pos + 1:pos + 5], "big"), pos + 5
    if info == 27:
        return int.from_bytes(body[pos + 1:pos + 9], "big"), pos + 9
    raise ValueError("an indefinite length or a reserved head")


def _read_uint(body: bytes, pos: int) -> tuple[int, int]:
    if body[pos] >> 5 != 0:
        raise ValueError("not an unsigned int")
    return _read_arg(body, pos)


def _read_text(body: bytes, pos: int) -> tuple[str, int]:
    if body[pos] >> 5 != 3:
        raise ValueError("not a text string")
    n, pos = _read_arg(body, pos)
    raw = body[pos:pos + n]
    if len(raw) != n:
        raise ValueError("past the end")
    return raw.decode("utf-8"), pos + n
