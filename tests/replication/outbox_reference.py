"""The replication outbox as it was before its delivery log (`replication/outbox.py` at
76c481d: a dict of each delivery's last change, merged and costed in Python): the
reference `test_outbox_log.py` holds the log to, batch for batch.  Test code only."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from session_store.model import Delivery

# A change other than a delivery's: (epoch or None, seq, kind, a, b) as
# `replication.service` queues it ("S" snapshot, "x" end, "m", "s", "q", "w").
Entry = tuple[int | None, int, str, Any, Any]
# One item of a taken session, in sequence order: (seq, kind, a, b); a delivery's is
# (seq, "d", delivery, state).
Item = tuple[int, str, Any, Any]


@dataclass
class _Pending:
    first: int  # the lowest sequence number pending (superseded delivery changes too)
    last: int  # the highest
    epoch: int | None  # the oldest write epoch pending (None: none with one)
    count: int = 0  # changes pending, no-ops to be included (the lag)
    entries: list[Entry] = field(default_factory=list)
    # delivery -> (seq of its last change, state, epoch of its first change pending);
    # re-inserted at each change, so in the order of their last changes
    deliveries: dict[Delivery, tuple[int, int, int | None]] = field(default_factory=dict)


@dataclass
class Taken:
    """One session's part of a batch: `items` in sequence order, every number from
    `first` to `last` not among them a no-op; `epoch` the oldest write epoch taken and
    `count` the changes it stands for (confirmations and the lag count them)."""

    client_id: str
    first: int
    last: int
    epoch: int | None
    count: int
    items: list[Item]
    snapshot: bool  # a snapshot is among the items (it stands for all of them)


def _older(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return a if a < b else b


class Outbox:
    """The changes waiting for one replica, per session in the order their first
    change came."""

    def __init__(self) -> None:
        self._sessions: dict[str, _Pending] = {}
        self._count = 0

    def __bool__(self) -> bool:
        return bool(self._sessions)

    def __len__(self) -> int:
        """Changes pending (superseded delivery states too)."""
        return self._count

    def add(self, epoch: int | None, client_id: str, seq: int, kind: str, a: Any = None, b: Any = None) -> None:
        """A change other than a delivery's (a snapshot "S" or an end "x" included)."""
        pending = self._sessions.get(client_id)
        if pending is None:
            pending = self._sessions[client_id] = _Pending(seq, seq, epoch)
        else:
            if seq < pending.first:
                pending.first = seq
            if seq > pending.last:
                pending.last = seq
            pending.epoch = _older(pending.epoch, epoch)
        pending.entries.append((epoch, seq, kind, a, b))
        pending.count += 1
        self._count += 1

    def add_delivery(self, epoch: int, client_id: str, seq: int, delivery: Delivery, state: int) -> None:
        """A delivery's change: it replaces the delivery's earlier one still pending."""
        pending = self._sessions.get(client_id)
        if pending is None:
            pending = self._sessions[client_id] = _Pending(seq, seq, epoch)
        else:
            pending.last = seq
            if pending.epoch is None:
                pending.epoch = epoch
        deliveries = pending.deliveries
        before = deliveries.pop(delivery, None)
        deliveries[delivery] = (seq, state, epoch if before is None else before[2])
        pending.count += 1
        self._count += 1

    def snapshot_first(self, epoch: int | None, client_id: str, seq: int) -> None:
        """A snapshot the replica asked for: it goes with the session's next batch and
        stands for everything pending of it."""
        self.add(epoch, client_id, seq, "S")

    def oldest(self) -> int | None:
        """The oldest write epoch pending."""
        oldest: int | None = None
        for pending in self._sessions.values():
            oldest = _older(oldest, pending.epoch)
        return oldest

    def count(self, client_id: str) -> int:
        pending = self._sessions.get(client_id)
        return 0 if pending is None else pending.count

    def clear(self) -> None:
        self._sessions.clear()
        self._count = 0

    def take(self, limit: int, compact: bool) -> list[Taken]:
        """Sessions' changes for one batch, about `limit` changes (no-ops counted as
        they travel: a run as one with `compact`, one each without).  A session larger
        than what is left is cut at a sequence number: the rest stays pending."""
        out: list[Taken] = []
        budget = limit
        for client_id in list(self._sessions):
            if budget <= 0:
                break
            pending = self._sessions[client_id]
            if any(e[2] == "S" for e in pending.entries):
                # A snapshot (built when the batch is, at the session's number then)
                # stands for all of it: it goes first, and the rest only if the
                # session is gone by then (no snapshot to build).
                items: list[Item] = [(e[1], e[2], e[3], e[4]) for e in pending.entries if e[2] == "S"]
                items.extend(_merge(_Pending(pending.first, pending.last, None, 0,
                                             [e for e in pending.entries if e[2] != "S"], pending.deliveries),
                                    1 << 62, compact)[0])
                out.append(Taken(client_id, pending.first, pending.last, pending.epoch, pending.count,
                                 items, True))
                budget -= 1
                self._count -= pending.count
                del self._sessions[client_id]
                continue
            items, cut = _merge(pending, budget, compact)
            if cut is None:
                out.append(Taken(client_id, pending.first, pending.last, pending.epoch, pending.count, items, False))
                budget -= _cost(items, pending.first, compact)
                self._count -= pending.count
                del self._sessions[client_id]
                continue
            # Cut at `cut`: what is above it stays.
            taken_count = cut - pending.first + 1
            epoch: int | None = None
            for e in pending.entries:
                if e[1] <= cut:
                    epoch = _older(epoch, e[0])
            rest_epoch: int | None = None
            pending.entries = [e for e in pending.entries if e[1] > cut]
            for e in pending.entries:
                rest_epoch = _older(rest_epoch, e[0])
            kept: dict[Delivery, tuple[int, int, int | None]] = {}
            for d, value in pending.deliveries.items():
                if value[0] > cut:
                    kept[d] = value
                    rest_epoch = _older(rest_epoch, value[2])
                else:
                    epoch = _older(epoch, value[2])
            # A delivery still pending whose first change was taken as a no-op: its
            # epoch stays pending (a `sync` acknowledgement waits for its state).
            taken_count = min(taken_count, pending.count)
            out.append(Taken(client_id, pending.first, cut, epoch, taken_count, items, False))
            pending.deliveries = kept
            pending.first = cut + 1
            pending.count -= taken_count
            pending.epoch = rest_epoch
            self._count -= taken_count
            break
        return out


