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

from session_store.handoff import stored_from_image, subscriptions_to_wire
from session_store.model import Message
from session_store.store import StoredSession

MOVED_META = "moved/"  # meta keys: moved/<client id> -> {"t": taker, "a": when, "img": image without messages, "f": marks}
TAKEN_META = "taken/"  # meta keys: taken/<client id> -> {"g": giver, "a": when, "m": {member: mark}}


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

    def to_record(self) -> dict[str, object]:
        return {"g": self.giver, "a": self.at, "m": dict(self.marks), "n": self.fresh}

    @classmethod
    def from_record(cls, value: object) -> "TakenIn":
        if not isinstance(value, dict) or not isinstance(value.get("g"), str) or not isinstance(value.get("m"), dict):
            raise ValueError("bad taken record")
        return cls(value["g"], float(value["a"]), {str(k): int(v) for k, v in value["m"].items()}, bool(value.get("n")))


def marks_from_wire(data: object) -> dict[str, int]:
    """Fence marks as they travel (ho_commit's "fenced", a push's answer): {member: id}."""
    if not isinstance(data, dict):
        return {}
    return {str(k): v for k, v in data.items() if isinstance(v, int)}
