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

from typing import Sequence

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

PLAIN = 1
KEEP_RETAINED = 2
REPLAY = 4

class AckGate:
    """Counts the remote nodes a publisher's PUBACK/PUBREC still waits for (each one
    acknowledges a forwarded message, or is given up on as down)."""

    __slots__ = ("waiting",)

    def __init__(self) -> None:
        self.waiting = 0


class LinkItem:
    """One forwarded message's share for one peer, queued on that peer's link until
    the peer acknowledges the batch that carried it.  The only object a forward makes
    per message and link: the share is the broker's (`ForwardTarget`, most often the
    one shared `PLAIN_ONLY`), and the frame's array for it is built at the flush."""

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


def open_gates(items: Sequence[LinkItem]) -> bool:
    """Items acknowledged by their peer, or given up: each one's gate waits for one node
    less.  Whether any item had a gate (compiled: a loop per acknowledged batch)."""
    released = False
    for item in items:
        gate = item.gate
        if gate is not None:
            gate.waiting -= 1
            released = True
    return released


def held_seqs(items: Sequence[LinkItem]) -> list[int]:
    """The held-message numbers of the replayed items among `items`."""
    return [item.held_seq for item in items if item.held_seq]


def fwdb_body(sender: str, epoch: str, seq: int, items: Sequence[LinkItem], resent: bool = False) -> bytes:
    """The envelope of a `fwdb` frame carrying `items` (before sealing); `resent` adds
    the optional resend mark (see `RESENT`).

    Written here, compiled, piece by piece into one join: the very bytes `cbor2.dumps`
    gives for the same envelope with each item as `LinkItem.fwdb_item` (the test holds
    them equal), at about half its time per item, and with no tuple per item.  Rare
    fields (properties, `also`, groups, an expiry) go through `cbor2.dumps` each."""
    parts: list[bytes] = [_MAP7 if resent else _MAP6, _ENVELOPE_FWDB, cbor2.dumps(sender), _KEY_E, cbor2.dumps(epoch),
                          _KEY_S, cbor2.dumps(seq), _KEY_M, _head(0x80, len(items))]
    for item in items:
        _put_item(parts, item)
    if resent:
        parts.append(_RESENT_TRUE)
    return b"".join(parts)


def _put_item(parts: list[bytes], item: LinkItem) -> None:
    """One item's CBOR array of 12 (the fields of `LinkItem.fwdb_item`), appended."""
    msg = item.message
    share = item.share
    parts.append(_ARRAY12)
    parts.append(_text(msg.topic))
    payload = msg.payload
    parts.append(_head(0x40, len(payload)))
    parts.append(payload)
    parts.append(_uint(msg.qos))
    parts.append(_TRUE if msg.retain else _FALSE)
    expires_at = msg.expires_at
    parts.append(_NULL if expires_at is None else cbor2.dumps(expires_at))
    publisher = msg.publisher
    parts.append(_NULL if publisher is None else _text(publisher))
    parts.append(_uint(msg.msg_id))
    origin = msg.origin
    parts.append(_NULL if origin is None else _text(origin))
    props = msg.properties
    parts.append(_NULL if props is EMPTY_PROPERTIES else cbor2.dumps(records.properties_to_map(props)))
    also = item.also
    parts.append(cbor2.dumps(list(also)) if also else _NULL)
    parts.append(_SMALL_UINTS[(PLAIN if share.plain else 0) | (KEEP_RETAINED if share.keep_retained else 0)
                              | (REPLAY if share.replay else 0)])
    groups = share.groups
    parts.append(cbor2.dumps([list(g) for g in groups]) if groups else _NULL)


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
_NULL = b"\xf6"
_FALSE = b"\xf4"
_TRUE = b"\xf5"
_ARRAY12 = b"\x8c"
_MAP6 = b"\xa6"  # v, t, from, e, s, m
_MAP7 = b"\xa7"  # ... and the resend mark
_ENVELOPE_FWDB = bytes(cbor2.dumps("v") + cbor2.dumps(wire.VERSION) + cbor2.dumps("t") + cbor2.dumps(FWDB)
                       + cbor2.dumps("from"))
_KEY_E = bytes(cbor2.dumps("e"))
_KEY_S = bytes(cbor2.dumps("s"))
_KEY_M = bytes(cbor2.dumps("m"))
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
