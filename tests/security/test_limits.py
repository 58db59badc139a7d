"""Token buckets, the per-key limiter and the memory guard (mesh/limits.py)."""

from __future__ import annotations

import math
import os

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from mesh.limits import MemoryGuard, PerKeyRateLimiter, TokenBucket, rate_limit_key_for_ip

# --- TokenBucket ------------------------------------------------------------------


def test_bucket_starts_full_and_empties_after_burst() -> None:
    bucket = TokenBucket(rate=1, burst=3)
    assert [bucket.take(0.0) for _ in range(4)] == [True, True, True, False]


def test_bucket_refills_at_rate() -> None:
    bucket = TokenBucket(rate=2, burst=2)
    assert bucket.take(10.0, 2)
    assert not bucket.take(10.0)
    assert not bucket.take(10.49)  # 0.98 tokens
    assert bucket.take(10.5)  # 1 token after half a second at 2/s
    assert not bucket.take(10.5)


def test_bucket_never_holds_more_than_burst() -> None:
    bucket = TokenBucket(rate=100, burst=5)
    bucket.take(0.0)
    assert bucket.tokens(1000.0) == 5
    assert [bucket.take(1000.0) for _ in range(6)].count(True) == 5


def test_refused_take_takes_nothing() -> None:
    bucket = TokenBucket(rate=1, burst=3)
    assert not bucket.take(0.0, 4)
    assert bucket.tokens(0.0) == 3


def test_delay_until_available_is_exact() -> None:
    bucket = TokenBucket(rate=4, burst=2)
    assert bucket.delay_until_available(0.0) == 0.0
    bucket.take(0.0, 2)
    assert bucket.delay_until_available(0.0) == pytest.approx(0.25)
    assert bucket.delay_until_available(0.0, 2) == pytest.approx(0.5)
    assert bucket.delay_until_available(0.1) == pytest.approx(0.15)
    assert bucket.take(0.25)


def test_delay_is_infinite_when_never_possible() -> None:
    assert TokenBucket(rate=1, burst=2).delay_until_available(0.0, 3) == math.inf
    stopped = TokenBucket(rate=0, burst=1)
    assert stopped.take(0.0)
    assert stopped.delay_until_available(1e9) == math.inf
    assert not stopped.take(1e9)


def test_clock_going_backwards_mints_nothing() -> None:
    bucket = TokenBucket(rate=1, burst=1)
    assert bucket.take(100.0)
    assert not bucket.take(50.0)  # earlier time: no refill
    assert not bucket.take(100.5)  # and "last" did not move back to 50
    assert bucket.take(101.0)


@pytest.mark.parametrize(
    ("rate", "burst"),
    [(-1, 1), (1, 0), (1, -1), (math.inf, 1), (1, math.inf), (math.nan, 1), (1, math.nan)],
)
def test_bucket_rejects_bad_parameters(rate: float, burst: float) -> None:
    with pytest.raises(ValueError):
        TokenBucket(rate, burst)


def test_negative_take_is_an_error() -> None:
    with pytest.raises(ValueError):
        TokenBucket(1, 1).take(0.0, -1)


