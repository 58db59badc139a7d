"""What a node keeps of the sessions that moved between it and others, so a forward
that arrives late reaches each session once (records of `routing.handoff_driver`).

- `Moved`, on the node a session left: where it went and what it subscribes; a
  forward that reaches this node late for it is relayed there (`relay_moved`).
- `TakenIn`, on the node it came to (or fell back on): what the giver got too and is
  to deliver itself, so this node skips it.

Both rest on the fence's marks: per member, the last id of a message it published and
forwarded before it took the taker's routes.  Message ids only grow on their node, so
what it forwards with a larger id went to the taker as well.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from session_store.handoff import stored_from_image, subscriptions_to_wire
from session_store.model import Message
from session_store.store import StoredSession

MOVED_META = "moved/"  # meta keys: moved/<client id> -> {"t": taker, "a": when, "img": image without messages, "f": marks}
TAKEN_META = "taken/"  # meta keys: taken/<client id> -> {"g": giver, "a": when, "m": {member: mark}, "n": fresh, "s": [stale copy holders]}
RELAYED_META = "relayto/"  # meta keys: relayto/<client id> -> [[origin, message id, [nodes]], ...] (`SentTo`)

# Per message relayed into a copy here (origin, message id): the nodes its sender had
# forwarded it to.  The copy's push carries them (ho_push's optional "to"), so the
# owner skips what a session's giver got too (`TakenIn`), as for a direct forward.
SentTo = dict[tuple[str | None, int], tuple[str, ...]]


@dataclass
class Moved:
    """A session this node handed over: where it went, when, and what it subscribes
    (the filters a late forward is matched against)."""

    taker: str
    at: float
    session: StoredSession  # expiry, protocol level and subscriptions; no messages
    # Members fenced by the takeover, with their marks (see `TakenIn`): what they
    # forward after the mark goes to the taker too.
    fenced: dict[str, int] = field(default_factory=dict)

    def taker_has(self, msg: Message, sender: str, also: tuple[str, ...]) -> bool:
        """Whether a message forwarded here reached the taker too, after it held the
        session: sent after the sender's mark, to the taker as well (or by the taker)."""
        mark = self.fenced.get(sender)
        return (mark is not None and msg.origin == sender and msg.msg_id > mark
                and (self.taker in also or sender == self.taker))

    def to_record(self) -> dict[str, object]:
        s = self.session
        image = {"x": s.expiry_interval, "l": s.protocol_level, "n": 1, "i": [], "q2": [],
                 "s": subscriptions_to_wire(s.subscriptions)}
        return {"t": self.taker, "a": self.at, "img": image, "f": dict(self.fenced)}

    @classmethod
    def from_record(cls, client_id: str, value: object) -> "Moved":
        if not isinstance(value, dict) or not isinstance(value.get("t"), str):
            raise ValueError("bad moved record")
        return cls(value["t"], float(value["a"]), stored_from_image(client_id, value["img"], []),
                   marks_from_wire(value.get("f")))


@dataclass
class TakenIn:
    """A session this node took over: from whom, when, and per member fenced by the
    takeover the last message id it had forwarded when it took this node's routes.
    A forward from that member that also went to the giver, with an id up to its
    mark (or from a member not fenced), reached the giver while it held the session,
    or reaches it later and is relayed from there: delivered here too, it would be a
    second copy."""

    giver: str
    at: float
    marks: dict[str, int] = field(default_factory=dict)
    # No copy of the session was here before it came (see `giver_kept`).  The giver's
    # own mark, once known, is in `marks` too: the last id it published before it let
    # its copy go (at the handoff's commit; at the push of the copy it kept through a
    # fallback; 0 when it says it holds none).
    fresh: bool = False
    # Members that held a copy of the session and said it was stale (another node had
    # claimed the client after it; `Handoffs._stale_copy_claimer`): the copy is pushed
    # here later and merged only after the giver's, whose remembered messages the
    # merge then leaves out (it got what the session got there too).
    stale: set[str] = field(default_factory=set)

    def giver_kept(self, msg: Message, sender: str) -> bool:
        """Whether a message the giver published and forwarded here (held while it
        could not reach this node, or stuck in a link) reached the session there: it
        was published while the giver held its copy (up to its mark; no mark yet: it
        holds it still), which delivered it or brings it along.  Only for a session
        that had no copy here: one that had may have been what it was sent for."""
        if not self.fresh or sender != self.giver or msg.origin != sender:
            return False
        mark = self.marks.get(sender)
        return mark is None or msg.msg_id <= mark

    def giver_got(self, msg: Message, sender: str, also: tuple[str, ...]) -> bool:
        """Whether a message `sender` forwarded here (to `also` too) is the giver's to
        deliver: kept in its copy (`giver_kept`), or forwarded to it as well up to the
        sender's mark (no mark: the sender was not fenced yet)."""
        if msg.origin != sender:
            return False
        if self.giver_kept(msg, sender):
            return True
        if self.giver not in also:
            return False
        mark = self.marks.get(sender)
        return mark is None or msg.msg_id <= mark

    def to_record(self) -> dict[str, object]:
        record: dict[str, object] = {"g": self.giver, "a": self.at, "m": dict(self.marks), "n": self.fresh}
        if self.stale:
            record["s"] = sorted(self.stale)  # optional: an older version reads past it
        return record

    @classmethod
    def from_record(cls, value: object) -> "TakenIn":
        if not isinstance(value, dict) or not isinstance(value.get("g"), str) or not isinstance(value.get("m"), dict):
            raise ValueError("bad taken record")
        stale = value.get("s")
        return cls(value["g"], float(value["a"]), {str(k): int(v) for k, v in value["m"].items()}, bool(value.get("n")),
                   {str(n) for n in stale} if isinstance(stale, list) else set())


def marks_from_wire(data: object) -> dict[str, int]:
    """Fence marks as they travel (ho_commit's "fenced", a push's answer): {member: id}."""
    if not isinstance(data, dict):
        return {}
    return {str(k): v for k, v in data.items() if isinstance(v, int)}


def sent_to_wire(sent_to: SentTo, keys: Iterable[tuple[str | None, int]] | None = None) -> list[list[object]]:
    """`SentTo` as it travels and is stored: [[origin, message id, [nodes]], ...] (only
    the messages in `keys`, when given)."""
    wanted = None if keys is None else set(keys)
    return [[o, i, list(nodes)] for (o, i), nodes in sent_to.items() if wanted is None or (o, i) in wanted]


def sent_to_from_wire(data: object) -> SentTo:
    out: SentTo = {}
    if not isinstance(data, list):
        return out
    for item in data:
        if (isinstance(item, (list, tuple)) and len(item) == 3 and (item[0] is None or isinstance(item[0], str))
                and isinstance(item[1], int) and isinstance(item[2], (list, tuple))):
            out[(item[0], item[1])] = tuple(str(n) for n in item[2])
    return out
