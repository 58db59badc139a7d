"""The cache queue of one bridge: what waits for the target, in order, bounded.

Sans-I/O: the queue keeps the order and the bounds and says what to write; the bytes
go to disk through `QueueWrites` (the node's `bridges.committer.Committer`, one RocksDB
for every bridge, keys `<bridge id>\\0<seq u64 BE>`), and the time comes in as `now`
(wall seconds: an age outlives a restart).

- `append` puts a message at the tail; past `max_bytes` the oldest go first (counted
  `dropped["full"]`). A record is sendable once its write is durable
  (`Record.epoch <= durable_epoch`): what is sent is what a restart finds again.
- `expire` drops what is older than `max_age` (`dropped["expired"]`).
- `unsent` hands the sender the next records after its cursor; `ack` removes one the
  target took (`sent_total`), `refuse` one the target will never take
  (`dropped["refused"]`). Acknowledged records are deleted in a later batch, unsynced:
  a crash may resend a few (at least once), never lose one.
- Payloads stay in memory up to `hot_bytes`; past that a record keeps only its place
  and the sender reads it back (`cold_keys`, `warm`), so a long outage fills the disk,
  not the memory.
"""

from __future__ import annotations

import struct
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Iterable, Protocol

HOT_BYTES = 4 << 20
_HEADER = struct.Struct(">BdBH")  # format, queued at (wall s), qos | retain << 2, topic length
_FORMAT = 1


class QueueWrites(Protocol):
    """Where the queue's changes go (the node's committer)."""

    @property
    def write_epoch(self) -> int: ...
    def put(self, key: bytes, value: bytes) -> None: ...
    def delete(self, key: bytes) -> None: ...


@dataclass(slots=True)
class Record:
    seq: int
    topic: str
    payload: bytes | None  # None: on disk only (cold)
    qos: int
    retain: bool
    at: float  # wall seconds when queued
    size: int  # bytes counted against the bound
    epoch: int  # the committer epoch that makes it durable


def queue_prefix(bridge_id: str) -> bytes:
    return bridge_id.encode() + b"\x00"


def record_key(bridge_id: str, seq: int) -> bytes:
    return queue_prefix(bridge_id) + seq.to_bytes(8, "big")


def parse_record_key(key: bytes) -> tuple[str, int] | None:
    """(bridge id, seq) of a record key; None for anything else. The sequence number is
    the last 8 bytes (they may hold zero bytes: never split at the last \\0)."""
    if len(key) < 10 or key[-9] != 0:
        return None
    return key[:-9].decode(errors="replace"), int.from_bytes(key[-8:], "big")


def encode_record(topic: str, payload: bytes, qos: int, retain: bool, at: float) -> bytes:
    t = topic.encode()
    return _HEADER.pack(_FORMAT, at, qos | (retain << 2), len(t)) + t + payload


def decode_record(seq: int, data: bytes, epoch: int = 0) -> Record:
    """A stored record; ValueError when it is not one."""
    if len(data) < _HEADER.size:
        raise ValueError("record shorter than its header")
    fmt, at, flags, tlen = _HEADER.unpack_from(data)
    if fmt != _FORMAT:
        raise ValueError(f"unknown record format {fmt}")
    start = _HEADER.size
    topic = data[start:start + tlen].decode()
    payload = data[start + tlen:]
    return Record(seq, topic, payload, flags & 3, bool(flags & 4), at, len(data), epoch)