ops = st.lists(
    st.tuples(st.floats(min_value=0, max_value=5, allow_nan=False), st.floats(min_value=0, max_value=4)),
    min_size=1,
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(
    rate=st.floats(min_value=0.01, max_value=100),
    burst=st.floats(min_value=0.5, max_value=20),
    steps=ops,
)
def test_bucket_never_exceeds_rate_times_window_plus_burst(rate: float, burst: float, steps: list[tuple[float, float]]) -> None:
    """Over every window [t_i, t_j] the tokens granted are at most burst + rate * (t_j - t_i)."""
    bucket = TokenBucket(rate, burst)
    now = 0.0
    granted: list[tuple[float, float]] = []
    for dt, n in steps:
        now += dt
        if bucket.take(now, n):
            granted.append((now, n))
    for i in range(len(granted)):
        total = 0.0
        for j in range(i, len(granted)):
            total += granted[j][1]
            window = granted[j][0] - granted[i][0]
            assert total <= burst + rate * window + 1e-9 * (1 + total)


@settings(max_examples=200, deadline=None)
@given(
    rate=st.floats(min_value=0.01, max_value=100),
    burst=st.floats(min_value=1, max_value=20),
    steps=ops,
)
@example(rate=1.0, burst=1.0, steps=[(0.0, 2.220446049250313e-16), (0.0, 1.0)])  # one ulp short of the burst
def test_waiting_the_advertised_delay_is_enough(rate: float, burst: float, steps: list[tuple[float, float]]) -> None:
    bucket = TokenBucket(rate, burst)
    now = 0.0
    for dt, n in steps:
        now += dt
        bucket.take(now, n)
        n = min(n, burst)
        delay = bucket.delay_until_available(now, n)
        assert delay >= 0
        if delay == 0:
            assert bucket.tokens(now) >= n
        else:
            # A little earlier is too early, where floats can tell (at 99 % of the delay
            # 1 % of the missing tokens are still missing: below rounding, refilling to
            # the burst can round up to it); at the delay (plus rounding) it succeeds.
            if delay * 0.01 * bucket.rate > 1e-12 * burst:
                assert bucket.tokens(now + delay * 0.99) < n
            later = now + delay * (1 + 1e-9) + 1e-9
            assert bucket.delay_until_available(later, n) == 0
            now = later


# --- PerKeyRateLimiter ------------------------------------------------------------


def test_keys_have_separate_buckets() -> None:
    limiter: PerKeyRateLimiter[str] = PerKeyRateLimiter(rate=1, burst=2)
    assert limiter.take("a", 0.0) and limiter.take("a", 0.0)
    assert not limiter.take("a", 0.0)
    assert limiter.take("b", 0.0)
    assert limiter.delay_until_available("a", 0.0) == pytest.approx(1.0)
    assert limiter.delay_until_available("b", 0.0) == 0.0


def test_delay_for_unknown_key_creates_nothing() -> None:
    limiter: PerKeyRateLimiter[str] = PerKeyRateLimiter(rate=1, burst=2)
    assert limiter.delay_until_available("x", 0.0) == 0.0
    assert limiter.delay_until_available("x", 0.0, 3) == math.inf
    assert len(limiter) == 0 and "x" not in limiter


def test_memory_is_bounded_lru() -> None:
    limiter: PerKeyRateLimiter[int] = PerKeyRateLimiter(rate=1, burst=1, max_keys=3)
    for key in range(3):
        limiter.take(key, 0.0)
    limiter.take(0, 0.0)  # touch 0: now 1 is the least recently used
    limiter.take(99, 0.0)
    assert len(limiter) == 3
    assert 1 not in limiter and 0 in limiter and 2 in limiter and 99 in limiter
    assert limiter.evictions == 1
    for key in range(1000, 2000):
        limiter.take(key, 0.0)
    assert len(limiter) == 3


def test_sweep_drops_only_refilled_buckets() -> None:
    limiter: PerKeyRateLimiter[str] = PerKeyRateLimiter(rate=1, burst=2)
    limiter.take("old", 0.0)  # refilled by t=1
    limiter.take("busy", 0.0, 2)  # refilled by t=2
    limiter.take("new", 0.9)
    assert limiter.sweep(1.5) == 1
    assert "old" not in limiter and "busy" in limiter and "new" in limiter
    # A swept key starts again with a full bucket: no information was lost.
    assert limiter.take("old", 1.5, 2)


def test_forget() -> None:
    limiter: PerKeyRateLimiter[str] = PerKeyRateLimiter(rate=1, burst=1)
    limiter.take("a", 0.0)
    limiter.forget("a")
    limiter.forget("never-seen")
    assert len(limiter) == 0


def test_limiter_validates_parameters() -> None:
    with pytest.raises(ValueError):
        PerKeyRateLimiter(rate=1, burst=1, max_keys=0)
    with pytest.raises(ValueError):
        PerKeyRateLimiter(rate=-1, burst=1)


@pytest.mark.parametrize(
    ("ip", "key"),
    [
        ("10.1.2.3", "10.1.2.3"),
        ("::ffff:10.1.2.3", "10.1.2.3"),
        ("2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"),
        ("2001:db8:1:2::99", "2001:db8:1:2::/64"),
        ("fe80::1%eth0", "fe80::/64"),
        ("not an ip", "not an ip"),
        ("", ""),
    ],
)
def test_rate_limit_key_for_ip(ip: str, key: str) -> None:
    assert rate_limit_key_for_ip(ip) == key


# --- MemoryGuard ------------------------------------------------------------------


def _statm(tmp_path, resident_pages: int) -> str:
    path = tmp_path / "statm"
    path.write_text(f"100000 {resident_pages} 500 10 0 2000 0\n")
    return str(path)


def test_memory_guard_reads_resident_pages(tmp_path) -> None:
    page = os.sysconf("SC_PAGE_SIZE")
    guard = MemoryGuard(1000 * page, statm_path=_statm(tmp_path, 1000))
    assert guard.available and guard.enabled
    assert guard.rss_bytes() == 1000 * page
    assert not guard.over_threshold()  # equal is not above
    (tmp_path / "statm").write_text(f"100000 1001 500 10 0 2000 0\n")
    assert guard.over_threshold()
    assert "MiB" in guard.describe()


def test_memory_guard_off_with_zero_or_none(tmp_path) -> None:
    for threshold in (0, None):
        guard = MemoryGuard(threshold, statm_path=_statm(tmp_path, 10**9))
        assert not guard.enabled
        assert not guard.over_threshold()


def test_memory_guard_without_proc(tmp_path) -> None:
    guard = MemoryGuard(1, statm_path=str(tmp_path / "missing"))
    assert not guard.available and not guard.enabled
    assert guard.rss_bytes() is None
    assert not guard.over_threshold()
    (tmp_path / "garbage").write_text("x")
    assert MemoryGuard(1, statm_path=str(tmp_path / "garbage")).rss_bytes() is None


def test_memory_guard_rejects_negative() -> None:
    with pytest.raises(ValueError):
        MemoryGuard(-1)


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs Linux /proc")
def test_memory_guard_on_this_process() -> None:
    guard = MemoryGuard(1)
    rss = guard.rss_bytes()
    assert rss is not None and rss > 2**20  # a Python process holds more than 1 MiB
    assert guard.over_threshold()
    assert not MemoryGuard(2**50).over_threshold()
