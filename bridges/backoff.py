"""Reconnect delays: exponential backoff with jitter, from an injected `random.Random`.

The n-th failure in a row waits `min(cap, base * 2**n)` scaled by a draw in
[0.5, 1.0) ("equal jitter"): nodes that lost the same target at the same moment do
not come back in step, and no wait is shorter than half its step."""

from __future__ import annotations

import random


class Backoff:
    def __init__(self, base: float, cap: float, rng: random.Random) -> None:
        self.base = base
        self.cap = cap
        self._rng = rng
        self.failures = 0

    def next_delay(self) -> float:
        step = min(self.cap, self.base * (2 ** min(self.failures, 32)))
        self.failures += 1
        return step * (0.5 + self._rng.random() / 2)

    def reset(self) -> None:
        self.failures = 0
