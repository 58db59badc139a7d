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
        self._sync = WriteOptions()
        self._sync.sync = True
        self._nosync = WriteOptions()

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
        self._db.write(wb, self._sync if sync else self._nosync)

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
