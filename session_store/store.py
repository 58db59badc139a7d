"""The session store interface and its in-memory implementation.

The broker keeps live session state in `session_store.model` objects; a store is the
durable mirror of the persistent part of it.  Every change is recorded into the
current batch (no I/O on the Trio thread); the node's committer takes the batch and
writes it in one go off the Trio thread (`write_batch`, group commit), then marks its
epoch durable.  An acknowledgement that promises durability waits until
`durable_epoch >= ` the `write_epoch` it was made at.

Keys (bytes):  session-scoped records are `client_id + b"\\0" + suffix`, so one
session's records sort together and a session is removed by deleting one key range;
MQTT strings cannot contain U+0000, so the separator cannot occur in a client id.

Deliveries: one record per delivery, keyed by its sequence number (8 big-endian
bytes, so a prefix scan returns a session's stream in order), from the moment it is
queued or sent until it is acknowledged.  Queued and inflight deliveries share the
`queue` family: moving one from the queue into the inflight window overwrites its
record with the inflight state and packet id (one put, not a tombstone and a second
record).  So a sequence number is either queued or inflight, never both: `put_inflight`
replaces a queued record of the same delivery.

Deliveries are tracked on the `Delivery` objects, not in the batch: a delivery call
sets the state the store should hold for it (`store_state`: queued, inflight with its
packet id, or none) and, on its first change since it was last taken, puts the object
in the set of the open commit window; no key, record or tuple is built on the Trio
thread.  `take_batch` compares each taken delivery's wanted state with the state its
record has (`store_disk`) and hands the writer only the differences: a delivery queued
and acknowledged before it is taken writes nothing, one acknowledged after it was
committed writes one tombstone, one queued, sent and acknowledged across commits
writes its record once (queued or inflight, whichever it was at the take) and one
tombstone.  The broker passes the same `Delivery` object for every change to a
delivery (as it keeps it in the session), which is what makes this work.  A delivery
that is done for good (acknowledged, dropped, expired) is released
(`release_delivery`): it leaves its window at once, so the store holds no reference to
it (freed as it goes, not in bursts at the takes, which cost the cyclic GC hundreds of
collections a second), and if it has a record a tombstone joins the open window.

When a change reaches the disk (`mesh.node` drives this):

- `sync`: every commit takes everything (`take_batch()`); an acknowledgement waits
  for the commit of what its packet changed.
- `batch` and `off`, window W = `durability_batch_ms`: the committer ticks every W/2
  on a fixed grid and calls `take_batch(hold=1)`.  The window of delivery changes made
  since the previous tick closes and waits for the next tick; the windows before it
  are written.  So a delivery change made at time t is written at the second tick
  after t, at most W after it (plus the time the write itself takes; longer only when
  the writes cannot keep up); a delivery released before then is never written.  Other
  changes (sessions, subscriptions, wills, QoS 2 ids, retained messages, meta) go with
  the next write and at the latest at the second tick after them, also within W.
  **Loss bound**: a `kill -9` or a crash of the machine loses at most the changes of
  the last W milliseconds (in `off`, a crash of the machine also what the OS had not
  flushed).  A tick at which a write is due also writes the newest window when
  waiting would likely spare fewer record writes than another synced commit costs
  (`EARLY_WRITE_BUDGET`; writing early never weakens the bound): so a standing backlog
  gets one synced write per W, as one commit per window did, while the deliveries of
  a subscriber that acknowledges within W/2 are never written.

Values are versioned (`session_store.records`):
binary format 2 for deliveries, CBOR format 1 for everything else; format-1
deliveries (queue and inflight families) are still read, and `load` rewrites
format-1 inflight records into the queue family.
"""

from __future__ import annotations

import functools
import itertools
import logging
import struct
from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Protocol

from mqtt import Will
from session_store import records
from session_store.model import Delivery, Message, SubscriptionOptions

log = logging.getLogger("meshd.session_store")

SEP = b"\x00"
COLUMN_FAMILIES = ("sessions", "subscriptions", "inflight", "queue", "qos2_in", "retained", "wills", "meta", "delayed", "streams",
                   "replica")
SESSION_SCOPED = ("subscriptions", "inflight", "queue", "qos2_in")

_U64 = struct.Struct(">Q")
_U16 = struct.Struct(">H")
pack_seq = _U64.pack  # a delivery key's suffix
MIN_RANGE_RUN = 4  # shorter runs of deleted deliveries get point tombstones


@functools.lru_cache(maxsize=65536)
def session_prefix(client_id: str) -> bytes:
    """`client_id + \\0`, cached: it is built for every stored delivery."""
    return client_id.encode("utf-8") + SEP


def split_key(key: bytes) -> tuple[str, bytes]:
    cid, _, suffix = key.partition(SEP)
    return cid.decode("utf-8"), suffix


