"""The leaf package clock/: the Clock implementations and the HLC's wire form."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from clock import ManualClock, TrioClock
from clock.hlc import HlcTimestamp, HybridLogicalClock


def test_manual_clock_moves_only_when_told_and_never_back() -> None:
    c = ManualClock(start=5.0, wall_epoch=1000.0)
    assert (c.now(), c.wall()) == (5.0, 1005.0)
    c.advance(2.5)
    assert (c.now(), c.wall()) == (7.5, 1007.5)
    c.set(10.0)
    assert c.now() == 10.0
    with pytest.raises(ValueError):
        c.set(9.0)
    with pytest.raises(ValueError):
        c.advance(-1.0)


def test_trio_clock_follows_a_mock_clock_and_its_wall_epoch() -> None:
    seen: list[tuple[float, float]] = []

    async def main() -> None:
        c = TrioClock(wall_epoch=1_000.0)
        start = c.now()
        await trio.sleep_until(trio.current_time() + 30)
        seen.append((c.now() - start, c.wall() - 1_000.0 - c.now()))

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert seen == [(30.0, 0.0)]


def test_hlc_timestamp_wire_round_trip() -> None:
    hlc = HybridLogicalClock("n1")
    ts = hlc.now(1_700_000_000_000)
    assert HlcTimestamp.from_wire(ts.to_wire()) == ts
    assert HlcTimestamp.from_wire(tuple(ts.to_wire())) == ts


@pytest.mark.parametrize("data", [None, 7, "1.0@n", [1, 2], [1, 2, "n", 4], ["1", 2, "n"], [1, 2.0, "n"], [1, 2, 3]])
def test_hlc_timestamp_from_wire_refuses_bad_shapes(data: object) -> None:
    with pytest.raises(ValueError):
        HlcTimestamp.from_wire(data)
