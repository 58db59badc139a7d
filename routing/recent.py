"""A bounded memory of recently seen keys, at O(1) per key.

Kept as two generations of dicts: keys go into the current one; when it holds `limit`
keys it becomes the previous one (the older previous one is dropped whole).  So the
last `limit` keys are always remembered (up to twice as many are), and no key is ever
evicted one at a time: evicting a dict's oldest key (`del d[next(iter(d))]`) scans the
deleted slots left at its front, which cost the receiver of a cross-node QoS 1 fan-in
about a fifth of its CPU (scripts/bench/RESULTS.md, "cross-node forward path").
"""

from __future__ import annotations

from typing import Generic, Hashable, TypeVar

K = TypeVar("K", bound=Hashable)


class RecentKeys(Generic[K]):
    __slots__ = ("limit", "_current", "_previous")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._current: dict[K, None] = {}
        self._previous: dict[K, None] = {}

    def __contains__(self, key: K) -> bool:
        return key in self._current or key in self._previous

    def __len__(self) -> int:
        """How many keys are remembered (between `limit` and twice that once full)."""
        return len(self._current) + len(self._previous)

    def add(self, key: K) -> None:
        current = self._current
        current[key] = None
        if len(current) >= self.limit:
            self._previous = current
            self._current = {}
