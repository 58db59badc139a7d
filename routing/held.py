"""Held routes and held messages: what a node keeps for a member it cannot reach.

Pure (no Trio, no sockets; time passed in).  When a member becomes unreachable without
leaving (declared dead: crashed, or on the other side of a netsplit), its routes are
not forgotten at once: they become *held routes* for `hold_period` seconds.  The route
table keeps them (`RouteTable.hold_origin`: by reference, in its trie, so a death costs
no copy of a member's routes) and names the member for what they match; this module
keeps the rest: since when, whether it is back, and its messages.  A QoS >= 1
publish that matches a held route of a member is *held* for that member (in order,
bounded by `max_messages` per member, oldest dropped first, and by `max_age`), persisted
by the caller, and replayed to the member when it is reachable again.  A member that
leaves gracefully has nothing held: its sessions were handed off or ended.

Shared subscriptions are not held: a group is served by any member, so the live
members take its messages during a split.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

from routing.wire import ALSO_SENT_TO
from session_store import records
from session_store.model import Message


class HeldRoutesRecord(NamedTuple):
    """What the store keeps of a member's held routes: `[[filter, ...], since]`."""

    filters: list[str]
    since: float

    def to_record(self) -> list[object]:
        # Unsorted: sorting a member's 100,000 filters took tens of milliseconds of its death.
        return [self.filters, self.since]

    @classmethod
    def from_record(cls, data: object) -> "HeldRoutesRecord":
        if not isinstance(data, (list, tuple)) or len(data) != 2 or not isinstance(data[0], (list, tuple)):
            raise ValueError("a held routes record is [[filter, ...], since]")
        return cls([str(f) for f in data[0]], float(data[1]))


HELD_SENT = "sb"  # a held message record's optional key: it went in a batch never acknowledged


class HeldMessageRecord(NamedTuple):
    """What the store keeps of one held message: `[message map, held at]`; the map's
    optional "to" names the nodes the message went to for plain subscribers (as on
    the wire: routing.wire `ALSO_SENT_TO`), and its optional `HELD_SENT` that it went
    in a batch the member never acknowledged (`LinkItem.sent`: replayed with the resend
    mark, after a restart of this node too); an earlier version reads past both."""

    message: Message
    held_at: float
    also: tuple[str, ...] = ()
    sent: bool = False

    def to_record(self) -> list[object]:
        data = records.message_map(self.message)
        if self.also:
            data[ALSO_SENT_TO] = list(self.also)
        if self.sent:
            data[HELD_SENT] = True
        return [data, self.held_at]

    @classmethod
    def from_record(cls, data: object) -> "HeldMessageRecord":
        if not isinstance(data, (list, tuple)) or len(data) != 2 or not isinstance(data[0], dict):
            raise ValueError("a held message record is [message, held at]")
        also = data[0].get(ALSO_SENT_TO) or ()
        return cls(records.message_from_map(data[0]), float(data[1]), tuple(str(n) for n in also),
                   data[0].get(HELD_SENT) is True)


@dataclass
class HeldMember:
    since: float
    # (seq, message, held at, the nodes it went to for plain subscribers)
    messages: deque[tuple[int, Message, float, tuple[str, ...]]] = field(default_factory=deque)
    returned: bool = False  # reachable again: the routes still route until its own are back


class HeldTraffic:
    def __init__(self, *, hold_period: float, max_messages: int, max_age: float) -> None:
        self.hold_period = hold_period
        self.max_messages = max_messages
        self.max_age = max_age
        self.members: dict[str, HeldMember] = {}
        self._seq = itertools.count(1)
        self.held_total = 0
        self.dropped_full = 0
        self.dropped_aged = 0
        self.replayed = 0

    # ------------------------------------------------------------ members

    def hold(self, member: str, now: float) -> None:
        """The member became unreachable with routes held (the route table keeps them)."""
        previous = self.members.get(member)
        if previous is not None:
            # Lost again before its own routes came back: held since the first time,
            # with what is held for it still.
            previous.returned = False
            return
        self.members[member] = HeldMember(now)

    def settle(self, member: str) -> bool:
        """A member that came back has its own routes again: it is held no more (the
        caller releases its held routes). False if it was not back or not held."""
        held = self.members.get(member)
        if held is not None and held.returned:
            del self.members[member]
            return True
        return False

    def is_held(self, member: str) -> bool:
        """Unreachable with routes held (not back yet)."""
        held = self.members.get(member)
        return held is not None and not held.returned

    # ------------------------------------------------------------ messages

    def add(self, member: str, msg: Message, now: float, seq: int | None = None,
            also: tuple[str, ...] = ()) -> tuple[int, list[int]]:
        """Hold `msg` for `member`: (its sequence number, the sequence numbers dropped to
        make room)."""
        held = self.members[member]
        if seq is None:
            seq = next(self._seq)
        else:  # restored from the store: new numbers continue after it
            self._seq = itertools.count(max(seq + 1, next(self._seq)))
        if self.max_messages <= 0:
            self.dropped_full += 1
            return seq, [seq]
        dropped: list[int] = []
        while len(held.messages) >= self.max_messages:
            dropped.append(held.messages.popleft()[0])
            self.dropped_full += 1
        held.messages.append((seq, msg, now, also))
        self.held_total += 1
        return seq, dropped

    def take(self, member: str) -> list[tuple[int, Message]]:
        """The member is reachable again: its held messages are returned in the order
        they were held, for replay.  Its held routes stay (marked `returned`) until the
        caller sees the member's own routes again, so nothing published meanwhile falls
        between the two."""
        return [(seq, msg) for seq, msg, _ in self.take_with_also(member)]

    def take_with_also(self, member: str) -> list[tuple[int, Message, tuple[str, ...]]]:
        """`take`, with the nodes each message went to for plain subscribers."""
        held = self.members.get(member)
        if held is None:
            return []
        out = [(seq, msg, also) for seq, msg, _, also in held.messages]
        held.messages.clear()
        held.returned = True
        self.replayed += len(out)
        return out

    def forget(self, member: str) -> list[tuple[int, Message]]:
        """The member left for good (the caller releases its held routes): return what
        was held for it."""
        held = self.members.pop(member, None)
        if held is None:
            return []
        return [(seq, msg) for seq, msg, _, _ in held.messages]

    def expire(self, now: float) -> tuple[list[str], list[tuple[str, int]]]:
        """(members whose hold period ended, with everything they had (the caller
        releases their held routes); (member, seq) of
        messages older than `max_age` or past their own expiry)."""
        gone: list[str] = []
        aged: list[tuple[str, int]] = []
        for member, held in list(self.members.items()):
            if now - held.since > self.hold_period:
                gone.append(member)
                aged.extend((member, seq) for seq, _, _, _ in held.messages)
                self.dropped_aged += len(held.messages)
                del self.members[member]
                continue
            while held.messages and (now - held.messages[0][2] > self.max_age or held.messages[0][1].expired(now)):
                aged.append((member, held.messages.popleft()[0]))
                self.dropped_aged += 1
        return gone, aged

    def counts(self) -> dict[str, int]:
        return {m: len(h.messages) for m, h in self.members.items()}
