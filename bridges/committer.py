"""Group commit for the bridges' cache queues: every queue's changes go into one open
batch on the Trio thread; one task writes it off the thread, synced when it holds a
new record (a QoS >= 1 publisher's PUBACK waits for that), unsynced when it only
deletes (what was sent: a crash may resend it, never lose it).

`write_epoch` names the open batch; `await durable(epoch)` returns once the batch of
that epoch is on disk. Every commit rings the listeners (the senders: more records
are sendable).
"""

from __future__ import annotations

import logging
from typing import Awaitable, Callable

import trio

from bridges.store import QueueStore

log = logging.getLogger("meshd.bridges")

# How a blocking write runs: in a worker thread in a node, inline in the simulator.
WriteRunner = Callable[[Callable[[], None]], Awaitable[None]]


async def in_thread(fn: Callable[[], None]) -> None:
    await trio.to_thread.run_sync(fn)


class Committer:
    def __init__(self, store: QueueStore, *, run_write: WriteRunner = in_thread) -> None:
        self.store = store
        self._run_write = run_write
        self._ops: dict[bytes, bytes | None] = {}  # key -> value, None: delete (the last change wins)
        self._prefix_deletes: list[bytes] = []
        self._needs_sync = False
        self.write_epoch = 1  # the open batch
        self.durable_epoch = 0  # every batch up to this one is on disk
        self.commits = 0
        self.failed: str | None = None  # the last write error, until a write succeeds
        self._dirty = trio.Event()
        self._committed = trio.Event()
        self.listeners: list[Callable[[], None]] = []

    # ------------------------------------------------------------------ QueueWrites

    def put(self, key: bytes, value: bytes) -> None:
        self._ops[key] = value
        self._needs_sync = True
        self._dirty.set()

    def delete(self, key: bytes) -> None:
        self._ops[key] = None
        self._dirty.set()

    def delete_prefix(self, prefix: bytes) -> None:
        for key in [k for k in self._ops if k.startswith(prefix)]:
            del self._ops[key]
        self._prefix_deletes.append(prefix)
        self._dirty.set()

    # ------------------------------------------------------------------ durability

    async def durable(self, epoch: int) -> None:
        """Return once the batch of `epoch` (a `write_epoch` read earlier) is on disk."""
        while self.durable_epoch < epoch:
            await self._committed.wait()

    def has_pending(self) -> bool:
        return bool(self._ops or self._prefix_deletes)

    async def run(self) -> None:
        while True:
            await self._dirty.wait()
            self._dirty = trio.Event()
            while self.has_pending():
                # A batch once taken must reach the disk: shutdown must not cancel it midway.
                with trio.CancelScope(shield=True):
                    await self.commit_once()

    async def commit_once(self) -> None:
        ops, self._ops = list(self._ops.items()), {}
        prefixes, self._prefix_deletes = self._prefix_deletes, []
        sync, self._needs_sync = self._needs_sync, False
        epoch = self.write_epoch
        self.write_epoch += 1
        while True:
            try:
                await self._run_write(lambda: self.store.write(ops, prefixes, sync=sync))
                break
            except Exception as exc:  # a full or failing disk: keep the batch, say so, try again
                if self.failed is None:
                    log.error("bridge queue write failed (retrying every second): %s", exc)
                self.failed = str(exc)
                await trio.sleep(1.0)
        self.failed = None
        self.commits += 1
        self.durable_epoch = epoch
        self._committed.set()
        self._committed = trio.Event()
        for listener in self.listeners:
            listener()
