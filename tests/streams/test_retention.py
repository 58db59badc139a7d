from __future__ import annotations

from streams import position as p
from streams.retention import over_limits, plan_cut
from streams.spec import StreamSpec


def records(n: int, size: int = 10, start_ms: int = 0, step_ms: int = 1000) -> list[tuple[str, int]]:
    return [(p.encode(start_ms + i * step_ms, 0, "n"), size) for i in range(n)]


def test_count_bytes_and_age_cut_the_oldest_contiguous_run():
    recs = records(10)
    cut = plan_cut(StreamSpec("a", max_messages=7), recs, 10, 100, now_ms=0)
    assert (cut.messages, cut.bytes, cut.last, cut.kept) == (3, 30, recs[2][0], recs[3][0])
    cut = plan_cut(StreamSpec("a", max_bytes=45), recs, 10, 100, now_ms=0)
    assert cut.messages == 6 and cut.kept == recs[6][0]
    cut = plan_cut(StreamSpec("a", max_age_s=4.5), recs, 10, 100, now_ms=9000)
    assert cut.messages == 5 and cut.last == recs[4][0]  # older than 4.5 s: 0..4 s
    assert plan_cut(StreamSpec("a", max_messages=10), recs, 10, 100, now_ms=0) is None
    assert plan_cut(StreamSpec("a", max_messages=1), recs, 10, 100, now_ms=0, budget=4).messages == 4


def test_over_limits_from_counters():
    oldest = p.encode(1000, 0, "n")
    assert not over_limits(StreamSpec("a"), 10, 100, oldest, 10**9)
    assert over_limits(StreamSpec("a", max_messages=9), 10, 100, oldest, 0)
    assert over_limits(StreamSpec("a", max_bytes=99), 10, 100, oldest, 0)
    assert over_limits(StreamSpec("a", max_age_s=1), 10, 100, oldest, 2001)
    assert not over_limits(StreamSpec("a", max_age_s=1), 10, 100, oldest, 2000)
    assert not over_limits(StreamSpec("a", max_messages=1), 0, 0, "", 0)
