"""Held routes and held messages: what a node keeps for a member it cannot reach.

Pure (no Trio, no sockets; time passed in).  When a member becomes unreachable without
leaving (declared dead: crashed, or on the other side of a netsplit), its routes are
not forgotten at once: they become *held routes* for `hold_period` seconds.  A QoS >= 1
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
from typing import Iterable, NamedTuple

from routing.table import split_shared
from routing.trie import TopicTrie
from routing.wire import ALSO_SENT_TO
from session_store import records
from session_store.model import Message


class HeldRoutesRecord(NamedTuple):
    """What the store keeps of a member's held routes: `[[filter, ...], since]`."""

    filters: list[str]
    since: float

    def to_record(self) -> list[object]:
        return [sorted(self.filters), self.since]

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
    filters: frozenset[str]
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
        self.trie: TopicTrie[str] = TopicTrie()
        self._seq = itertools.count(1)
        self.held_total = 0
        self.dropped_full = 0
        self.dropped_aged = 0
        self.replayed = 0

    # ------------------------------------------------------------ routes

    def hold(self, member: str, filters: Iterable[str], now: float) -> bool:
        """The member became unreachable: keep its plain routes.  False if it had none."""
        plain = frozenset(f for f in filters if split_shared(f)[0] is None)
        previous = self.members.pop(member, None)
        if previous is not None:
            # Lost again before its own routes came back: the held ones still stand.
            self.release_routes_of(member, previous)
            plain |= previous.filters
        if not plain:
            return False
        self.members[member] = HeldMember(plain, previous.since if previous is not None else now)
        if previous is not None:
            self.members[member].messages = previous.messages
        for f in plain:
            self.trie.add(f, member)
        return True

    def release_routes(self, member: str) -> None:
        held = self.members.get(member)
        if held is not None:
            self.release_routes_of(member, held)

    def release_routes_of(self, member: str, held: HeldMember) -> None:
        for f in held.filters:
            self.trie.remove(f, member)

    def settle(self, member: str) -> None:
        """A member that came back has its own routes again: the held ones go."""
        held = self.members.get(member)
        if held is not None and held.returned:
            self.release_routes_of(member, held)
            del self.members[member]

    def members_for(self, topic: str) -> set[str]:
        if not self.members:
            return set()
        return set(self.trie.match(topic))

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
        """The member left for good: drop its routes; return what was held for it."""
        held = self.members.pop(member, None)
        if held is None:
            return []
        for f in held.filters:
            self.trie.remove(f, member)
        return [(seq, msg) for seq, msg, _, _ in held.messages]

    def expire(self, now: float) -> tuple[list[str], list[tuple[str, int]]]:
        """(members whose hold period ended, with everything they had; (member, seq) of
        messages older than `max_age` or past their own expiry)."""
        gone: list[str] = []
        aged: list[tuple[str, int]] = []
        for member, held in list(self.members.items()):
            if now - held.since > self.hold_period:
                gone.append(member)
                aged.extend((member, seq) for seq, _, _, _ in held.messages)
                self.dropped_aged += len(held.messages)
                self.release_routes(member)
                del self.members[member]
                continue
            while held.messages and (now - held.messages[0][2] > self.max_age or held.messages[0][1].expired(now)):
                aged.append((member, held.messages.popleft()[0]))
                self.dropped_aged += 1
        return gone, aged

    def counts(self) -> dict[str, int]:
        return {m: len(h.messages) for m, h in self.members.items()}
