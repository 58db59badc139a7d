"""HLC ordering and LWW config registers: validation, merge order, convergence."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mesh.cluster_config import ClusterConfig, Register
from mesh.config import ConfigError
from clock.hlc import HlcTimestamp, HybridLogicalClock


def test_hlc_never_goes_backwards_and_follows_remote():
    c = HybridLogicalClock("a")
    t1 = c.now(1000)
    t2 = c.now(900)  # wall clock stepped back
    assert t2 > t1 and t2.wall_ms == 1000 and t2.logical == 1
    c.observe(HlcTimestamp(5000, 7, "b"), 1001)
    t3 = c.now(1002)
    assert t3 > HlcTimestamp(5000, 7, "b")
    assert (t3.wall_ms, t3.logical) == (5000, 9)


def test_set_validates_like_the_setting_itself():
    cfg = ClusterConfig("a")
    with pytest.raises(ConfigError, match="max_inflight"):
        cfg.set("max_inflight", "0", 1)
    with pytest.raises(ConfigError, match="not a cluster setting"):
        cfg.set("mqtt", "0.0.0.0:1", 1)
    assert cfg.set("max_inflight", "64", 1).value == 64
    assert cfg.set("retain_available", "false", 2).value is False


def test_concurrent_changes_converge_by_hlc_then_node():
    a, b = ClusterConfig("a"), ClusterConfig("b")
    ra = a.set("max_queued_messages", "10", 1000)
    rb = b.set("max_queued_messages", "20", 1000)  # same wall time: node id breaks the tie
    a.merge(rb, 1000)
    b.merge(ra, 1000)
    assert a.values() == b.values() == {"max_queued_messages": 20}


@given(st.permutations(list(range(6))))
def test_any_arrival_order_gives_the_same_winner(order):
    writers = [ClusterConfig(n) for n in "abc"]
    regs = [w.set("max_inflight", str(10 + i), 1000 + (i % 2)) for i, w in enumerate(writers * 2)]
    replica = ClusterConfig("r")
    for i in order:
        replica.merge(regs[i], 0)
    assert replica.get("max_inflight") == max(regs, key=lambda r: r.stamp)


def test_wire_round_trip_and_peer_values_are_validated():
    r = ClusterConfig("a").set("log_level", "debug", 5)
    assert Register.from_wire(r.to_wire()) == r
    with pytest.raises(ConfigError):
        Register.from_wire(["max_inflight", 0, [1, 0, "x"]])
