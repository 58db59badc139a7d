"""What waits to go to one replica: the owner's side of the replication stream, per
session, kept so that a delivery's change costs one list append.

Every change of a replicated session has its sequence number (`replication.service`
numbers them) and goes to each of the session's replicas in order.  A subscriber that
keeps up changes each delivery two or three times (queued, sent, acknowledged) before
a batch leaves, and only the last state matters to a replica: the earlier ones travel
as no-ops (`changes.noop_change` / `skip_change`), which keep the sequence gapless.  So
a delivery's changes are appended as they come to the session's *log* here, one
`(seq, "d", delivery, state)` each (`Replication.delivery_changed` appends to the log
of each replica's outbox directly, through the session's `Sinks`, and asks this module
for a log only when a session has none pending), and a batch reads off each
delivery's last change (`take`); the other changes (session, subscription, QoS 2 id,
will, end, snapshot) are kept in order beside it.  A batch takes them merged in
sequence order; the sequence numbers in between are the no-ops.  What a replica is
sent is what a queue of every change would send: the last state of each delivery at
the number of its last change (measured: scripts/bench/RESULTS.md).

`sync` mode holds its acknowledgements on the oldest write epoch pending: a log's is
the epoch of its first change (the epochs only grow), so a change costs no epoch
bookkeeping.

Pure: no Trio, no I/O.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from operator import itemgetter, sub
from typing import Any

from session_store.model import Delivery

# A change other than a delivery's: (epoch or None, seq, kind, a, b) as
# `replication.service` queues it ("S" snapshot, "x" end, "m", "s", "q", "w").
Entry = tuple[int | None, int, str, Any, Any]
# One item of a taken session, in sequence order: (seq, kind, a, b); a delivery's is
# (seq, "d", delivery, state), which is also what its log holds for each change.
Item = tuple[int, str, Any, Any]

_SEQ = itemgetter(0)


class Sinks:
    """Where one session's delivery changes go: the log of each of its replicas'
    outboxes, valid while `replicas` equals the session's replica list (None: ask the
    outboxes again).  An outbox that takes or drops the session's log sets `replicas`
    to None."""

    __slots__ = ("logs", "replicas")

    def __init__(self) -> None:
        self.logs: list[list[Item]] = []
        self.replicas: list[str] | None = None


class _Pending:
    __slots__ = ("first", "last", "epoch", "count", "entries", "log", "log_epoch", "sinks")

    def __init__(self, first: int) -> None:
        self.first = first  # the lowest sequence number pending (superseded delivery changes too)
        self.last = first  # the highest among the entries (the log's last is its own)
        self.epoch: int | None = None  # the oldest write epoch among the entries
        self.count = 0  # changes pending besides the log's (the lag counts both)
        self.entries: list[Entry] = []
        self.log: list[Item] = []  # delivery changes in sequence order
        # The write epoch of the log's first change (epochs only grow, so the oldest),
        # or, after a cut, of the oldest change a delivery still pending had before it
        self.log_epoch: int | None = None
        self.sinks: Sinks | None = None  # told when the log is taken

    def oldest(self) -> int | None:
        return _older(self.epoch, self.log_epoch)

    def total(self) -> int:
        return self.count + len(self.log)

    def last_seq(self) -> int:
        log = self.log
        return self.last if not log or log[-1][0] < self.last else log[-1][0]

    def release(self) -> None:
        if self.sinks is not None:
            self.sinks.replicas = None


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
        self._count = 0  # changes pending besides the logs'

    def __bool__(self) -> bool:
        return bool(self._sessions)

    def __len__(self) -> int:
        """Changes pending (superseded delivery states too)."""
        return self._count + sum(len(p.log) for p in self._sessions.values())

    def add(self, epoch: int | None, client_id: str, seq: int, kind: str, a: Any = None, b: Any = None) -> None:
        """A change other than a delivery's (a snapshot "S" or an end "x" included)."""
        pending = self._sessions.get(client_id)
        if pending is None:
            pending = self._sessions[client_id] = _Pending(seq)
        else:
            if seq < pending.first:
                pending.first = seq
            if seq > pending.last:
                pending.last = seq
        pending.epoch = _older(pending.epoch, epoch)
        pending.entries.append((epoch, seq, kind, a, b))
        pending.count += 1
        self._count += 1

    def log_of(self, client_id: str, seq: int, epoch: int, sinks: Sinks | None = None) -> list[Item]:
        """The session's log, to append delivery changes to from `seq` on (`epoch`: the
        write epoch of that change); `sinks` is told when the log is taken."""
        pending = self._sessions.get(client_id)
        if pending is None:
            pending = self._sessions[client_id] = _Pending(seq)
        if not pending.log:
            pending.log_epoch = _older(pending.log_epoch, epoch)
        if sinks is not None:
            pending.sinks = sinks
        return pending.log

    def add_delivery(self, epoch: int, client_id: str, seq: int, delivery: Delivery, state: int) -> None:
        """A delivery's change (what `Replication.delivery_changed` does through the
        session's `Sinks`): a later one of the same delivery supersedes it."""
        self.log_of(client_id, seq, epoch).append((seq, "d", delivery, state))

    def snapshot_first(self, epoch: int | None, client_id: str, seq: int) -> None:
        """A snapshot the replica asked for: it goes with the session's next batch and
        stands for everything pending of it."""
        self.add(epoch, client_id, seq, "S")

    def oldest(self) -> int | None:
        """The oldest write epoch pending."""
        oldest: int | None = None
        for pending in self._sessions.values():
            oldest = _older(oldest, pending.oldest())
        return oldest

    def count(self, client_id: str) -> int:
        pending = self._sessions.get(client_id)
        return 0 if pending is None else pending.total()

    def clear(self) -> None:
        for pending in self._sessions.values():
            pending.release()
        self._sessions.clear()
        self._count = 0

    def _remove(self, client_id: str, pending: _Pending) -> None:
        del self._sessions[client_id]
        self._count -= pending.count
        pending.release()

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
            deliveries = _last_changes(pending.log)
            entries = pending.entries
            if entries and any(e[2] == "S" for e in entries):
                # A snapshot (built when the batch is, at the session's number then)
                # stands for all of it: it goes first, and the rest only if the
                # session is gone by then (no snapshot to build).
                items: list[Item] = [(e[1], e[2], e[3], e[4]) for e in entries if e[2] == "S"]
                items.extend(_in_order(deliveries, [e for e in entries if e[2] != "S"]))
                out.append(Taken(client_id, pending.first, pending.last_seq(), pending.oldest(), pending.total(),
                                 items, True))
                budget -= 1
                self._remove(client_id, pending)
                continue
            items = _in_order(deliveries, entries) if entries else deliveries
            spent = _cost(items, pending.first, compact)
            cut = None if spent <= budget else _cut(items, pending.first, budget, compact)
            if cut is None:
                out.append(Taken(client_id, pending.first, pending.last_seq(), pending.oldest(), pending.total(),
                                 items, False))
                budget -= spent
                self._remove(client_id, pending)
                continue
            items = [item for item in items if item[0] <= cut]
            # Cut at `cut`: what is above it stays.  A delivery whose last change is
            # above it keeps its earlier ones' epoch pending (taken as no-ops: a `sync`
            # acknowledgement waits for its state): the log's first epoch, which is
            # no later than any of them.
            total = pending.total()
            taken_count = min(cut - pending.first + 1, total)
            log = pending.log
            kept_from = bisect_right(log, cut, key=_SEQ)
            log_taken = kept_from > 0
            epoch: int | None = pending.log_epoch if log_taken else None
            rest_epoch: int | None = None
            for e in entries:
                if e[1] <= cut:
                    epoch = _older(epoch, e[0])
                else:
                    rest_epoch = _older(rest_epoch, e[0])
            pending.entries = [e for e in entries if e[1] > cut]
            del log[:kept_from]  # in place: the session's sinks may still append to it
            if not log:
                # Its next change is the log's first: its epoch is asked for then.
                pending.log_epoch = None
                pending.release()
            pending.epoch = rest_epoch
            out.append(Taken(client_id, pending.first, cut, epoch, taken_count, items, False))
            pending.first = cut + 1
            remaining = total - taken_count
            self._count -= pending.count
            pending.count = max(0, remaining - len(log))
            self._count += pending.count
            break
        return out


