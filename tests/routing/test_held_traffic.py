"""Held traffic bookkeeping (sans-I/O)."""

from __future__ import annotations

from mqtt import EMPTY_PROPERTIES
from routing.held import HeldTraffic
from session_store.model import Message


def msg(i: int, topic: str = "a/b", expires_at: float | None = None) -> Message:
    return Message(topic, str(i).encode(), 1, False, EMPTY_PROPERTIES, expires_at, "p", i, "X")


def test_messages_are_bounded_oldest_first_and_replayed_in_order():
    h = HeldTraffic(hold_period=100, max_messages=3, max_age=50)
    h.hold("M", now=0)
    seqs = []
    for i in range(5):
        seq, dropped = h.add("M", msg(i), now=i)
        seqs.append(seq)
    assert h.dropped_full == 2
    replay = h.take("M")
    assert [m.msg_id for _, m in replay] == [2, 3, 4]
    assert [s for s, _ in replay] == seqs[2:]
    # Back: nothing is held any more, but its routes still route until its own are known.
    assert not h.is_held("M") and "M" in h.members
    assert h.settle("M")
    assert "M" not in h.members and not h.settle("M")


def test_lost_again_before_its_routes_came_back_keeps_the_held_routes():
    h = HeldTraffic(hold_period=100, max_messages=10, max_age=50)
    h.hold("M", now=0)
    h.take("M")
    h.hold("M", now=5)  # lost again before its own routes came back: held since the first time
    assert h.is_held("M") and h.members["M"].since == 0
    h.add("M", msg(1), now=6)
    assert [m.msg_id for _, m in h.take("M")] == [1]


def test_age_and_hold_period_expire():
    h = HeldTraffic(hold_period=100, max_messages=10, max_age=50)
    h.hold("M", now=0)
    h.add("M", msg(1), now=0)
    h.add("M", msg(2, expires_at=20), now=10)
    h.add("M", msg(3), now=40)
    gone, aged = h.expire(now=60)  # 1 is too old, 2 expired by its own expiry
    assert gone == [] and [s for _, s in aged] == [1, 2]
    gone, aged = h.expire(now=101)
    assert gone == ["M"] and [s for _, s in aged] == [3]
    assert "M" not in h.members


def test_restored_sequence_numbers_continue():
    h = HeldTraffic(hold_period=100, max_messages=10, max_age=50)
    h.hold("M", now=0)
    h.add("M", msg(1), now=0, seq=41)
    seq, _ = h.add("M", msg(2), now=0)
    assert seq == 42
