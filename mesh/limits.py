"""Rate limits and the memory guard: pure building blocks, time passed in.

- `TokenBucket`: `rate` tokens per second, at most `burst` saved up. Over any window
  of length t it grants at most `burst + rate * t` tokens (the property the tests
  check), which is what "per-client publish rate" and "new connections per second per
  IP" mean.
- `PerKeyRateLimiter`: one bucket per key (client id, IP address) with bounded memory,
  so a flood of new keys cannot grow the node without limit.
- `MemoryGuard`: this process's resident set size from `/proc/self/statm`, for the
  overload guard that refuses new connections (0x89) above a threshold.

Nothing here reads a clock: callers pass `now` (their `clock.Clock.now()`), so tests
are exact and a simulated node can use virtual time.
"""

from __future__ import annotations

import ipaddress
import math
import os
from collections import OrderedDict
from typing import Generic, Hashable, TypeVar

__all__ = [
    "TokenBucket",
    "PerKeyRateLimiter",
    "MemoryGuard",
    "rate_limit_key_for_ip",
]

K = TypeVar("K", bound=Hashable)


class TokenBucket:
    """`rate` tokens per second, holding at most `burst`; starts full.

    A clock that goes backwards (a caller mixing clocks) refills nothing and does not
    move the bucket's notion of "last seen" back, so it never mints extra tokens.
    """

    __slots__ = ("rate", "burst", "_tokens", "_last")

    def __init__(self, rate: float, burst: float) -> None:
        if not rate >= 0 or math.isinf(rate):
            raise ValueError(f"rate must be a finite number >= 0, got {rate!r}")
        if not burst > 0 or math.isinf(burst):
            raise ValueError(f"burst must be a finite number > 0, got {burst!r}")
        self.rate = float(rate)
        self.burst = float(burst)
        self._tokens = float(burst)
        self._last: float | None = None

    def _refill(self, now: float) -> None:
        last = self._last
        if last is None:
            self._last = now
            return
        if now > last:
            self._tokens = min(self.burst, self._tokens + (now - last) * self.rate)
            self._last = now

    def tokens(self, now: float) -> float:
        """Tokens available at `now`."""
        self._refill(now)
        return self._tokens

    def take(self, now: float, n: float = 1) -> bool:
        """Take `n` tokens if there are that many; False (and take nothing) otherwise."""
        if n < 0:
            raise ValueError(f"cannot take a negative number of tokens ({n!r})")
        self._refill(now)
        if self._tokens >= n:
            self._tokens -= n
            return True
        return False

    def delay_until_available(self, now: float, n: float = 1) -> float:
        """Seconds from `now` until `take(n)` would succeed: 0.0 if it would now.

        `math.inf` if it never can (`n` above the burst, or a rate of 0 and too few
        tokens left). Useful for back-pressure: sleep this long, then take.
        """
        self._refill(now)
        missing = n - self._tokens
        if missing <= 0:
            return 0.0
        if n > self.burst or self.rate == 0:
            return math.inf
        return missing / self.rate

    def is_full(self, now: float) -> bool:
        """True when the bucket is back at `burst`: forgetting it changes nothing."""
        return self.tokens(now) >= self.burst

    def __repr__(self) -> str:
        return f"TokenBucket(rate={self.rate}, burst={self.burst}, tokens={self._tokens:.3f})"