def _last_changes(log: list[Item]) -> list[Item]:
    """Each delivery's last change in the log, in sequence order."""
    if not log:
        return []
    last = {item[2]: item for item in log}
    if len(last) == len(log):
        return log[:]
    return sorted(last.values(), key=_SEQ)


def _in_order(deliveries: list[Item], entries: list[Entry]) -> list[Item]:
    """Deliveries' and other changes merged in sequence order, deliveries first at an
    equal number (as queued: a delivery's change is queued before an end the same
    round queues at the session's current number)."""
    items = deliveries + [(e[1], e[2], e[3], e[4]) for e in entries]
    items.sort(key=_SEQ)  # stable: deliveries stay ahead at an equal number
    return items


def _cost(items: list[Item], first: int, compact: bool) -> int:
    """What `items` (in sequence order) cost a batch's budget: one each, plus the
    no-ops between them (a run as one with `compact`); an item at the number of the one
    before it costs nothing more with `compact`.  Without a loop in Python: this runs
    over every delivery a batch takes."""
    if not items:
        return 0
    seqs = [item[0] for item in items]
    steps = list(map(sub, seqs, [first - 1, *seqs[:-1]]))  # >= 0: in order
    if compact:
        # sum of min(step, 2): a new number alone 1, after a gap 2, a repeated one 0
        return 2 * len(steps) - steps.count(1) - 2 * steps.count(0)
    # sum of max(step, 1): every number from `first` on, plus one per repeated number
    return seqs[-1] - first + 1 + steps.count(0)


def _cut(items: list[Item], first: int, budget: int, compact: bool) -> int | None:
    """The sequence number to cut `items` at so that what is taken costs about
    `budget`: at least one item, never between items of one number (None: nowhere,
    they go whole)."""
    spent = 0
    previous = first - 1
    for index, item in enumerate(items):
        seq = item[0]
        gap = seq - previous - 1
        spent += 1 + (min(gap, 1) if compact else max(gap, 0))
        if spent > budget and index and seq > previous:
            return previous
        previous = max(previous, seq)
    return None
