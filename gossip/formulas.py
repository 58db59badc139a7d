"""The protocol's formulas as pure functions (memberlist util.go / suspicion.go)."""

from __future__ import annotations

import math


def suspicion_timeout(suspicion_mult: int, n: int, interval: float) -> float:
    """Minimum suspicion timeout: mult * max(1, log10 n) * interval (seconds).

    Grows with the log of the cluster size because gossip needs log(N) rounds to
    reach everyone, and the accused must hear of its suspicion to refute it.
    """
    node_scale = max(1.0, math.log10(max(1.0, float(n))))
    # memberlist keeps millisecond precision of the scale; so do we, to match its tables
    return suspicion_mult * math.floor(node_scale * 1000) * interval / 1000


def suspicion_age_cap(credit_mult: float, n: int, interval: float) -> float:
    """Most of a suspicion's age (seconds) a member may credit when it hears of it:
    credit_mult * max(1, log10 n) * interval, the time gossip takes to reach everyone
    (what the log factor of `suspicion_timeout` budgets)."""
    return credit_mult * suspicion_timeout(1, n, interval) if credit_mult > 0 else 0.0


def suspicion_bounds(suspicion_mult: int, max_mult: int, n: int, interval: float) -> tuple[float, float]:
    """(min, max) suspicion timeout: Lifeguard starts at max and shrinks towards min."""
    lo = suspicion_timeout(suspicion_mult, n, interval)
    return lo, max_mult * lo


def remaining_suspicion_time(n: int, k: int, elapsed: float, lo: float, hi: float) -> float:
    """Time left on a suspicion with n of k expected independent confirmations.

    Each confirmation shrinks the timeout logarithmically from hi towards lo
    (Lifeguard, "Dynamic Suspicion Timeouts"); may be negative when already overdue.
    """
    if k < 1:
        return lo - elapsed
    frac = math.log(n + 1.0) / math.log(k + 1.0)
    raw = hi - frac * (hi - lo)
    timeout = math.floor(1000.0 * raw) / 1000.0
    if timeout < lo:
        timeout = lo
    return timeout - elapsed


def retransmit_limit(retransmit_mult: int, n: int) -> int:
    """How many times one broadcast is sent: mult * ceil(log10(n + 1))."""
    node_scale = math.ceil(math.log10(n + 1))
    return retransmit_mult * int(node_scale)


def push_pull_scale(interval: float, n: int) -> float:
    """Push-pull interval, stretched above 32 members so total sync load stays flat."""
    threshold = 32
    if n <= threshold:
        return interval
    multiplier = math.ceil(math.log2(n) - math.log2(threshold)) + 1.0
    return interval * multiplier


def scale_timeout(timeout: float, health_score: int) -> float:
    """Lifeguard local health: an unhealthy node (score > 0) waits longer."""
    return timeout * (health_score + 1)


def sweep_size(sweep_mult: int, n: int) -> int:
    """Extra probes per interval during a sweep: mult * ceil(log10 n), at most n - 1.

    A side holding a fraction f of the members, each sweeping s others, leaves a far
    member unprobed with p ~ exp(-f * s) per round; log10 n keeps the expected number
    left over below one as the cluster grows (0 disables sweeps).
    """
    if sweep_mult <= 0 or n < 2:
        return 0
    return min(n - 1, sweep_mult * max(1, math.ceil(math.log10(n))))