@dataclass
class StoredSession:
    client_id: str
    expiry_interval: int = 0
    protocol_level: int = 4
    disconnected_at: float | None = None
    next_seq: int = 1
    subscriptions: dict[str, SubscriptionOptions] = field(default_factory=dict)
    inflight: list[tuple[int, Delivery, str]] = field(default_factory=list)  # in send order
    queue: list[Delivery] = field(default_factory=list)  # in order
    qos2_in: set[int] = field(default_factory=set)
    will: tuple[Will, float | None] | None = None
    # Handed over only: identities of the messages the session was given lately (see
    # routing.handoff_driver `_start_remembering`); never stored.
    remembered: set[tuple[str | None, int]] = field(default_factory=set)


@dataclass
class StoreStats:
    """What the committer wrote (metrics): a delivery acknowledged before its deadline
    never shows up here."""

    commits: int = 0  # write batches (in sync and batch durability each one synced)
    delivery_puts: int = 0  # delivery records written (queued or inflight)
    delivery_deletes: int = 0  # delivery records deleted
    other_records: int = 0  # sessions, subscriptions, wills, QoS 2 ids, retained, meta; whole-session deletes

    def count(self, batch: "PendingBatch") -> None:
        self.commits += 1
        self.delivery_puts += len(batch.put_deliveries)
        self.delivery_deletes += len(batch.delete_seqs)
        self.other_records += len(batch.ops) + len(batch.prefix_deletes) + len(batch.range_deletes)


@dataclass
class RecoveredState:
    sessions: dict[str, StoredSession] = field(default_factory=dict)
    retained: list[Message] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    # Session replication: the delivery records of the copies this node holds of other
    # members' sessions, client id -> delivery seq -> record (`put_replica_delivery`).
    replica: dict[str, dict[int, bytes]] = field(default_factory=dict)
    skipped: int = 0  # unreadable values, logged with their keys


Op = tuple[Callable[..., bytes], tuple[Any, ...]]  # (encoder, args): the value, encoded at write time

NO_RECORD = -1  # a delivery's store state: no record (never stored, or deleted)
# What holding a window back may cost, in delivery records: the next tick's synced
# commit (~90 us of committer CPU for the WAL sync alone) and the records written twice
# (queued at one tick, inflight at the next).  Measured in persist-batch at 10 ms:
# holding every window back cost +1.6 us/msg, ~700 us per extra commit, against ~2 us
# a record.  `take_batch` writes a window early when waiting would save fewer writes.
EARLY_WRITE_BUDGET = 300


def delivery_state(state: str | None, packet_id: int = 0) -> int:
    """The store state of a delivery: `records.QUEUED` for a queued one, else its
    inflight state code and packet id in one int (one attribute write on the hot path)."""
    return records.QUEUED if state is None else records.STATE_CODES[state] | packet_id << 2


class PendingBatch:
    """Changes recorded since the last commit, coalesced per key.

    The last change to a key wins, so a record put and deleted within one commit
    window costs one tombstone: values are kept as (encoder, args) and encoded only
    when the batch is written, off the Trio thread. Prefix deletes (a whole session)
    drop the pending changes they cover and are applied before the remaining ones.

    Deliveries (the `queue` family) come from `SessionStore.take_batch`, already
    reduced to what the store lacks: `puts` as (delivery, state) with the state as of
    the take, `deletes` as (client id, seq).  Byte keys and records are built only by
    the writer.
    """

    __slots__ = ("ops", "put_deliveries", "put_states", "delete_owners", "delete_seqs", "prefix_deletes", "range_deletes")

    def __init__(self) -> None:
        self.ops: dict[tuple[str, bytes], Op | None] = {}
        # Parallel lists, not lists of tuples: nothing for the cyclic GC to track per item.
        self.put_deliveries: list[Delivery] = []
        self.put_states: list[int] = []
        self.delete_owners: list[str] = []
        self.delete_seqs: list[int] = []
        self.prefix_deletes: list[tuple[str, bytes]] = []
        # (cf, start, end): every key in [start, end), applied with the prefix deletes.
        self.range_deletes: list[tuple[str, bytes, bytes]] = []

    @property
    def puts(self) -> list[tuple[Delivery, int]]:
        """(delivery, state) for every delivery record to write."""
        return list(zip(self.put_deliveries, self.put_states))

    @property
    def deletes(self) -> list[tuple[str, int]]:
        """(client id, seq) for every delivery record to delete."""
        return list(zip(self.delete_owners, self.delete_seqs))

    def put(self, cf: str, key: bytes, encoder: Callable[..., bytes], *args: Any) -> None:
        self.ops[(cf, key)] = (encoder, args)

    def delete(self, cf: str, key: bytes) -> None:
        self.ops[(cf, key)] = None

    def delete_prefix(self, cf: str, prefix: bytes) -> None:
        for k in [k for k in self.ops if k[0] == cf and k[1].startswith(prefix)]:
            del self.ops[k]
        self.prefix_deletes.append((cf, prefix))

    def delete_range(self, cf: str, start: bytes, end: bytes) -> None:
        for k in [k for k in self.ops if k[0] == cf and start <= k[1] < end]:
            del self.ops[k]
        self.range_deletes.append((cf, start, end))

    def __len__(self) -> int:
        return (len(self.ops) + len(self.put_deliveries) + len(self.delete_seqs) + len(self.prefix_deletes)
                + len(self.range_deletes))

    def items(self) -> Iterable[tuple[str, bytes, bytes | None]]:
        """(cf, key, encoded value or None for a delete), prefix deletes excluded."""
        for (cf, key), op in self.ops.items():
            yield cf, key, None if op is None else op[0](*op[1])
        encode = records.encode_delivery_record
        for d, state in zip(self.put_deliveries, self.put_states):
            yield "queue", session_prefix(d.owner) + pack_seq(d.seq), encode(d, state & 3, state >> 2)
        for client_id, seq in zip(self.delete_owners, self.delete_seqs):
            yield "queue", session_prefix(client_id) + pack_seq(seq), None


