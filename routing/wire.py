"""The records the routing layer sends to peers, and the CBOR lists they travel as.

Each record converts to and from exactly the lists and maps earlier versions sent, so
nodes of this version and of the previous one still understand each other (see
tests/routing/test_wire_compat.py):

- `ForwardedItem`, one forwarded publish in a `fwd` batch on a mesh link:
  `[message map, plain, [[group, filter], ...], keep retained]`, and a fifth element
  `true` when it is a held message replayed after a split; a message forwarded to
  more than one node for plain subscribers names them in its map's optional `"to"`
  (earlier versions ignore the key; absent, the receiver assumes it was the only one);
- `RouteBroadcast`, the `route` gossip broadcast: `[route delta, origin ts in us]`;
- `PeerDigest`, the `routes` push-pull state: `{"n": node, "d": {origin: [epoch,
  version, hash]}}` (also `routes_req`'s `d`).

A malformed record raises ValueError (or `records.RecordError`, a ValueError).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, NamedTuple, Sequence

from routing.table import Digest, RouteDelta, digest_from_wire, digest_to_wire
from session_store import records
from session_store.model import Message


ALSO_SENT_TO = "to"  # the message map's optional key: the nodes a forward went to for plain subscribers


def forwarded_to_wire(message: Mapping[str, object], plain: bool, groups: Sequence[tuple[str, str]], keep_retained: bool,
                      replay: bool = False) -> list[object]:
    """The wire list of a forwarded item whose message is already a map (the cluster
    encodes a message once and sends it to every target)."""
    # (group, filter) tuples encode as the same CBOR arrays as lists.
    item: list[object] = [message, plain, groups, keep_retained]
    if replay:
        item.append(True)
    return item


@dataclass(frozen=True, slots=True)
class ForwardedItem:
    message: Message
    plain: bool  # deliver to the receiver's plain subscribers
    groups: tuple[tuple[str, str], ...]  # (group, filter): shared groups the receiver serves for it
    keep_retained: bool  # keep it as its topic's retained message
    replay: bool = False  # a held message replayed after a split: maybe taken once already
    also: tuple[str, ...] = ()  # every node it was forwarded to for plain subscribers (when more than one)

    def to_wire(self) -> list[object]:
        data = records.message_map(self.message)
        if self.also:
            data[ALSO_SENT_TO] = list(self.also)
        return forwarded_to_wire(data, self.plain, self.groups, self.keep_retained, self.replay)

    @classmethod
    def from_wire(cls, data: object) -> "ForwardedItem":
        if not isinstance(data, (list, tuple)) or not 4 <= len(data) <= 5:
            raise ValueError("a forwarded item is an array of 4 or 5")
        message, plain, groups, keep_retained = data[:4]
        if not isinstance(message, dict) or not isinstance(groups, (list, tuple)):
            raise ValueError("bad forwarded item")
        parsed = tuple((str(g), str(f)) for g, f in groups)
        also = message.get(ALSO_SENT_TO) or ()
        if not isinstance(also, (list, tuple)):
            raise ValueError("bad forwarded item: its message's 'to' is not a list")
        return cls(records.message_from_map(message), bool(plain), parsed, bool(keep_retained),
                   len(data) == 5 and bool(data[4]), tuple(str(n) for n in also))


class RouteBroadcast(NamedTuple):
    delta: RouteDelta
    origin_ts_us: int

    def to_wire(self) -> list[object]:
        return [self.delta.to_wire(), self.origin_ts_us]

    @classmethod
    def from_wire(cls, data: object) -> "RouteBroadcast":
        if not isinstance(data, (list, tuple)) or len(data) != 2:
            raise ValueError("a route broadcast is an array of 2")
        delta, ts = data
        return cls(RouteDelta.from_wire(delta), int(ts))


class PeerDigest(NamedTuple):
    node: str
    digest: Digest

    def to_wire(self) -> dict[str, object]:
        return {"n": self.node, "d": digest_to_wire(self.digest)}

    @classmethod
    def from_wire(cls, data: object) -> "PeerDigest":
        if not isinstance(data, dict) or not isinstance(data.get("n"), str):
            raise ValueError("bad route digest state")
        return cls(data["n"], digest_from_wire(data.get("d")))
