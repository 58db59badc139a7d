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
packet id, or none) and, once per commit window, puts the object on a list of
changed deliveries; no key, record or tuple is built on the Trio thread.
`take_batch` compares each listed delivery's wanted state with the state its record
has (`store_disk`) and hands the writer only the differences: a delivery queued and
acknowledged within one window writes nothing, one acknowledged after it was
committed writes one tombstone, one queued, sent and acknowledged across windows
writes its record once (queued or inflight, whichever it was at the commit) and one
tombstone.  The broker passes the same `Delivery` object for every change to a
delivery (as it keeps it in the session), which is what makes this work.  Values are versioned (`session_store.records`):
binary format 2 for deliveries, CBOR format 1 for everything else; format-1
deliveries (queue and inflight families) are still read, and `load` rewrites
format-1 inflight records into the queue family.
"""

from __future__ import annotations

import functools
import logging
import struct
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from mesh.mqtt import Will
from session_store import records
from session_store.model import Delivery, Message, SubscriptionOptions

log = logging.getLogger("meshd.session_store")

SEP = b"\x00"
COLUMN_FAMILIES = ("sessions", "subscriptions", "inflight", "queue", "qos2_in", "retained", "wills", "meta")
SESSION_SCOPED = ("subscriptions", "inflight", "queue", "qos2_in")

_U64 = struct.Struct(">Q")
_U16 = struct.Struct(">H")
pack_seq = _U64.pack  # a delivery key's suffix


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


@dataclass
class RecoveredState:
    sessions: dict[str, StoredSession] = field(default_factory=dict)
    retained: list[Message] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    skipped: int = 0  # unreadable values, logged with their keys


Op = tuple[Callable[..., bytes], tuple]  # (encoder, args): the value, encoded at write time

NO_RECORD = -1  # a delivery's store state: no record (never stored, or deleted)


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

    __slots__ = ("ops", "puts", "deletes", "prefix_deletes")

    def __init__(self) -> None:
        self.ops: dict[tuple[str, bytes], Op | None] = {}
        self.puts: list[tuple[Delivery, int]] = []
        self.deletes: list[tuple[str, int]] = []
        self.prefix_deletes: list[tuple[str, bytes]] = []

    def put(self, cf: str, key: bytes, encoder: Callable[..., bytes], *args: Any) -> None:
        self.ops[(cf, key)] = (encoder, args)

    def delete(self, cf: str, key: bytes) -> None:
        self.ops[(cf, key)] = None

    def delete_prefix(self, cf: str, prefix: bytes) -> None:
        for k in [k for k in self.ops if k[0] == cf and k[1].startswith(prefix)]:
            del self.ops[k]
        self.prefix_deletes.append((cf, prefix))

    def __len__(self) -> int:
        return len(self.ops) + len(self.puts) + len(self.deletes) + len(self.prefix_deletes)

    def items(self) -> Iterable[tuple[str, bytes, bytes | None]]:
        """(cf, key, encoded value or None for a delete), prefix deletes excluded."""
        for (cf, key), op in self.ops.items():
            yield cf, key, None if op is None else op[0](*op[1])
        encode = records.encode_delivery_record
        for d, state in self.puts:
            yield "queue", session_prefix(d.owner) + pack_seq(d.seq), encode(d, state & 3, state >> 2)
        for client_id, seq in self.deletes:
            yield "queue", session_prefix(client_id) + pack_seq(seq), None


class SessionStore(ABC):
    """Record changes into a batch; commit batches off-thread; load everything at start."""

    def __init__(self) -> None:
        self.write_epoch = 0  # bumped by every recorded change
        self.durable_epoch = 0  # every change up to this epoch is committed
        self.on_dirty: Callable[[], None] = lambda: None
        self._batch = PendingBatch()
        # Deliveries changed in this commit window (each once: `store_gen` == `_gen`).
        self._changed_deliveries: list[Delivery] = []
        self._gen = 1

    # -- the backend -------------------------------------------------------------------------

    @abstractmethod
    def write_batch(self, batch: PendingBatch, *, sync: bool) -> None:
        """Encode and write a batch taken by `take_batch`. Blocking: call it from a
        worker thread."""

    @abstractmethod
    def scan(self, cf: str) -> Iterable[tuple[bytes, bytes]]:
        """Every (key, value) of a column family in key order (start-up only)."""

    @abstractmethod
    def close(self) -> None: ...

    def take_batch(self) -> tuple[PendingBatch, int]:
        """Hand over the current batch (and the epoch it reaches) and start a new one.

        The deliveries changed in the window become puts (their state now) and
        deletes, only where the store's record differs from what it should be."""
        batch, self._batch = self._batch, PendingBatch()
        changed, self._changed_deliveries = self._changed_deliveries, []
        self._gen += 1
        puts = batch.puts
        deletes = batch.deletes
        for d in changed:
            state = d.store_state
            if state != d.store_disk:
                d.store_disk = state
                if state < 0:
                    deletes.append((d.owner, d.seq))
                else:
                    puts.append((d, state))
        return batch, self.write_epoch

    def _put(self, cf: str, key: bytes, encoder: Callable[..., bytes], *args: Any) -> None:
        self._batch.put(cf, key, encoder, *args)

    def _delete(self, cf: str, key: bytes) -> None:
        self._batch.delete(cf, key)

    def _delete_prefix(self, cf: str, prefix: bytes) -> None:
        self._batch.delete_prefix(cf, prefix)

    def _changed(self) -> None:
        if self.write_epoch == self.durable_epoch:
            self.on_dirty()
        self.write_epoch += 1

    def has_pending(self) -> bool:
        return self.write_epoch > self.durable_epoch

    def mark_durable(self, epoch: int) -> None:
        if epoch > self.durable_epoch:
            self.durable_epoch = epoch

    # -- what the broker records -----------------------------------------------------------

    def put_session(self, client_id: str, expiry_interval: int, protocol_level: int, disconnected_at: float | None, next_seq: int) -> None:
        self._put("sessions", client_id.encode("utf-8"), records.encode_session, expiry_interval, protocol_level, disconnected_at, next_seq)
        self._changed()

    def delete_session(self, client_id: str) -> None:
        """Remove every record of one session."""
        self._delete("sessions", client_id.encode("utf-8"))
        self._delete("wills", client_id.encode("utf-8"))
        prefix = session_prefix(client_id)
        for cf in SESSION_SCOPED:
            self._delete_prefix(cf, prefix)
        # Its deliveries' pending changes go too (the range delete is applied first and
        # would not cover them); they have no record once it is written.
        kept: list[Delivery] = []
        for d in self._changed_deliveries:
            if d.owner == client_id:
                d.store_disk = NO_RECORD
                d.store_gen = 0
            else:
                kept.append(d)
        self._changed_deliveries = kept
        self._changed()

    def put_subscription(self, client_id: str, topic_filter: str, options: SubscriptionOptions) -> None:
        self._put("subscriptions", session_prefix(client_id) + topic_filter.encode("utf-8"), records.encode_subscription, options)
        self._changed()

    def delete_subscription(self, client_id: str, topic_filter: str) -> None:
        self._delete("subscriptions", session_prefix(client_id) + topic_filter.encode("utf-8"))
        self._changed()

    # The delivery calls run for every message to a persistent session: a few attribute
    # writes and, once per commit window, a list append (`_changed` inlined).

    def put_queued(self, client_id: str, delivery: Delivery) -> None:
        """Store a queued delivery (keyed by its sequence number)."""
        delivery.store_state = 0  # records.QUEUED
        if delivery.store_gen != self._gen:
            delivery.store_gen = self._gen
            delivery.owner = client_id
            self._changed_deliveries.append(delivery)
        if self.write_epoch == self.durable_epoch:
            self.on_dirty()
        self.write_epoch += 1

    def put_inflight(self, client_id: str, packet_id: int, delivery: Delivery, state: str) -> None:
        """Store a delivery sent with `packet_id` ('publish' or 'pubrel' sent): replaces
        its queued record, if it had one."""
        delivery.store_state = records.STATE_CODES[state] | packet_id << 2
        if delivery.store_gen != self._gen:
            delivery.store_gen = self._gen
            delivery.owner = client_id
            self._changed_deliveries.append(delivery)
        if self.write_epoch == self.durable_epoch:
            self.on_dirty()
        self.write_epoch += 1

    def delete_delivery(self, client_id: str, delivery: Delivery) -> None:
        """A queued or inflight delivery is done (acknowledged, dropped, expired) or
        leaves the queue for the inflight window (`put_inflight` follows)."""
        delivery.store_state = NO_RECORD
        if delivery.store_gen != self._gen:
            delivery.store_gen = self._gen
            delivery.owner = client_id
            self._changed_deliveries.append(delivery)
        if self.write_epoch == self.durable_epoch:
            self.on_dirty()
        self.write_epoch += 1

    @staticmethod
    def forget(delivery: Delivery) -> None:
        """The delivery has no record (its session's records were deleted while it
        stayed in memory): the next put writes it again."""
        delivery.store_disk = NO_RECORD

    def put_qos2_in(self, client_id: str, packet_id: int) -> None:
        self._put("qos2_in", session_prefix(client_id) + _U16.pack(packet_id), records.encode_value, 1)
        self._changed()

    def delete_qos2_in(self, client_id: str, packet_id: int) -> None:
        self._delete("qos2_in", session_prefix(client_id) + _U16.pack(packet_id))
        self._changed()

    def put_will(self, client_id: str, will: Will, due_at: float | None) -> None:
        self._put("wills", client_id.encode("utf-8"), records.encode_will, will, due_at)
        self._changed()

    def delete_will(self, client_id: str) -> None:
        self._delete("wills", client_id.encode("utf-8"))
        self._changed()

    def put_retained(self, msg: Message) -> None:
        self._put("retained", msg.topic.encode("utf-8"), records.encode_message, msg)
        self._changed()

    def delete_retained(self, topic: str) -> None:
        self._delete("retained", topic.encode("utf-8"))
        self._changed()

    def put_meta(self, key: str, value: Any) -> None:
        self._put("meta", key.encode("utf-8"), records.encode_value, value)
        self._changed()

    def delete_meta(self, key: str) -> None:
        self._delete("meta", key.encode("utf-8"))
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
                d, st, pid = by_seq[seq]
                if d.store_gen != self._gen:  # its record is as read (format-1 inflight: being moved)
                    d.owner = cid
                    d.store_state = d.store_disk = delivery_state(st, pid)
                if st is None:
                    s.queue.append(d)
                else:
                    s.inflight.append((pid, d, st))
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
        return state


def _seq(suffix: bytes) -> int:
    if len(suffix) != 8:
        raise records.RecordError(f"bad delivery key suffix {suffix!r}")
    return _U64.unpack(suffix)[0]


class MemoryStore(SessionStore):
    """The same contract with no disk: for clean-only nodes and tests."""

    def __init__(self) -> None:
        super().__init__()
        self._data: dict[str, dict[bytes, bytes]] = {cf: {} for cf in COLUMN_FAMILIES}

    def write_batch(self, batch: PendingBatch, *, sync: bool) -> None:
        for cf, prefix in batch.prefix_deletes:
            table = self._data[cf]
            for k in [k for k in table if k.startswith(prefix)]:
                del table[k]
        for cf, key, value in batch.items():
            if value is None:
                self._data[cf].pop(key, None)
            else:
                self._data[cf][key] = value

    def scan(self, cf: str) -> Iterable[tuple[bytes, bytes]]:
        return sorted(self._data[cf].items())

    def close(self) -> None:
        self._batch = PendingBatch()