class PerKeyRateLimiter(Generic[K]):
    """A token bucket per key with bounded memory.

    At most `max_keys` buckets are kept, least recently used first out. Evicting a key
    hands it a fresh (full) bucket next time, so eviction favours the attacker only if
    the table is flooded; `sweep(now)` first drops buckets that have refilled, which
    carry no information, so a periodic sweep keeps the table small in normal running
    and LRU eviction only bites under a flood.
    """

    def __init__(self, rate: float, burst: float, max_keys: int = 10_000) -> None:
        if max_keys < 1:
            raise ValueError(f"max_keys must be >= 1, got {max_keys!r}")
        TokenBucket(rate, burst)  # validate once, with the same messages
        self.rate = float(rate)
        self.burst = float(burst)
        self.max_keys = max_keys
        self._buckets: OrderedDict[K, TokenBucket] = OrderedDict()
        self.evictions = 0

    def _bucket(self, key: K) -> TokenBucket:
        bucket = self._buckets.get(key)
        if bucket is not None:
            self._buckets.move_to_end(key)
            return bucket
        bucket = TokenBucket(self.rate, self.burst)
        self._buckets[key] = bucket
        if len(self._buckets) > self.max_keys:
            self._buckets.popitem(last=False)
            self.evictions += 1
        return bucket

    def take(self, key: K, now: float, n: float = 1) -> bool:
        """Take `n` tokens from `key`'s bucket; False if it has too few."""
        return self._bucket(key).take(now, n)

    def delay_until_available(self, key: K, now: float, n: float = 1) -> float:
        """Seconds until `key` could take `n` tokens (0.0 now); creates no bucket."""
        bucket = self._buckets.get(key)
        if bucket is None:
            return 0.0 if n <= self.burst else math.inf
        return bucket.delay_until_available(now, n)

    def forget(self, key: K) -> None:
        """Drop `key`'s bucket (e.g. the client disconnected)."""
        self._buckets.pop(key, None)

    def sweep(self, now: float) -> int:
        """Drop every bucket that has refilled to `burst`; returns how many went."""
        full = [key for key, bucket in self._buckets.items() if bucket.is_full(now)]
        for key in full:
            del self._buckets[key]
        return len(full)

    def __len__(self) -> int:
        return len(self._buckets)

    def __contains__(self, key: object) -> bool:
        return key in self._buckets


def rate_limit_key_for_ip(ip: str) -> str:
    """The key an address is rate limited under.

    IPv4-mapped IPv6 (`::ffff:10.0.0.1`) counts as the IPv4 address, and an IPv6 host
    by its /64, because one machine usually holds a whole /64 and could otherwise walk
    through fresh addresses. Anything unparsable is used as given.
    """
    try:
        addr = ipaddress.ip_address(ip.split("%", 1)[0])
    except ValueError:
        return ip
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.ipv4_mapped is not None:
            return str(addr.ipv4_mapped)
        return str(ipaddress.IPv6Network((addr, 64), strict=False))
    return str(addr)


class MemoryGuard:
    """Is this process's resident memory above `threshold_bytes`?

    Reads `/proc/self/statm` (second field: resident pages) on each call: about
    ten microseconds, cheap enough per new connection. A threshold of 0 or None disables
    the guard. Where the file cannot be read (not Linux) the guard reports not over,
    and `available` is False so the node can log once that it is off.
    """

    def __init__(self, threshold_bytes: int | None, statm_path: str = "/proc/self/statm") -> None:
        if threshold_bytes is not None and threshold_bytes < 0:
            raise ValueError(f"threshold_bytes must be >= 0, got {threshold_bytes!r}")
        self.threshold_bytes = threshold_bytes or 0
        self.statm_path = statm_path
        self.page_size = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        self.available = self.rss_bytes() is not None

    @property
    def enabled(self) -> bool:
        return self.threshold_bytes > 0 and self.available

    def rss_bytes(self) -> int | None:
        """Resident set size in bytes, or None if it cannot be read."""
        try:
            with open(self.statm_path, "rb") as f:
                fields = f.read().split()
            return int(fields[1]) * self.page_size
        except (OSError, IndexError, ValueError):
            return None

    def over_threshold(self) -> bool:
        """True when the guard is on and RSS is above the threshold."""
        if self.threshold_bytes <= 0:
            return False
        rss = self.rss_bytes()
        return rss is not None and rss > self.threshold_bytes

    def describe(self) -> str:
        """One line for the log when the guard refuses a connection."""
        rss = self.rss_bytes()
        rss_text = "unknown" if rss is None else f"{rss / 2**20:.1f} MiB"
        return f"resident memory {rss_text} above the limit of {self.threshold_bytes / 2**20:.1f} MiB"
