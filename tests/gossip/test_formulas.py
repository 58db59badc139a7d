"""Formula tables (memberlist util_test.go / suspicion_test.go) and the presets."""

from __future__ import annotations

import pytest

from gossip.config import LAN, WAN, preset
from gossip.formulas import (
    push_pull_scale,
    remaining_suspicion_time,
    retransmit_limit,
    scale_timeout,
    suspicion_age_cap,
    suspicion_bounds,
    suspicion_timeout,
)


@pytest.mark.parametrize(
    "n, expected",
    [(5, 1.0), (10, 1.0), (50, 1.698), (100, 2.0), (500, 2.698), (1000, 3.0)],
)
def test_suspicion_timeout_scales_with_log10_n(n: int, expected: float) -> None:
    assert suspicion_timeout(3, n, 1.0) / 3 == pytest.approx(expected)


@pytest.mark.parametrize(
    "mult, n, interval, expected",
    [(1.0, 4, 1.0, 1.0), (1.0, 100, 1.0, 2.0), (1.0, 1000, 1.0, 3.0), (0.5, 1000, 1.0, 1.5), (1.0, 100, 0.2, 0.4), (0.0, 1000, 1.0, 0.0)],
)
def test_suspicion_age_cap_is_one_dissemination_time(mult: float, n: int, interval: float, expected: float) -> None:
    assert suspicion_age_cap(mult, n, interval) == pytest.approx(expected)
    # never more than a quarter of the minimum timeout at the presets' multipliers
    assert suspicion_age_cap(mult, n, interval) <= suspicion_timeout(4, n, interval) * mult / 4 + 1e-9


def test_suspicion_bounds_lan_100_nodes() -> None:
    lo, hi = suspicion_bounds(LAN.suspicion_mult, LAN.suspicion_max_timeout_mult, 100, LAN.probe_interval)
    assert (lo, hi) == (8.0, 48.0)


@pytest.mark.parametrize(
    "n, k, elapsed, expected",
    [
        (0, 3, 0.0, 30.0),
        (1, 3, 2.0, 14.0),
        (2, 3, 3.0, 4.810),
        (3, 3, 4.0, -2.0),
        (4, 3, 5.0, -3.0),
        (5, 3, 10.0, -8.0),
    ],
)
def test_remaining_suspicion_time(n: int, k: int, elapsed: float, expected: float) -> None:
    assert remaining_suspicion_time(n, k, elapsed, 2.0, 30.0) == pytest.approx(expected)


def test_remaining_suspicion_time_without_confirmations_expected_is_min() -> None:
    assert remaining_suspicion_time(0, 0, 1.0, 2.0, 30.0) == pytest.approx(1.0)


@pytest.mark.parametrize("n, expected", [(0, 0), (1, 3), (9, 3), (10, 6), (99, 6), (100, 9), (1000, 12)])
def test_retransmit_limit(n: int, expected: int) -> None:
    assert retransmit_limit(3, n) == expected


@pytest.mark.parametrize("n, expected", [(1, 30.0), (32, 30.0), (33, 60.0), (64, 60.0), (65, 90.0), (1000, 180.0)])
def test_push_pull_scale(n: int, expected: float) -> None:
    assert push_pull_scale(30.0, n) == expected


def test_scale_timeout_by_health() -> None:
    assert [scale_timeout(1.0, s) for s in (0, 1, 7)] == [1.0, 2.0, 8.0]


def test_presets() -> None:
    assert (LAN.probe_interval, LAN.probe_timeout, LAN.gossip_interval, LAN.gossip_nodes) == (1.0, 0.5, 0.2, 3)
    assert (LAN.suspicion_mult, LAN.push_pull_interval, LAN.indirect_checks) == (4, 30.0, 3)
    assert WAN.probe_interval > LAN.probe_interval and WAN.suspicion_mult > LAN.suspicion_mult
    assert preset("wan") is WAN
    with pytest.raises(ValueError):
        preset("moon")
