"""The scheduler core: which delayed messages are due, from an index kept on disk.

Sans-I/O: the driver tells it what it read from the store (`loaded`), what it
recorded (`add`, `remove`, with the store's write epoch) and the time (`pop_due(now)`);
it answers with the due entries, the next due time and where to read next
(`wants_load`). It never reads a clock or the disk.

Memory: only a window of the index is in memory, never one task or timer per
message. Invariant: every pending entry whose key is below `horizon` is in the window
(`horizon` None: every pending entry is). Entries at or past the horizon are on disk,
except those whose write the store has not made durable yet (`_unwritten`); keys
removed but not yet durably deleted (`_removed`) are hidden from what is read back.
Both maps only live for the store's commit latency. When the window drops below half
its size the driver reads the next `window` entries from the horizon on (and again
while that leaves it below half: a page can hold only cancelled or fired entries whose
deletes are not written yet); when it grows
past twice its size (many new entries due soon) its later half is dropped and the
horizon moves down.
"""

from __future__ import annotations

import bisect
from typing import Iterable

from delayed.records import DelayedEntry

DEFAULT_WINDOW = 2048


def _after(key: bytes) -> bytes:
    """The smallest key above `key` (keys have one length)."""
    return key + b"\x00"


class Schedule:
    def __init__(self, window: int = DEFAULT_WINDOW, pending: int = 0) -> None:
        if window < 2:
            raise ValueError("window must be at least 2")
        self.window = window
        self.pending = pending  # every pending entry, on disk or not (counted at start)
        self._keys: list[bytes] = []  # the window, sorted
        self._entries: dict[bytes, DelayedEntry] = {}
        self.horizon: bytes | None = b""  # nothing loaded yet
        self._unwritten: dict[bytes, DelayedEntry] = {}
        self._removed: dict[bytes, int] = {}  # key -> write epoch of its delete
        # `add` and `remove` settle when the two maps reach this size (doubling, so a
        # store that lags costs amortized O(1) per call, not a scan each).
        self._settle_at = window

    # -- what the driver recorded ------------------------------------------------------------

    def add(self, entry: DelayedEntry, durable_epoch: int) -> None:
        """A new entry, recorded in the store at `entry.epoch`."""
        self.pending += 1
        key = entry.key
        self._removed.pop(key, None)
        if self.horizon is None or key < self.horizon:
            bisect.insort(self._keys, key)
            self._entries[key] = entry
            self._trim(durable_epoch)
        else:
            self._unwritten[key] = entry
            self._settle_if_large(durable_epoch)

    def remove(self, key: bytes, epoch: int, durable_epoch: int) -> None:
        """A pending entry's delete was recorded at `epoch` (cancelled)."""
        self.pending -= 1
        self._removed[key] = epoch
        self._unwritten.pop(key, None)
        if self._entries.pop(key, None) is not None:
            del self._keys[bisect.bisect_left(self._keys, key)]
        self._settle_if_large(durable_epoch)

    def _settle_if_large(self, durable_epoch: int) -> None:
        if len(self._unwritten) + len(self._removed) >= self._settle_at:
            self.settle(durable_epoch)
            self._settle_at = max(self.window, 2 * (len(self._unwritten) + len(self._removed)))

    def pop_due(self, now: float, limit: int) -> list[DelayedEntry]:
        """Up to `limit` entries due at `now`, oldest first, out of the window. The
        driver records their deletes, then calls `removed` with the epoch."""
        keys = self._keys
        n = 0
        while n < len(keys) and n < limit and self._entries[keys[n]].due <= now:
            n += 1
        due = [self._entries.pop(k) for k in keys[:n]]
        del keys[:n]
        self.pending -= n
        return due

    def removed(self, keys: Iterable[bytes], epoch: int) -> None:
        """The deletes of fired entries were recorded at `epoch`."""
        for key in keys:
            self._removed[key] = epoch

    # -- what the driver asks ----------------------------------------------------------------

    def next_due(self) -> float | None:
        """The due time of the first entry in the window (after `wants_load` is None,
        the first pending entry of all)."""
        return self._entries[self._keys[0]].due if self._keys else None

    def wants_load(self) -> bytes | None:
        """The key to read the next `window` entries from, when the window runs low and
        the disk holds more; else None."""
        if self.horizon is not None and len(self._keys) < self.window // 2:
            return self.horizon
        return None

    def loaded(self, rows: list[DelayedEntry], durable_epoch: int) -> None:
        """What the store held from `wants_load()` on, in key order, at most `window`
        rows, read while `durable_epoch` was the store's durable epoch."""
        start = self.horizon
        assert start is not None, "nothing was asked for"
        complete = len(rows) < self.window
        new_horizon = None if complete else _after(rows[-1].key)
        removed = self._removed
        for row in rows:
            if row.key not in removed and row.key not in self._entries:
                self._entries[row.key] = row
                self._keys.append(row.key)
        for key in [k for k in self._unwritten if k >= start and (new_horizon is None or k < new_horizon)]:
            if key not in self._entries:
                self._entries[key] = self._unwritten[key]
                self._keys.append(key)
            del self._unwritten[key]
        self._keys.sort()
        self.horizon = new_horizon
        self.settle(durable_epoch)
        self._trim(durable_epoch)

    def settle(self, durable_epoch: int) -> None:
        """Forget what the store now shows by itself."""
        if self._removed:
            self._removed = {k: e for k, e in self._removed.items() if e > durable_epoch}
        if self._unwritten:
            self._unwritten = {k: e for k, e in self._unwritten.items() if e.epoch > durable_epoch}

    def _trim(self, durable_epoch: int) -> None:
        keys = self._keys
        if len(keys) <= 2 * self.window:
            return
        cut = self.window
        for key in keys[cut:]:
            entry = self._entries.pop(key)
            if entry.epoch > durable_epoch:
                self._unwritten[key] = entry
        self.horizon = keys[cut]
        del keys[cut:]

    # -- reading without loading -------------------------------------------------------------

    def find(self, key: bytes) -> tuple[DelayedEntry | None, bool]:
        """(entry, True) when known here; (None, True) when known absent; (None, False)
        when only the disk can tell."""
        entry = self._entries.get(key) or self._unwritten.get(key)
        if entry is not None:
            return entry, True
        if key in self._removed or self.horizon is None or key < self.horizon:
            return None, True
        return None, False

    def visible(self, rows: list[DelayedEntry], start: bytes, limit: int) -> list[DelayedEntry]:
        """Pending entries from `start` on, at most `limit`: what the store returned
        (`rows`, from `start`, at least `limit + hidden()` of them when it has that
        many) with what it does not show yet."""
        removed = self._removed
        found = {row.key: row for row in rows if row.key not in removed}
        last = rows[-1].key if len(rows) >= limit + len(removed) and rows else None
        for source in (self._entries, self._unwritten):
            for key, entry in source.items():
                if key >= start and (last is None or key <= last):
                    found[key] = entry
        return [found[k] for k in sorted(found)[:limit]]

    def hidden(self) -> int:
        """How many stored rows may be hidden from a read (removed, delete not durable)."""
        return len(self._removed)

    def __len__(self) -> int:
        """Entries in memory (the window and the unwritten ones)."""
        return len(self._keys) + len(self._unwritten)
