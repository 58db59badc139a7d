"""Time, injected: every component reads the time through a `Clock` it was given.

Two readings, one object:

- `now()`: monotonic seconds, on the same timeline as the driver's timers. Deadlines
  (keepalive, suspicion timeouts, commit windows, hold periods) are computed from it
  and handed to the driver, which sleeps until them.
- `wall()`: seconds since the Unix epoch, for what outlives the process or crosses
  machines: HLC timestamps, trace records, expiry kept on disk, `$SYS` uptimes.

Under Trio the node uses `TrioClock`, whose `now()` is `trio.current_time()`, so a
`trio.testing.MockClock` drives every timer of a whole node; give it `wall_epoch` and
the wall time follows the same virtual timeline. Sans-I/O cores and the discrete-event
simulators use `ManualClock`. Code outside Trio (CLIs, threads) uses `SystemClock`.

This package is a leaf: it imports nothing of the project. It and the drivers that
own I/O are the only places that read the system's clocks.
"""

from __future__ import annotations

import time
from typing import Protocol

import trio

__all__ = ["Clock", "SystemClock", "TrioClock", "ManualClock"]


class Clock(Protocol):
    def now(self) -> float:
        """Monotonic seconds (only differences mean anything)."""

    def wall(self) -> float:
        """Seconds since the Unix epoch."""


class SystemClock:
    """The operating system's clocks, for code that runs outside Trio."""

    def now(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()


class TrioClock:
    """Trio's clock for `now()`, so deadlines line up with `trio.sleep_until` and a
    `MockClock` drives them. `wall()` is the system's wall time, or, with
    `wall_epoch`, `wall_epoch + trio.current_time()` (virtual time from end to end)."""

    def __init__(self, wall_epoch: float | None = None) -> None:
        self._wall_epoch = wall_epoch

    def now(self) -> float:
        return trio.current_time()

    def wall(self) -> float:
        if self._wall_epoch is None:
            return time.time()
        return self._wall_epoch + self.now()


class ManualClock:
    """A clock that moves only when told: for sans-I/O tests and simulators."""

    def __init__(self, start: float = 0.0, wall_epoch: float = 1_700_000_000.0) -> None:
        self._now = start
        self._wall_epoch = wall_epoch

    def now(self) -> float:
        return self._now

    def wall(self) -> float:
        return self._wall_epoch + self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock does not go back")
        self._now += seconds

    def set(self, now: float) -> None:
        if now < self._now:
            raise ValueError("a clock does not go back")
        self._now = now