class CacheQueue:
    def __init__(self, bridge_id: str, *, max_bytes: int, max_age: float, writes: QueueWrites,
                 hot_bytes: int = HOT_BYTES) -> None:
        self.bridge_id = bridge_id
        self.max_bytes = max_bytes
        self.max_age = max_age
        self.hot_bytes = hot_bytes
        self._writes = writes
        self._records: OrderedDict[int, Record] = OrderedDict()
        self._next_seq = 1
        self.bytes = 0
        self.hot = 0  # bytes of payloads held in memory
        self.sent_total = 0
        self.dropped: Counter[str] = Counter()  # reason -> messages
        self.corrupt = 0

    # ------------------------------------------------------------------ state

    def __len__(self) -> int:
        return len(self._records)

    @property
    def dropped_total(self) -> int:
        return sum(self.dropped.values())

    def oldest_at(self) -> float | None:
        for record in self._records.values():
            return record.at
        return None

    def restore(self, items: Iterable[tuple[int, bytes]]) -> None:
        """What the disk held at start (in key order); records that do not decode are
        counted (`corrupt`) and deleted, never a crash."""
        for seq, data in items:
            try:
                record = decode_record(seq, data)
            except (ValueError, UnicodeDecodeError, struct.error):
                self.corrupt += 1
                self._writes.delete(record_key(self.bridge_id, seq))
                continue
            self._keep(record)
            self._next_seq = max(self._next_seq, seq + 1)

    # ------------------------------------------------------------------ changes

    def append(self, topic: str, payload: bytes, qos: int, retain: bool, now: float) -> int:
        """Queue one message (durable at the writes' `write_epoch` after this call);
        its sequence number. Drops the oldest while the bound is passed."""
        seq = self._next_seq
        self._next_seq += 1
        data = encode_record(topic, payload, qos, retain, now)
        self._writes.put(record_key(self.bridge_id, seq), data)
        self._keep(Record(seq, topic, payload, qos, retain, now, len(data), self._writes.write_epoch))
        while self.bytes > self.max_bytes and len(self._records) > 1:
            self._remove(next(iter(self._records)), "full")
        return seq

    def _keep(self, record: Record) -> None:
        if record.payload is not None:
            if self.hot + record.size > self.hot_bytes:
                record.payload = None
            else:
                self.hot += record.size
        self._records[record.seq] = record
        self.bytes += record.size

    def _remove(self, seq: int, dropped: str | None) -> bool:
        record = self._records.pop(seq, None)
        if record is None:
            return False
        self.bytes -= record.size
        if record.payload is not None:
            self.hot -= record.size
        self._writes.delete(record_key(self.bridge_id, seq))
        if dropped is None:
            self.sent_total += 1
        else:
            self.dropped[dropped] += 1
        return True

    def expire(self, now: float) -> int:
        """Drop what is older than `max_age`; how many."""
        dropped = 0
        while self._records:
            seq, record = next(iter(self._records.items()))
            if now - record.at < self.max_age:
                break
            self._remove(seq, "expired")
            dropped += 1
        return dropped

    def ack(self, seq: int) -> bool:
        """The target took record `seq` (False: it was dropped meanwhile)."""
        return self._remove(seq, None)

    def refuse(self, seq: int) -> bool:
        """The target will never take record `seq`: dropped, counted."""
        return self._remove(seq, "refused")

    def clear(self) -> None:
        """Forget everything (the bridge was deleted); the caller deletes the prefix."""
        self._records.clear()
        self.bytes = self.hot = 0

    # ------------------------------------------------------------------ sending

    def unsent(self, after: int, limit: int, durable_epoch: int) -> list[Record]:
        """Up to `limit` durable records after sequence number `after`, in order."""
        out: list[Record] = []
        for seq, record in self._records.items():
            if seq <= after:
                continue
            if record.epoch > durable_epoch or len(out) >= limit:
                break
            out.append(record)
        return out

    def first_seq(self) -> int | None:
        for seq in self._records:
            return seq
        return None

    def cold_keys(self, records: Iterable[Record]) -> list[bytes]:
        return [record_key(self.bridge_id, r.seq) for r in records if r.payload is None]

    def warm(self, records: Iterable[Record], values: Iterable[bytes | None]) -> None:
        """Payloads read back for cold `records` (in `cold_keys` order). The memory is
        held until each is acknowledged (a batch in flight)."""
        cold = [r for r in records if r.payload is None]
        for record, data in zip(cold, values):
            if data is None or record.seq not in self._records:
                continue
            record.payload = decode_record(record.seq, data).payload
            self.hot += record.size
