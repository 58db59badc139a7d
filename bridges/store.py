"""Where the bridges' cache queues live: one RocksDB per node (`<data_dir>/bridges`),
raw keys `<bridge id>\\0<seq u64 BE>` (`bridges.queue.record_key`). The only module of
this package that touches RocksDB; `MemoryQueueStore` is the same interface in memory
(tests, the cluster simulator)."""

from __future__ import annotations

import os
from typing import Iterator, Protocol, Sequence

from rocksdict import Options, Rdict, WriteBatch, WriteOptions


class QueueStoreError(Exception):
    """The queue database cannot be opened (locked, corrupt, unreadable)."""


class QueueStore(Protocol):
    def write(self, ops: Sequence[tuple[bytes, bytes | None]], prefix_deletes: Sequence[bytes], *, sync: bool) -> None: ...
    def items(self) -> Iterator[tuple[bytes, bytes]]: ...
    def read(self, keys: Sequence[bytes]) -> list[bytes | None]: ...
    def close(self) -> None: ...


class RocksQueueStore:
    def __init__(self, path: str) -> None:
        self.path = path
        try:
            os.makedirs(path, exist_ok=True)
            opts = Options(raw_mode=True)
            opts.create_if_missing(True)
            self._db: Rdict | None = Rdict(path, options=opts)
        except Exception as exc:  # rocksdict raises plain Exception with RocksDB's message
            raise QueueStoreError(f"cannot open the bridge queues at {path}: {exc}") from None
        self._nosync = WriteOptions()  # synced by hand: `_sync_wal`
        self._dir_fd = os.open(path, os.O_RDONLY)
        self._wal_names: set[str] = set()

    def write(self, ops: Sequence[tuple[bytes, bytes | None]], prefix_deletes: Sequence[bytes], *, sync: bool) -> None:
        assert self._db is not None, "queue store is closed"
        wb = WriteBatch(raw_mode=True)
        for prefix in prefix_deletes:
            # Keys with this prefix sort in [prefix, prefix[:-1] + 0x01): the prefix ends in \0.
            wb.delete_range(prefix, prefix[:-1] + b"\x01")
        for key, value in ops:
            if value is None:
                wb.delete(key)
            else:
                wb.put(key, value)
        self._db.write(wb, self._nosync)
        if sync:
            self._sync_wal()

    def _sync_wal(self) -> None:
        """fdatasync the WAL files the write went to, by hand: rocksdict holds the GIL
        through a synced write, fsync included, which froze the node's event loop for the
        disk's latency at every commit (the session store does the same, session_store/rocks.py).
        Every live WAL is synced (usually one; a memtable switch leaves two for a while);
        a WAL that vanished was flushed to SST files, which RocksDB syncs itself."""
        assert self._db is not None
        names = {n for n in os.listdir(self.path) if n.endswith(".log") and n[:-4].isdigit()}
        if not names:  # not RocksDB's layout as expected: let it sync (holding the GIL)
            self._db.flush_wal(True)
            return
        for name in sorted(names):
            try:
                fd = os.open(os.path.join(self.path, name), os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                os.fdatasync(fd)
            finally:
                os.close(fd)
        if names - self._wal_names:
            os.fsync(self._dir_fd)  # a new WAL's directory entry
        self._wal_names = names

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        assert self._db is not None, "queue store is closed"
        yield from self._db.items()

    def read(self, keys: Sequence[bytes]) -> list[bytes | None]:
        assert self._db is not None, "queue store is closed"
        return [self._db.get(k) for k in keys]

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
            os.close(self._dir_fd)


class MemoryQueueStore:
    """The interface in memory: `synced` is what a kill -9 leaves (`crash()`)."""

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}
        self.synced: dict[bytes, bytes] = {}
        self.writes = 0

    def write(self, ops: Sequence[tuple[bytes, bytes | None]], prefix_deletes: Sequence[bytes], *, sync: bool) -> None:
        self.writes += 1
        for prefix in prefix_deletes:
            for key in [k for k in self.data if k.startswith(prefix)]:
                del self.data[key]
        for key, value in ops:
            if value is None:
                self.data.pop(key, None)
            else:
                self.data[key] = value
        if sync:
            self.synced = dict(self.data)

    def crash(self) -> None:
        self.data = dict(self.synced)

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        yield from sorted(self.data.items())

    def read(self, keys: Sequence[bytes]) -> list[bytes | None]:
        return [self.data.get(k) for k in keys]

    def close(self) -> None:
        pass