def _merge(pending: _Pending, budget: int, compact: bool) -> tuple[list[Item], int | None]:
    """The session's items in sequence order, and None, or (cut short by `budget`)
    the items up to a sequence number and that number."""
    entries = pending.entries
    deliveries = list(pending.deliveries.items())
    items: list[Item] = []
    i = j = 0
    n, m = len(entries), len(deliveries)
    spent = 0
    previous = pending.first - 1
    while i < n or j < m:
        # Deliveries first at an equal number (as queued: a delivery's change is
        # queued before an end the same round queues at the session's current number).
        if j < m and (i >= n or deliveries[j][1][0] <= entries[i][1]):
            d, (seq, state, _) = deliveries[j]
            item: Item = (seq, "d", d, state)
            j += 1
        else:
            e = entries[i]
            seq = e[1]
            item = (seq, e[2], e[3], e[4])
            i += 1
        gap = seq - previous - 1
        spent += 1 + (min(gap, 1) if compact else max(gap, 0))
        if spent > budget and items and seq > previous:
            return items, previous
        items.append(item)
        previous = max(previous, seq)
    return items, None


def _cost(items: list[Item], first: int, compact: bool) -> int:
    spent = 0
    previous = first - 1
    for item in items:
        gap = item[0] - previous - 1
        spent += 1 + (min(gap, 1) if compact else max(gap, 0))
        previous = max(previous, item[0])
    return spent