class _Window:
    """The delivery changes of one commit window: the deliveries first changed in it (a
    dict used as an ordered set, so a released one leaves at once) and the records of
    deliveries released in it (tombstones)."""

    __slots__ = ("deliveries", "released", "tomb_owners", "tomb_seqs", "epoch")

    def __init__(self) -> None:
        self.deliveries: dict[Delivery, None] = {}
        self.released = 0  # deliveries that left `deliveries` when they were released
        self.tomb_owners: list[str] = []
        self.tomb_seqs: list[int] = []
        self.epoch = 0  # the write epoch when the window closed


def _nothing() -> None:
    """The default `on_dirty`: no committer to wake (a store used without a node)."""


class SessionTap(Protocol):
    """Told every change to a stored session, after the store recorded it (its
    `write_epoch` is the change's epoch): session replication (`replication/`) streams
    them to the session's replicas.  `state` of a delivery is its store state
    (`delivery_state`, or `NO_RECORD` once it is gone)."""

    def session_changed(self, client_id: str, expiry_interval: int, protocol_level: int,
                        disconnected_at: float | None, next_seq: int) -> None: ...

    def session_deleted(self, client_id: str) -> None: ...

    def subscription_changed(self, client_id: str, topic_filter: str, options: SubscriptionOptions | None) -> None: ...

    def delivery_changed(self, client_id: str, delivery: Delivery, state: int) -> None: ...

    def qos2_in_changed(self, client_id: str, packet_id: int, present: bool) -> None: ...

    def will_changed(self, client_id: str, will: Will | None, due_at: float | None) -> None: ...


