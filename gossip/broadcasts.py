"""Transmit-limited broadcast queue (memberlist queue.go, TransmitLimitedQueue).

Fewest transmits first, newest first among equals; a new broadcast with the same
key invalidates the queued one; each is dropped after ``limit`` transmissions.
"""

from __future__ import annotations

import heapq
from typing import Hashable


class _Item:
    __slots__ = ("key", "data", "transmits", "id")

    def __init__(self, key: Hashable, data: bytes, id_: int) -> None:
        self.key = key
        self.data = data
        self.transmits = 0
        self.id = id_


class TransmitLimitedQueue:
    """A heap ordered like memberlist's btree: (transmits, newest first).

    Replaced and dropped broadcasts stay in the heap as stale entries, skipped
    when popped (compacted when they pile up), so queueing and picking cost
    O(log n) per item instead of a sort of the whole queue per packet: during a
    netsplit of a large cluster the queue holds thousands of suspicions."""

    MAX_MISFITS = 16  # consecutive too-large items looked at before giving up on a packet

    def __init__(self) -> None:
        self._items: dict[Hashable, _Item] = {}
        self._heap: list[tuple[int, int, _Item]] = []
        self._next_id = 0

    def __len__(self) -> int:
        return len(self._items)

    def queue(self, key: Hashable, data: bytes) -> None:
        """Queue (or replace) the broadcast for ``key``."""
        self._next_id += 1
        it = _Item(key, data, self._next_id)
        self._items[key] = it
        heapq.heappush(self._heap, (0, -it.id, it))
        if len(self._heap) > 2 * len(self._items) + 64:
            self._heap = [(i.transmits, -i.id, i) for i in self._items.values()]
            heapq.heapify(self._heap)

    def transmits(self, key: Hashable) -> int | None:
        item = self._items.get(key)
        return None if item is None else item.transmits

    def __contains__(self, key: Hashable) -> bool:
        return key in self._items

    def get(self, overhead: int, limit: int, transmit_limit: int) -> list[bytes]:
        """Pick broadcasts that fit in ``limit`` bytes after ``overhead``; count them sent."""
        items = self._items
        if not items:
            return []
        room = limit - overhead
        out: list[bytes] = []
        if room <= 0:
            return out
        heap = self._heap
        pop, push = heapq.heappop, heapq.heappush
        put_back: list[tuple[int, int, _Item]] = []
        misfits = 0
        while heap and room >= 8 and misfits < self.MAX_MISFITS:
            entry = pop(heap)
            t, _, it = entry
            if items.get(it.key) is not it or it.transmits != t:
                continue  # replaced or already sent again: a stale entry
            size = len(it.data)
            if size > room:
                misfits += 1
                put_back.append(entry)
                continue
            misfits = 0
            room -= size
            out.append(it.data)
            it.transmits += 1
            if it.transmits >= transmit_limit:
                del items[it.key]
            else:
                put_back.append((it.transmits, -it.id, it))
        for entry in put_back:
            push(heap, entry)
        return out
