from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams import position as p


@given(st.lists(st.tuples(st.integers(0, (1 << 48) - 1), st.integers(0, (1 << 32) - 1),
                          st.from_regex(r"[A-Za-z0-9_.-]{1,12}", fullmatch=True)), min_size=2, max_size=20))
def test_string_order_is_stamp_order(stamps):
    encoded = [p.encode(*s) for s in stamps]
    assert sorted(encoded) == [p.encode(*s) for s in sorted(stamps)]
    for (wall, _, node), e in zip(stamps, encoded):
        assert p.is_position(e) and p.origin(e) == node and p.wall_ms(e) == wall


def test_clock_never_repeats_even_when_the_wall_goes_back():
    clock = p.PositionClock("n1")
    a = clock.next(1000)
    b = clock.next(1000)
    c = clock.next(900)  # wall clock stepped back
    assert a < b < c
    restarted = p.PositionClock("n1")
    restarted.observe(c)
    assert restarted.next(500) > c


def test_parse_start():
    assert p.parse_start("earliest") == p.EARLIEST
    pos = p.encode(1700000000000, 3, "n2")
    assert p.parse_start(pos) == pos
    bound = p.parse_start("2023-11-14T22:13:20Z")  # 1700000000 s
    assert p.encode(1699999999999, 99, "z") < bound < p.encode(1700000000000, 0, "a")
    assert p.parse_start("2023-11-14T23:13:20+01:00") == bound
    for bad in ("", "latest", "12-34", "2023-11-14T22:13:20", "2023-13-40T99:00:00Z", "018c2f3a4b5c-0000000-n1"):
        with pytest.raises(p.PositionError):
            p.parse_start(bad)
