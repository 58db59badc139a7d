"""routing.recent.RecentKeys: the receiver's memory of forwarded message identities."""

from __future__ import annotations

from routing.recent import RecentKeys


def test_the_last_limit_keys_are_always_remembered() -> None:
    recent: RecentKeys[int] = RecentKeys(100)
    for i in range(1000):
        recent.add(i)
        # Every one of the last 100 keys, whatever the moment of the generation swap.
        assert all(k in recent for k in range(max(0, i - 99), i + 1))
        assert len(recent) <= 200


def test_older_keys_are_forgotten_and_memory_stays_bounded() -> None:
    recent: RecentKeys[tuple[str, int]] = RecentKeys(10)
    for i in range(25):
        recent.add(("A", i))
    assert ("A", 0) not in recent and ("A", 9) not in recent  # two generations ago
    assert ("A", 24) in recent and ("A", 10) in recent
    assert len(recent) == 15


def test_adding_a_key_again_keeps_it() -> None:
    recent: RecentKeys[str] = RecentKeys(3)
    recent.add("x")
    recent.add("x")
    assert "x" in recent and len(recent) == 1
