"""A wake-up call from a synchronous core to the one Trio task that drives it.

The core is built first and given `ring` as its callback (the store's `on_dirty`,
the broker's `on_timer_change`); the driver task, built later, waits for the ring.
Neither holds the other, and no attribute is set after construction.
"""

from __future__ import annotations

import trio


class Doorbell:
    def __init__(self) -> None:
        self._event = trio.Event()

    def ring(self) -> None:
        """Wake the waiter (now or at its next wait); many rings before it wakes are one."""
        self._event.set()

    def clear(self) -> None:
        """Forget earlier rings: the waiter has looked at the core since."""
        if self._event.is_set():
            self._event = trio.Event()

    async def wait(self) -> None:
        """Until rung (at once if rung since the last `clear`)."""
        await self._event.wait()
