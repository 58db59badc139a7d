"""Keep a growing route table out of the cyclic garbage collector's full passes.

A full pass (the oldest generation) walks every object the process holds, and CPython
runs one whenever that generation has grown by a quarter. A node whose table grows to
a million routes (a preload, a pull, a member back with its 100,000) runs dozens of
them, each 0.2-0.8 s at that size (seconds on a loaded machine): one landed in
whatever step allocated next (a gossip push-pull's decode, on the simulator), the node
could not answer probes meanwhile and was declared dead, and the others then held and
later pulled its routes again (scripts/bench/route_convergence.py at a million routes).

So while the table grows, what the process holds is frozen (`gc.freeze`: out of every
pass, freed by reference counts as before) each time the table has grown by
`step` routes; once it has not grown for `quiet` seconds, it is thawed (`gc.unfreeze`):
frozen for good, cycles that connections and tasks alive meanwhile leave behind would
never be collected. Thawed, the table costs one full pass later, not one per quarter
of growth. gc's state is the process's: every caller in one process (the simulator's
nodes) shares it.
"""

from __future__ import annotations

import gc

FREEZE_STEP = 10_000  # routes of growth between two freezes
QUIET = 30.0  # seconds without growth before a thaw


class HeapFreeze:
    def __init__(self, *, step: int = FREEZE_STEP, quiet: float = QUIET) -> None:
        self.step = step
        self.quiet = quiet
        self._mark = 0  # the table's size at the last freeze (or thaw)
        self._grown_at: float | None = None  # when it last grew past a step, while frozen
        self.frozen = False
        self.freezes = 0

    def size(self, routes: int, now: float) -> None:
        """The table holds `routes` now: freeze if it grew by a step since the last."""
        if routes >= self._mark + self.step:
            gc.freeze()
            self.frozen = True
            self.freezes += 1
            self._mark = routes
            self._grown_at = now
        elif routes < self._mark:
            self._mark = routes  # shrank: growth counts from here

    def tick(self, now: float) -> None:
        """Thaw once the table has been quiet for `quiet` seconds."""
        if self.frozen and self._grown_at is not None and now - self._grown_at >= self.quiet:
            gc.unfreeze()
            self.frozen = False
            self._grown_at = None
