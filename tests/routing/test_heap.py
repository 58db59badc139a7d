"""The heap leaves the cyclic collector's full passes while the route table grows and
comes back once it has been quiet (routing.heap)."""

from __future__ import annotations

import gc

from routing.heap import HeapFreeze


def test_a_growing_table_freezes_the_heap_and_a_quiet_one_thaws_it() -> None:
    assert gc.get_freeze_count() == 0
    heap = HeapFreeze(step=1_000, quiet=30.0)
    try:
        heap.size(999, now=0.0)
        assert not heap.frozen and gc.get_freeze_count() == 0  # less than a step: nothing
        kept = [[i] for i in range(100)]  # objects alive now: out of every pass once frozen
        heap.size(1_000, now=1.0)
        assert heap.frozen and gc.get_freeze_count() >= len(kept)
        heap.size(1_500, now=20.0)  # grew, but not by a step: quiet counts from the freeze
        heap.tick(now=30.0)
        assert heap.frozen
        heap.size(2_000, now=25.0)  # another step: frozen again, quiet counts from here
        heap.tick(now=50.0)
        assert heap.frozen
        heap.tick(now=55.0)
        assert not heap.frozen and gc.get_freeze_count() == 0
        heap.size(500, now=60.0)  # shrank (a member's routes went): growth counts from there
        heap.size(1_400, now=61.0)
        assert not heap.frozen
        heap.size(1_500, now=62.0)
        assert heap.frozen and heap.freezes == 3
    finally:
        gc.unfreeze()
