"""Transmit-limited broadcast queue (memberlist queue.go, TransmitLimitedQueue).

Fewest transmits first, newest first among equals; a new broadcast with the same
key invalidates the queued one; each is dropped after ``limit`` transmissions.
"""

from __future__ import annotations

from typing import Hashable


class _Item:
    __slots__ = ("key", "data", "transmits", "id")

    def __init__(self, key: Hashable, data: bytes, id_: int) -> None:
        self.key = key
        self.data = data
        self.transmits = 0
        self.id = id_


def _order(it: _Item) -> tuple[int, int]:
    return (it.transmits, -it.id)


class TransmitLimitedQueue:
    def __init__(self) -> None:
        self._items: dict[Hashable, _Item] = {}
        self._next_id = 0

    def __len__(self) -> int:
        return len(self._items)

    def queue(self, key: Hashable, data: bytes) -> None:
        """Queue (or replace) the broadcast for ``key``."""
        self._next_id += 1
        self._items[key] = _Item(key, data, self._next_id)

    def transmits(self, key: Hashable) -> int | None:
        item = self._items.get(key)
        return None if item is None else item.transmits

    def __contains__(self, key: Hashable) -> bool:
        return key in self._items

    def get(self, overhead: int, limit: int, transmit_limit: int) -> list[bytes]:
        """Pick broadcasts that fit in ``limit`` bytes after ``overhead``; count them sent."""
        if not self._items:
            return []
        room = limit - overhead
        out: list[bytes] = []
        if room <= 0:
            return out
        if len(self._items) == 1:
            items = list(self._items.values())
        else:
            items = sorted(self._items.values(), key=_order)
        for it in items:
            size = len(it.data)
            if size > room:
                continue
            room -= size
            out.append(it.data)
            it.transmits += 1
            if it.transmits >= transmit_limit:
                del self._items[it.key]
            if room < 8:
                break
        return out
