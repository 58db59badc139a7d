"""The merge of one replay: every node's part of a stream, read in pages, delivered in
position order; then the switch to live messages with no gap and no duplicate; and the
parts of nodes that were down, delivered when they are back.

Sans-I/O: the driver (`streams.cursor`) asks `to_fetch()` which pages to read, feeds
the answers (`page`, `failed`), offers every live message of the subscription
(`live`), and sends what `take()` returns, in that order.

How the switch loses nothing and repeats nothing. Live messages of the subscription are
offered from the moment it exists, before any page is read, and are held per origin
node while that node's part is being read. A node answers a page only from what is
durable when it was asked, and says `end` only when it reached the end of its part
*and* it already forwarded live messages of this filter to the subscriber's node when
it was asked (its route table had the route). So every message of that node is either
in a page (position <= the last key read from it) or arrives live (position greater).
At the switch, the held live messages at or below the last key read are dropped (they
were read), the rest are delivered in position order, and from then on live messages
pass straight through, but for those at or below the last key read (a page travels on
its own stream and can overtake the forward of a message it holds).

Memory stays bounded: the driver asks one page per node at a time, and a node's held
live messages are dropped past `hold_limit` (the node's part is then simply read
further, since every live message of a stream is also stored there; what is read of it
then comes in that node's order, no longer merged with the parts already past it).

A node that does not answer (down, or lost during the replay) is reported with a
`missing` marker and left out of the merge; once every other part is delivered, the
driver retries it, and when it answers its part is delivered in its own order
(positions after the last read from it), then its held live messages, then a
`recovered` marker.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field
from typing import Iterable

from streams import position as positions

HOLD_LIMIT = 10_000  # live messages held per node while its part is read


@dataclass(frozen=True, slots=True)
class Record:
    position: str
    item: object  # the message; opaque here


@dataclass(frozen=True, slots=True)
class Marker:
    kind: str  # "missing", "recovered", "truncated"
    origin: str
    detail: str = ""  # truncated: the first position kept there


class Phase(enum.Enum):
    MERGING = "merging"  # reading every reachable node's part, merged
    RECOVERING = "recovering"  # missing during the merge: read on its own when back
    LIVE = "live"


@dataclass(slots=True)
class _Origin:
    phase: Phase
    read: str  # the last key read from this node: its next page starts after it
    queue: deque[Record] = field(default_factory=deque)
    end: bool = False
    missing: bool = False
    retry: bool = False  # missing, and the driver says it is time to ask again
    asking: bool = False
    first_page: bool = True
    held: list[Record] = field(default_factory=list)


class ReplayMerge:
    def __init__(self, after: str, origins: Iterable[str], *, hold_limit: int = HOLD_LIMIT) -> None:
        self.after = after
        self.hold_limit = hold_limit
        self.origins: dict[str, _Origin] = {o: _Origin(Phase.MERGING, after) for o in origins}
        self.merging = True
        self._out: list[Record | Marker] = []
        self.delivered = 0
        self.dropped_live = 0  # duplicates of read messages, dropped at the switch
        self.overflows = 0

    # ------------------------------------------------------------- what to read

    def to_fetch(self) -> list[tuple[str, str]]:
        """(node, after) for every page to ask for now; each is marked asked until its
        answer (`page` or `failed`) comes."""
        wanted: list[tuple[str, str]] = []
        for node, o in self.origins.items():
            if o.asking or o.phase is Phase.LIVE or o.end or o.queue:
                continue
            if o.missing and not (o.retry and not self.merging):
                continue
            o.asking = True
            wanted.append((node, o.read))
        return wanted

    def page(self, node: str, records: list[Record], last_key: str, end: bool, trimmed: str = "") -> None:
        """A node's answer: its records after the asked key (in position order), the
        last key it read (records that did not match the filter included), whether
        that was the end of its part, and the newest position its retention removed."""
        o = self.origins[node]
        o.asking = False
        if o.missing:
            o.missing = o.retry = False
            if o.phase is Phase.MERGING:
                o.phase = Phase.RECOVERING
        if o.first_page and trimmed and trimmed > self.after:
            self._out.append(Marker("truncated", node, records[0].position if records else ""))
        o.first_page = False
        if last_key > o.read:
            o.read = last_key
        o.end = end
        if o.phase is Phase.RECOVERING:
            self._out.extend(records)
            self.delivered += len(records)
            if end:
                self._go_live(node, o, sort=True)
                self._out.append(Marker("recovered", node))
            return
        o.queue.extend(records)
        self._advance()

    def failed(self, node: str) -> None:
        """A node did not answer: its part is missing for now (what was read from it
        is still delivered in order)."""
        o = self.origins[node]
        o.asking = False
        if not o.missing:
            o.missing = True
            self._out.append(Marker("missing", node))
        self._advance()

    def retry(self, node: str) -> None:
        """Time to ask a missing node again (the driver's backoff)."""
        o = self.origins.get(node)
        if o is not None and o.missing:
            o.retry = True

    def add_node(self, node: str) -> None:
        """A node not known when the replay started (it joined since): its part is read
        on its own, from the replay's start."""
        if node not in self.origins:
            self.origins[node] = _Origin(Phase.MERGING if self.merging else Phase.RECOVERING, self.after)

    # ------------------------------------------------------------- live messages

    def live(self, record: Record) -> bool:
        """A live message of the subscription: True to deliver it now; False if the
        merge keeps it (held until the switch, or dropped as a duplicate)."""
        node = positions.origin(record.position)
        o = self.origins.get(node)
        if o is None:
            self.add_node(node)
            o = self.origins[node]
        if o.phase is Phase.LIVE:
            if record.position > o.read:
                return True
            # Read in a page already: its forward was still on the way (a page and a
            # forward travel on different streams, so the page can come first).
            self.dropped_live += 1
            return False
        o.held.append(record)
        if len(o.held) > self.hold_limit:
            # Too many to hold: drop them and read that node's part further instead.
            o.held.clear()
            o.end = False
            self.overflows += 1
        return False

    # ------------------------------------------------------------- output

    def take(self) -> list[Record | Marker]:
        out, self._out = self._out, []
        return out

    @property
    def finished(self) -> bool:
        """Every node's part delivered; live messages pass through."""
        return not self.merging and all(o.phase is Phase.LIVE for o in self.origins.values())

    def missing_nodes(self) -> list[str]:
        return sorted(n for n, o in self.origins.items() if o.missing)

    def _advance(self) -> None:
        if not self.merging:
            return
        out = self._out
        active = [o for o in self.origins.values() if o.phase is Phase.MERGING and (o.queue or not (o.end or o.missing))]
        while active:
            if any(not o.queue for o in active):
                return  # a node whose next record is not read yet could be the smallest
            best = min(active, key=lambda o: o.queue[0].position)
            out.append(best.queue.popleft())
            self.delivered += 1
            if not best.queue and (best.end or best.missing):
                active.remove(best)
        self.merging = False
        switched: list[Record] = []
        for node, o in self.origins.items():
            if o.phase is not Phase.MERGING:
                continue
            if o.missing:
                o.phase = Phase.RECOVERING
            else:
                switched.extend(self._go_live(node, o, sort=False))
        switched.sort(key=lambda r: r.position)
        out.extend(switched)
        self.delivered += len(switched)

    def _go_live(self, node: str, o: _Origin, *, sort: bool) -> list[Record]:
        """The node's part is read: its held live messages that were not read (position
        past the last key read), in position order; the node is live from now."""
        kept = [r for r in o.held if r.position > o.read]
        self.dropped_live += len(o.held) - len(kept)
        o.held = []
        o.phase = Phase.LIVE
        if sort:
            kept.sort(key=lambda r: r.position)
            self._out.extend(kept)
            self.delivered += len(kept)
        return kept