class SessionStore(ABC):
    """Record changes into a batch; commit batches off-thread; load everything at start."""

    def __init__(self, *, on_dirty: Callable[[], None] | None = None) -> None:
        self.write_epoch = 0  # bumped by every recorded change
        self.durable_epoch = 0  # every change up to this epoch is committed
        # Called when the first change of a batch is recorded (the committer wakes).
        self.on_dirty: Callable[[], None] = on_dirty if on_dirty is not None else _nothing
        self.stats = StoreStats()
        # Why the last write failed, while writes fail (a full or failing disk: the
        # node's committer keeps the batch and tries again); None once one succeeds.
        self.write_failed: str | None = None
        self._batch = PendingBatch()
        # Delivery changes not yet taken, by the window ("generation") of their first
        # such change: the open one (`_open`, generation `_gen`) and the closed ones not
        # yet taken (`_held`, oldest first, generations `_taken + 1` ..).  A delivery is in
        # at most one of them: the one numbered `store_gen`, if that is above `_taken`.
        self._open = _Window()
        self._held: deque[_Window] = deque()
        self._gen = 1
        self._taken = 0  # every generation up to this one has been taken
        self._taken_epoch = 0  # the write epoch when generation `_taken` closed
        # The other changes (`_batch`): the write epoch before the first of them, and
        # whether they were already pending at the previous tick (due at this one).
        self._batch_epoch = 0
        self._batch_aged = False
        # Session replication: told every session change (`on_session_change`), and in
        # `sync` replication it holds `durable_epoch` below the oldest change a live
        # replica has not confirmed (`hold_durable`), so every acknowledgement that waits
        # for durability waits for the replicas too.  `local_durable_epoch` is this
        # node's disk alone (what the committer and a replica's own confirmations need).
        self._tap: SessionTap | None = None
        self.local_durable_epoch = 0
        self._replicated_floor: int | None = None
        self._local_waiters: list[tuple[int, Callable[[], None]]] = []
        # `async` replication holds no acknowledgement, but an exchange that must be
        # exactly once across the owner's death (a QoS 2 PUBLISH or PUBREL to a
        # subscriber) waits until its packet id state is on the replicas (`hold_exchanges`).
        self._exchange_floor: int | None = None
        self._exchange_waiters: list[tuple[int, Callable[[], None]]] = []

    def on_session_change(self, tap: SessionTap | None) -> None:
        """Tell `tap` every change to a stored session from now on (one tap per store;
        None: no one)."""
        self._tap = tap

    @property
    def replicated_floor(self) -> int | None:
        """What `hold_durable` holds `durable_epoch` at (None: nothing waits for replicas)."""
        return self._replicated_floor

    def hold_durable(self, floor: int | None) -> None:
        """Every change up to `floor` is on the replicas that must have it (None: none
        is waited for): `durable_epoch` does not pass it."""
        self._replicated_floor = floor
        self._settle()

    @property
    def exchange_floor(self) -> int | None:
        """What `hold_exchanges` says the replicas have (None: nothing unconfirmed)."""
        return self._exchange_floor

    def hold_exchanges(self, floor: int | None) -> None:
        """`async` replication: every change up to `floor` is on the replicas (None:
        every change is); the exchanges waiting for it (`when_replicated`) are called."""
        self._exchange_floor = floor
        waiters = self._exchange_waiters
        if waiters:
            ready = [cb for epoch, cb in waiters if floor is None or epoch <= floor]
            if ready:
                self._exchange_waiters = [(e, cb) for e, cb in waiters if floor is not None and e > floor]
                for cb in ready:
                    cb()

    @property
    def exchanges_waiting(self) -> bool:
        return bool(self._exchange_waiters)

    def when_replicated(self, epoch: int, callback: Callable[[], None]) -> None:
        """Call `callback` once every change up to `epoch` is on the replicas
        (`hold_exchanges`; at once when nothing is unconfirmed)."""
        floor = self._exchange_floor
        if floor is None or epoch <= floor:
            callback()
        else:
            self._exchange_waiters.append((epoch, callback))

    def when_locally_durable(self, epoch: int, callback: Callable[[], None]) -> None:
        """Call `callback` once every change up to `epoch` is on this node's disk
        (whatever replicas have): a replica confirms what it wrote with this."""
        if epoch <= self.local_durable_epoch:
            callback()
        else:
            self._local_waiters.append((epoch, callback))

    def _settle(self) -> None:
        floor = self._replicated_floor
        durable = self.local_durable_epoch if floor is None or floor >= self.local_durable_epoch else floor
        if durable > self.durable_epoch:
            self.durable_epoch = durable

    # -- the backend -------------------------------------------------------------------------

    @abstractmethod
    def write_batch(self, batch: PendingBatch, *, sync: bool) -> None:
        """Encode and write a batch taken by `take_batch`. Blocking: call it from a
        worker thread."""

    @abstractmethod
    def scan(self, cf: str) -> Iterable[tuple[bytes, bytes]]:
        """Every (key, value) of a column family in key order (start-up only)."""

    @abstractmethod
    def iter_range(self, cf: str, start: bytes, end: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        """(key, value) for the keys in [start, end) (no end: to the family's end) in
        key order, as written (not the open batch): one iterator, the caller stops when
        it has enough. Blocking: off the Trio thread in a node."""

    @abstractmethod
    def close(self) -> None: ...

    def scan_range(self, cf: str, start: bytes, limit: int) -> list[tuple[bytes, bytes]]:
        """Up to `limit` (key, value) of a column family from `start` on, in key order,
        as written (not the open batch)."""
        return list(itertools.islice(self.iter_range(cf, start), limit))

    def count(self, cf: str) -> int:
        """Records in a column family, as written (start-up only)."""
        return sum(1 for _ in self.scan(cf))

    def take_batch(self, hold: int = 0) -> tuple[PendingBatch, int]:
        """Hand over what is to be written now (and the epoch it reaches).

        Closes the open window of delivery changes, then takes every closed window but
        the newest `hold` ones: their tombstones, and their deliveries whose record
        differs from what it should be (as puts with their state now, or deletes).
        `hold` 0 (sync mode, shutdown) takes everything.  `hold` 1 (a `batch`/`off`
        tick, every half window): the window closed now waits for the next tick, unless
        a write is due anyway and its deliveries, expected to outlive their deadline as
        often as those due now did, would save fewer than `EARLY_WRITE_BUDGET` record
        writes by waiting (then it goes now, sparing the next tick's synced write); the
        other changes (sessions, subscriptions, wills, QoS 2 ids, retained, meta) go
        with any delivery that is due, and at the latest at the tick after the one
        that found them (so nothing waits longer than two ticks).  When nothing is due
        the batch is empty.  The epoch returned is one that every change up to it is
        durable at once the batch is written."""
        held = self._held
        window = self._open
        window.epoch = self.write_epoch
        held.append(window)
        self._open = _Window()
        self._gen += 1
        batch = self._batch
        changed = 0
        while len(held) > hold:
            changed += self._take_window(batch)
        puts = len(batch.put_deliveries)
        if hold and puts and len(held[-1].deliveries) * (changed - puts) <= EARLY_WRITE_BUDGET * changed:
            # A write is due anyway, and the newest window's deliveries, if they outlive
            # their deadline as often as the ones due now did, would cost one more synced
            # write for fewer records than that write costs: they go now (writing early
            # never weakens the bound).
            while held:
                self._take_window(batch)
        if hold and not batch.put_deliveries and not batch.delete_seqs and not self._batch_aged:
            # No delivery is due and the other changes (if any) are not yet: they wait
            # for the next tick.
            self._batch_aged = len(batch) > 0
            if self._batch_aged:
                return PendingBatch(), min(self._taken_epoch, self._batch_epoch)
            return PendingBatch(), self._taken_epoch
        self._batch = PendingBatch()
        self._batch_aged = False
        return batch, self._taken_epoch

    def _take_window(self, batch: PendingBatch) -> int:
        """The oldest closed window into the batch: its tombstones, and its deliveries
        whose record differs from what it should be.  Returns how many deliveries were
        first changed in it (released ones included)."""
        window = self._held.popleft()
        self._taken += 1
        self._taken_epoch = window.epoch
        if window.tomb_seqs:
            batch.delete_owners += window.tomb_owners
            batch.delete_seqs += window.tomb_seqs
        put_deliveries = batch.put_deliveries
        put_states = batch.put_states
        delete_owners = batch.delete_owners
        delete_seqs = batch.delete_seqs
        for d in window.deliveries:
            state = d.store_state
            if state != d.store_disk:
                d.store_disk = state
                if state < 0:
                    delete_owners.append(d.owner)
                    delete_seqs.append(d.seq)
                else:
                    put_deliveries.append(d)
                    put_states.append(state)
        return len(window.deliveries) + window.released

    def _other_changes(self) -> PendingBatch:
        """The batch of changes other than deliveries; notes the write epoch before the
        first of them (what `take_batch` may report durable while they wait)."""
        batch = self._batch
        if not batch.ops and not batch.prefix_deletes and not batch.range_deletes:
            self._batch_epoch = self.write_epoch
        return batch

    def _put(self, cf: str, key: bytes, encoder: Callable[..., bytes], *args: Any) -> None:
        self._other_changes().put(cf, key, encoder, *args)

    def _delete(self, cf: str, key: bytes) -> None:
        self._other_changes().delete(cf, key)

    def _delete_prefix(self, cf: str, prefix: bytes) -> None:
        self._other_changes().delete_prefix(cf, prefix)

    def _changed(self) -> None:
        if self.write_epoch == self.local_durable_epoch:
            self.on_dirty()
        self.write_epoch += 1

    def has_pending(self) -> bool:
        """Changes not yet on this node's disk (the committer's question)."""
        return self.write_epoch > self.local_durable_epoch

    def mark_durable(self, epoch: int) -> None:
        if epoch > self.local_durable_epoch:
            self.local_durable_epoch = epoch
            self._settle()
            if self._local_waiters:
                ready = [cb for e, cb in self._local_waiters if e <= epoch]
                self._local_waiters = [(e, cb) for e, cb in self._local_waiters if e > epoch]
                for cb in ready:
                    cb()

    # -- what the broker records -----------------------------------------------------------

    def put_session(self, client_id: str, expiry_interval: int, protocol_level: int, disconnected_at: float | None, next_seq: int) -> None:
        self._put("sessions", client_id.encode("utf-8"), records.encode_session, expiry_interval, protocol_level, disconnected_at, next_seq)
        self._changed()
        if self._tap is not None:
            self._tap.session_changed(client_id, expiry_interval, protocol_level, disconnected_at, next_seq)

    def delete_session(self, client_id: str) -> None:
        """Remove every record of one session."""
        self._delete("sessions", client_id.encode("utf-8"))
        self._delete("wills", client_id.encode("utf-8"))
        prefix = session_prefix(client_id)
        for cf in SESSION_SCOPED:
            self._delete_prefix(cf, prefix)
        # Its deliveries' pending changes and tombstones go too (the range delete is
        # applied first and would not cover them); they have no record once it is written.
        for window in (*self._held, self._open):
            for d in [d for d in window.deliveries if d.owner == client_id]:
                del window.deliveries[d]
                d.store_disk = NO_RECORD
                d.store_gen = 0
            if client_id in window.tomb_owners:
                kept = [(o, q) for o, q in zip(window.tomb_owners, window.tomb_seqs) if o != client_id]
                window.tomb_owners = [o for o, _ in kept]
                window.tomb_seqs = [q for _, q in kept]
        self._changed()
        if self._tap is not None:
            self._tap.session_deleted(client_id)

    def put_subscription(self, client_id: str, topic_filter: str, options: SubscriptionOptions) -> None:
        self._put("subscriptions", session_prefix(client_id) + topic_filter.encode("utf-8"), records.encode_subscription, options)
        self._changed()
        if self._tap is not None:
            self._tap.subscription_changed(client_id, topic_filter, options)

    def delete_subscription(self, client_id: str, topic_filter: str) -> None:
        self._delete("subscriptions", session_prefix(client_id) + topic_filter.encode("utf-8"))
        self._changed()
        if self._tap is not None:
            self._tap.subscription_changed(client_id, topic_filter, None)

    # The delivery calls run for every message to a persistent session: a few attribute
    # writes and, once per commit window, a list append (`_changed` inlined).

    def put_queued(self, client_id: str, delivery: Delivery) -> None:
        """Store a queued delivery (keyed by its sequence number)."""
        delivery.store_state = 0  # records.QUEUED
        if delivery.store_gen <= self._taken:
            delivery.store_gen = self._gen
            delivery.owner = client_id
            self._open.deliveries[delivery] = None
        if self.write_epoch == self.local_durable_epoch:
            self.on_dirty()
        self.write_epoch += 1
        if self._tap is not None:
            self._tap.delivery_changed(client_id, delivery, 0)

    def put_inflight(self, client_id: str, packet_id: int, delivery: Delivery, state: str) -> None:
        """Store a delivery sent with `packet_id` ('publish' or 'pubrel' sent): replaces
        its queued record, if it had one."""
        delivery.store_state = records.STATE_CODES[state] | packet_id << 2
        if delivery.store_gen <= self._taken:
            delivery.store_gen = self._gen
            delivery.owner = client_id
            self._open.deliveries[delivery] = None
        if self.write_epoch == self.local_durable_epoch:
            self.on_dirty()
        self.write_epoch += 1
        if self._tap is not None:
            self._tap.delivery_changed(client_id, delivery, delivery.store_state)

    def delete_delivery(self, client_id: str, delivery: Delivery) -> None:
        """A delivery's record is to go, and the delivery may be stored again (e.g. it
        leaves the queue and `put_inflight` follows).  One that is done for good:
        `release_delivery`, which is cheaper for the store."""
        delivery.store_state = NO_RECORD
        if delivery.store_gen <= self._taken:
            delivery.store_gen = self._gen
            delivery.owner = client_id
            self._open.deliveries[delivery] = None
        if self.write_epoch == self.local_durable_epoch:
            self.on_dirty()
        self.write_epoch += 1
        if self._tap is not None:
            self._tap.delivery_changed(client_id, delivery, NO_RECORD)

    def release_delivery(self, client_id: str, delivery: Delivery) -> None:
        """A delivery is done for good (acknowledged, dropped, expired) and will never be
        stored again: its pending change goes at once (so the store keeps no reference
        to it and it is freed now, not in a burst at the next take) and, if it has a
        record, a tombstone is due with this window."""
        gen = delivery.store_gen
        if gen > self._taken:
            window = self._open if gen == self._gen else self._held[gen - self._taken - 1]
            del window.deliveries[delivery]
            window.released += 1
            delivery.store_gen = 0
        delivery.store_state = NO_RECORD
        if delivery.store_disk >= 0:
            delivery.store_disk = NO_RECORD
            window = self._open
            window.tomb_owners.append(client_id)
            window.tomb_seqs.append(delivery.seq)
            if self.write_epoch == self.local_durable_epoch:
                self.on_dirty()
            self.write_epoch += 1
        if self._tap is not None:
            self._tap.delivery_changed(client_id, delivery, NO_RECORD)

    @staticmethod
    def forget(delivery: Delivery) -> None:
        """The delivery has no record (its session's records were deleted while it
        stayed in memory): the next put writes it again."""
        delivery.store_disk = NO_RECORD

    def put_qos2_in(self, client_id: str, packet_id: int) -> None:
        self._put("qos2_in", session_prefix(client_id) + _U16.pack(packet_id), records.encode_value, 1)
        self._changed()
        if self._tap is not None:
            self._tap.qos2_in_changed(client_id, packet_id, True)

    def delete_qos2_in(self, client_id: str, packet_id: int) -> None:
        self._delete("qos2_in", session_prefix(client_id) + _U16.pack(packet_id))
        self._changed()
        if self._tap is not None:
            self._tap.qos2_in_changed(client_id, packet_id, False)

    def put_will(self, client_id: str, will: Will, due_at: float | None) -> None:
        self._put("wills", client_id.encode("utf-8"), records.encode_will, will, due_at)
        self._changed()
        if self._tap is not None:
            self._tap.will_changed(client_id, will, due_at)

    def delete_will(self, client_id: str) -> None:
        self._delete("wills", client_id.encode("utf-8"))
        self._changed()
        if self._tap is not None:
            self._tap.will_changed(client_id, None, None)

    def put_retained(self, msg: Message) -> None:
        self._put("retained", msg.topic.encode("utf-8"), records.encode_message, msg)
        self._changed()

    def delete_retained(self, topic: str) -> None:
        self._delete("retained", topic.encode("utf-8"))
        self._changed()

    def put_meta(self, key: str, value: object) -> None:
        self._put("meta", key.encode("utf-8"), records.encode_value, value)
        self._changed()

    def delete_meta(self, key: str) -> None:
        self._delete("meta", key.encode("utf-8"))
        self._changed()

    # Delayed publish (`delayed.service`): its index, read a window at a time, never
    # loaded whole by `load`.

    def put_delayed(self, key: bytes, value: bytes) -> None:
        self._put("delayed", key, bytes, value)
        self._changed()

    def delete_delayed(self, key: bytes) -> None:
        self._delete("delayed", key)
        self._changed()

    def scan_delayed(self, start: bytes, limit: int) -> list[tuple[bytes, bytes]]:
        return self.scan_range("delayed", start, limit)

    def count_delayed(self) -> int:
        return self.count("delayed")


    def put_stream_record(self, key: bytes, value: bytes) -> None:
        """A stream message (`streams.store`): the key is its stream's prefix and its
        position, the value already encoded."""
        self._put("streams", key, bytes, value)
        self._changed()

    def delete_stream_range(self, start: bytes, end: bytes) -> None:
        """Stream records in [start, end): retention's cut, one range tombstone."""
        self._other_changes().delete_range("streams", start, end)
        self._changed()

    # Session replication (`replication.service`): the deliveries of a copy this node
    # holds of another member's session, keyed as the `queue` family's (client id \0
    # delivery seq), so a copy costs its replica the bytes the session costs its owner.

    def put_replica_delivery(self, client_id: str, seq: int, encoder: Callable[..., bytes], *args: Any) -> None:
        """A copy's delivery record, encoded by `encoder(*args)` when written."""
        self._put("replica", session_prefix(client_id) + pack_seq(seq), encoder, *args)
        self._changed()

    def delete_replica_deliveries(self, client_id: str, seqs: Iterable[int]) -> None:
        """A copy's delivery records: a run of consecutive seqs is one range tombstone
        (as the `queue` family's acknowledged runs are)."""
        prefix = session_prefix(client_id)
        ordered = sorted(seqs)
        i, n = 0, len(ordered)
        while i < n:
            j = i + 1
            while j < n and ordered[j] == ordered[i] + j - i:
                j += 1
            if j - i >= MIN_RANGE_RUN:
                self._other_changes().delete_range("replica", prefix + pack_seq(ordered[i]),
                                                   prefix + pack_seq(ordered[j - 1] + 1))
            else:
                for seq in ordered[i:j]:
                    self._delete("replica", prefix + pack_seq(seq))
            i = j
        self._changed()

    def delete_replica_copy(self, client_id: str) -> None:
        """Every delivery record of a copy (one range tombstone)."""
        self._delete_prefix("replica", session_prefix(client_id))
        self._changed()

    # -- start-up ---------------------------------------------------------------------------

    def load(self) -> RecoveredState:
        """Read everything back. An unreadable value is logged with its key and skipped."""
        state = RecoveredState()
        sessions = state.sessions

        def bad(cf: str, key: bytes, exc: Exception) -> None:
            state.skipped += 1
            log.error("session store: skipping unreadable %s record %r: %s", cf, key, exc)

        for key, value in self.scan("sessions"):
            try:
                meta = records.decode_session(value)
                cid = key.decode("utf-8")
            except (records.RecordError, UnicodeDecodeError) as exc:
                bad("sessions", key, exc)
                continue
            sessions[cid] = StoredSession(cid, **meta)

        def owner(cf: str, key: bytes) -> tuple[StoredSession, bytes] | None:
            try:
                cid, suffix = split_key(key)
            except UnicodeDecodeError as exc:
                bad(cf, key, exc)
                return None
            s = sessions.get(cid)
            if s is None:
                bad(cf, key, records.RecordError("no session record for it"))
                return None
            return s, suffix

        for key, value in self.scan("subscriptions"):
            found = owner("subscriptions", key)
            if found is None:
                continue
            try:
                found[0].subscriptions[found[1].decode("utf-8")] = records.decode_subscription(value)
            except (records.RecordError, UnicodeDecodeError) as exc:
                bad("subscriptions", key, exc)
        # Deliveries by session and sequence number: queued (state None) or inflight.
        deliveries: dict[str, dict[int, tuple[Delivery, str | None, int]]] = {}
        for key, value in self.scan("queue"):
            found = owner("queue", key)
            if found is None:
                continue
            try:
                seq = _seq(found[1])
                if records.is_delivery_record(value):
                    entry = records.decode_delivery_record(value, seq)
                else:  # format 1: always a queued delivery
                    d, _ = records.decode_delivery(value)
                    entry = (d, None, 0)
            except records.RecordError as exc:
                bad("queue", key, exc)
                continue
            deliveries.setdefault(found[0].client_id, {})[seq] = entry
        # Format-1 inflight records: read, then moved into the queue family as format 2
        # (in one batch with their deletion), so an acknowledgement removes them.
        for key, value in self.scan("inflight"):
            found = owner("inflight", key)
            if found is None:
                continue
            try:
                d, st, pid = records.decode_inflight(value)
            except records.RecordError as exc:
                bad("inflight", key, exc)
                continue
            deliveries.setdefault(found[0].client_id, {})[d.seq] = (d, st, pid)
            self._delete("inflight", key)
            self.put_inflight(found[0].client_id, pid, d, st)
        for cid, by_seq in deliveries.items():
            s = sessions[cid]
            for seq in sorted(by_seq):
                d, held_state, pid = by_seq[seq]
                if d.store_gen <= self._taken:  # its record is as read (format-1 inflight: being moved)
                    d.owner = cid
                    d.store_state = d.store_disk = delivery_state(held_state, pid)
                if held_state is None:
                    s.queue.append(d)
                else:
                    s.inflight.append((pid, d, held_state))
        for key, value in self.scan("qos2_in"):
            found = owner("qos2_in", key)
            if found is None:
                continue
            try:
                found[0].qos2_in.add(_U16.unpack(found[1])[0])
            except struct.error as exc:
                bad("qos2_in", key, exc)
        for key, value in self.scan("wills"):
            try:
                cid = key.decode("utf-8")
                will = records.decode_will(value)
            except (records.RecordError, UnicodeDecodeError) as exc:
                bad("wills", key, exc)
                continue
            if cid in sessions:
                sessions[cid].will = will
            else:
                bad("wills", key, records.RecordError("no session record for it"))
        for key, value in self.scan("retained"):
            try:
                state.retained.append(records.decode_message(value))
            except records.RecordError as exc:
                bad("retained", key, exc)
        for key, value in self.scan("meta"):
            try:
                state.meta[key.decode("utf-8")] = records.decode_value(value)
            except (records.RecordError, UnicodeDecodeError) as exc:
                bad("meta", key, exc)
        for key, value in self.scan("replica"):
            try:
                cid, suffix = split_key(key)
                state.replica.setdefault(cid, {})[_seq(suffix)] = value
            except (records.RecordError, UnicodeDecodeError) as exc:
                bad("replica", key, exc)
        return state


def _seq(suffix: bytes) -> int:
    if len(suffix) != 8:
        raise records.RecordError(f"bad delivery key suffix {suffix!r}")
    seq: int = _U64.unpack(suffix)[0]
    return seq


WRITEBACK_BATCHES = 256  # unsynced batches a MemoryDisk keeps before the oldest counts as written back


class MemoryDisk:
    """What a `MemoryStore` keeps "on disk", apart from the store object, so it outlives
    the process that wrote it (the cluster simulator restarts a node on it).

    It tells synced writes from unsynced ones, as a disk with an OS page cache does: a
    batch written with `sync=True` is durable together with every unsynced write before
    it (one fsync covers the whole log); one written with `sync=False` (durability `off`)
    is only in the cache until then.  `lose_unsynced` is the machine losing its power: the
    unsynced writes are gone.  A store opened on the disk again (`scan`) reads everything
    written, synced or not, as a restarted process reads the page cache."""

    def __init__(self) -> None:
        self.failure: OSError | None = None  # raised by every write while set (a full or failing disk)
        self.synced: dict[str, dict[bytes, bytes]] = {cf: {} for cf in COLUMN_FAMILIES}
        # Batches written without sync, in order: (prefix deletes, (cf, key, value or None)).
        self.unsynced: list[tuple[list[tuple[str, bytes]], list[tuple[str, bytes, bytes | None]]]] = []

    def write(self, prefix_deletes: list[tuple[str, bytes]], items: list[tuple[str, bytes, bytes | None]],
              *, sync: bool) -> None:
        if self.failure is not None:
            # A new exception each time: raising one object again would chain every
            # failed write's frames (and their batches) onto its traceback.
            raise type(self.failure)(*self.failure.args)
        self.unsynced.append((prefix_deletes, items))
        if sync:
            for deletes, puts in self.unsynced:
                _apply(self.synced, deletes, puts)
            self.unsynced.clear()
        elif len(self.unsynced) > WRITEBACK_BATCHES:
            # The OS writes its cache back by itself, sooner or later: the oldest goes.
            _apply(self.synced, *self.unsynced.pop(0))

    def lose_unsynced(self) -> int:
        """Drop what was never synced (a crash of the machine); how many batches that was."""
        lost = len(self.unsynced)
        self.unsynced.clear()
        return lost

    def read(self, cf: str) -> list[tuple[bytes, bytes]]:
        """A column family as a restarted process sees it: synced, then unsynced writes."""
        if not self.unsynced:
            return sorted(self.synced[cf].items())
        view = {cf: dict(self.synced[cf])}
        for deletes, puts in self.unsynced:
            _apply(view, [d for d in deletes if d[0] == cf], [p for p in puts if p[0] == cf])
        return sorted(view[cf].items())


def _apply(tables: dict[str, dict[bytes, bytes]], prefix_deletes: list[tuple[str, bytes]],
           items: list[tuple[str, bytes, bytes | None]]) -> None:
    for cf, prefix in prefix_deletes:
        table = tables[cf]
        for k in [k for k in table if k.startswith(prefix)]:
            del table[k]
    for cf, key, value in items:
        if value is None:
            tables[cf].pop(key, None)
        else:
            tables[cf][key] = value


class MemoryStore(SessionStore):
    """The same contract with no disk: for clean-only nodes, tests and the cluster
    simulator (which keeps the `MemoryDisk` across a node's kill and restart)."""

    def __init__(self, *, on_dirty: Callable[[], None] | None = None, disk: MemoryDisk | None = None) -> None:
        super().__init__(on_dirty=on_dirty)
        self.disk = disk if disk is not None else MemoryDisk()

    def write_batch(self, batch: PendingBatch, *, sync: bool) -> None:
        # Range deletes become the deletes of the keys they cover now (the disk knows prefixes only).
        covered = [(cf, key, None) for cf, start, end in batch.range_deletes
                   for key, _ in self.disk.read(cf) if start <= key < end]
        items: list[tuple[str, bytes, bytes | None]] = [*covered, *batch.items()]
        self.disk.write(list(batch.prefix_deletes), items, sync=sync)

    def scan(self, cf: str) -> Iterable[tuple[bytes, bytes]]:
        return self.disk.read(cf)

    def iter_range(self, cf: str, start: bytes, end: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        for key, value in self.disk.read(cf):
            if end is not None and key >= end:
                return
            if key >= start:
                yield key, value

    def close(self) -> None:
        self._batch = PendingBatch()
