"""The RocksDB session store (`rocksdict`, real RocksDB). The only module that touches it.

Layout: one RocksDB at `<data_dir>/sessions`, raw byte keys and values, one column
family per kind of record:

=============  =================================  =======================================
family         key                                value
=============  =================================  =======================================
sessions       client_id                          expiry interval, protocol level,
                                                  disconnected-at (wall clock), next seq
subscriptions  client_id \\0 filter                QoS, no local, retain as published,
                                                  retain handling, subscription id
queue          client_id \\0 seq (u64 BE)          every stored delivery, queued or
                                                  inflight (binary, format 2: message,
                                                  QoS, retain, subscription ids, state
                                                  queued / publish / pubrel, packet id);
                                                  key order = the session's stream order
inflight       client_id \\0 seq (u64 BE)          format 1 only (inflight deliveries
                                                  before format 2): read at start-up and
                                                  moved into `queue`
qos2_in        client_id \\0 packet id (u16 BE)    1 (PUBREC sent, PUBREL awaited)
wills          client_id                          the will and, when pending, its due time
retained       topic                              the message
meta           name                               any CBOR value (cluster config later)
replica        client_id \\0 seq (u64 BE)          a delivery of a copy this node holds of
                                                  another member's session (replication:
                                                  a format-2 record, as in `queue`)
delayed        due ms (u64 BE) + message id       a delayed message (`delayed.records`),
               (u64 BE)                           read a window at a time, never at start
streams        stream filter \\0 position          a stream message (`streams.store`)
=============  =================================  =======================================

Values other than format-2 deliveries are CBOR maps with `"v": 1`
(`session_store.records` has both formats).  Format-1 deliveries in `queue` (CBOR)
are still read, so a node upgraded in place keeps its sessions.

A session is removed with one range delete per session-scoped family
(`client_id\\0` .. `client_id\\1`); a run of at least `MIN_RANGE_RUN` consecutive
deliveries deleted in one batch (acknowledged in order) is one range tombstone.

Syncing: in `sync` and `batch` durability a batch is durable when `write_batch`
returns, in `off` it is only in the OS (which a killed process does not lose).  A
synced write does what `WriteOptions.sync` does, by hand: the batch goes into the WAL
unsynced, then the WAL files that can hold it are fdatasync'ed with `os.fdatasync`.
The reason is the GIL: rocksdict holds it through the whole write, fsync included, so a
synced write froze the event loop for the disk's latency (0.2-2 ms per commit), while
`os.fdatasync` lets the broker run meanwhile.  RocksDB writes each batch to its WAL
file (`<number>.log` in the DB directory, one live file plus older ones whose data is
not flushed yet) before `write` returns; a memtable switch starts a new WAL, so every
call lists the directory, syncs the newest WAL and, once, any WAL it had not synced
since it was superseded, and syncs the directory when a WAL appeared.  A WAL that
vanished was flushed to SST files, which RocksDB syncs itself.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Iterable, Iterator

from rocksdict import Options, Rdict, WriteBatch, WriteOptions

from session_store import records
from session_store.store import COLUMN_FAMILIES, MIN_RANGE_RUN, PendingBatch, SessionStore, pack_seq, session_prefix


class StoreOpenError(Exception):
    """The database cannot be opened (locked by another process, corrupt, unreadable)."""


# The `queue` family's memtable is kept small: its records live a few milliseconds
# (written, then range-deleted), and every write inserts into a skiplist that otherwise
# grows to 64 MB of mostly deleted entries, whose cache misses cost more than the
# flushes (which drop what the range tombstones cover): persist-batch 21.1 -> 20.3 us
# of CPU per message.  Flushing that family more often would leave every other
# family's few records pinning old WAL files, so the WAL is also capped: past
# `MAX_TOTAL_WAL` RocksDB flushes the families holding the oldest one.
QUEUE_WRITE_BUFFER = 4 << 20
MAX_TOTAL_WAL = 32 << 20


def _options(cf: str | None = None) -> Options:
    """Options of the DB (`cf` None) or of one column family."""
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.create_missing_column_families(True)
    if cf is None:
        opts.set_max_total_wal_size(MAX_TOTAL_WAL)
    elif cf == "queue":
        opts.set_write_buffer_size(QUEUE_WRITE_BUFFER)
    return opts



def _delete_runs(wb: WriteBatch, deleted: list[tuple[str, int]], handle: Any) -> None:
    """Tombstones for deleted deliveries, given as (client id, seq).  Acknowledgements
    come in order, so a batch usually deletes a run of consecutive sequence numbers of
    one session: that run becomes one range tombstone, which costs RocksDB half as much
    as the point tombstones.  Exact: every key the range covers is in the run."""
    deleted.sort()
    i, n = 0, len(deleted)
    while i < n:
        client_id, seq = deleted[i]
        j = i + 1
        while j < n and deleted[j] == (client_id, seq + j - i):
            j += 1
        prefix = session_prefix(client_id)
        end = seq + j - i
        if j - i >= MIN_RANGE_RUN and end < 1 << 64:
            wb.delete_range(prefix + pack_seq(seq), prefix + pack_seq(end), handle)
        else:
            for k in range(seq, end):
                wb.delete(prefix + pack_seq(k), handle)
        i = j


class RocksStore(SessionStore):
    def __init__(self, path: str | os.PathLike[str], *, on_dirty: Callable[[], None] | None = None) -> None:
        super().__init__(on_dirty=on_dirty)
        self.path = os.fspath(path)
        try:
            os.makedirs(self.path, exist_ok=True)
            self._db: Rdict | None = Rdict(
                self.path, options=_options(), column_families={cf: _options(cf) for cf in COLUMN_FAMILIES}
            )
        except Exception as exc:  # rocksdict raises plain Exception with RocksDB's message
            raise StoreOpenError(f"cannot open session store at {self.path}: {exc}") from None
        self._handles = {cf: self._db.get_column_family_handle(cf) for cf in COLUMN_FAMILIES}
        self._nosync = WriteOptions()  # synced by hand: `_sync_wal`
        self._wal_fds: dict[int, int] = {}  # WAL number -> fd, for live WAL files
        self._wal_newest = -1
        self._dir_fd = os.open(self.path, os.O_RDONLY)

    def write_batch(self, batch: PendingBatch, *, sync: bool) -> None:
        assert self._db is not None, "store is closed"
        if not len(batch):
            return
        handles = self._handles
        wb = WriteBatch(raw_mode=True)
        for cf, prefix in batch.prefix_deletes:
            # Keys with this prefix sort in [prefix, prefix[:-1] + 0x01): the prefix ends in \0.
            wb.delete_range(prefix, prefix[:-1] + b"\x01", handles[cf])
        for cf, start, end in batch.range_deletes:
            wb.delete_range(start, end, handles[cf])
        for (cf, key), op in batch.ops.items():
            if op is None:
                wb.delete(key, handles[cf])
            else:
                wb.put(key, op[0](*op[1]), handles[cf])
        queue = handles["queue"]
        encode = records.encode_delivery_record
        for d, state in zip(batch.put_deliveries, batch.put_states):
            wb.put(session_prefix(d.owner) + pack_seq(d.seq), encode(d, state & 3, state >> 2), queue)
        if batch.delete_seqs:
            _delete_runs(wb, list(zip(batch.delete_owners, batch.delete_seqs)), queue)
        self._db.write(wb, self._nosync)
        if sync:
            self._sync_wal()

    def _sync_wal(self) -> None:
        """fdatasync what `write` put in the WAL (see the module docstring)."""
        live = {int(name[:-4]): name for name in os.listdir(self.path) if name.endswith(".log") and name[:-4].isdigit()}
        if not live:  # not RocksDB's layout as expected: let it sync (holding the GIL)
            assert self._db is not None
            self._db.flush_wal(True)
            return
        fds = self._wal_fds
        for number in [n for n in fds if n not in live]:
            os.close(fds.pop(number))  # flushed to (synced) SST files and deleted
        newest = max(live)
        appeared = False
        for number in sorted(live):
            if number not in fds:
                try:
                    fds[number] = os.open(os.path.join(self.path, live[number]), os.O_RDONLY)
                except FileNotFoundError:  # flushed and deleted since the listing
                    continue
                appeared = True
            if self._wal_newest <= number < newest:
                # Superseded since the last call: it may hold writes of ours not synced yet.
                os.fdatasync(fds[number])
        if appeared:
            os.fsync(self._dir_fd)  # the new WAL's directory entry
        self._wal_newest = newest
        if newest in fds:
            os.fdatasync(fds[newest])

    def scan(self, cf: str) -> Iterable[tuple[bytes, bytes]]:
        assert self._db is not None, "store is closed"
        family = self._db.get_column_family(cf)
        try:
            yield from family.items()
        finally:
            del family

    def iter_range(self, cf: str, start: bytes, end: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        assert self._db is not None, "store is closed"
        it = self._db.get_column_family(cf).iter()
        it.seek(start)
        while it.valid():
            key = it.key()
            if end is not None and key >= end:
                return
            yield key, it.value()
            it.next()

    def count(self, cf: str) -> int:
        assert self._db is not None, "store is closed"
        return sum(1 for _ in self._db.get_column_family(cf).keys())

    def close(self) -> None:
        """Release the DB (and its lock) so the same path can be opened again."""
        if self._db is None:
            return
        self._handles.clear()
        self._db.close()
        self._db = None
        for fd in self._wal_fds.values():
            os.close(fd)
        self._wal_fds.clear()
        os.close(self._dir_fd)
