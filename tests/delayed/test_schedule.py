"""The scheduler core on its own: entries in, `now` in, due entries out, with the
index on a fake disk that tells written from unwritten changes, as the session store's
commits do."""

from __future__ import annotations

import bisect
import random

import pytest
from hypothesis import given, settings, strategies as st

from delayed.records import DelayedEntry, make_key
from delayed.schedule import Schedule
from mqtt import EMPTY_PROPERTIES
from session_store.model import Message


class FakeIndex:
    """The `delayed` column family with a commit: changes recorded at an epoch reach
    `disk` only at `commit()`."""

    def __init__(self) -> None:
        self.disk: dict[bytes, DelayedEntry] = {}
        self.pending: list[tuple[bytes, DelayedEntry | None]] = []
        self.write_epoch = 0
        self.durable_epoch = 0
        self._sorted: list[bytes] | None = None  # the disk's keys, sorted once per change

    def put(self, entry: DelayedEntry) -> int:
        self.pending.append((entry.key, entry))
        self.write_epoch += 1
        return self.write_epoch

    def delete(self, key: bytes) -> int:
        self.pending.append((key, None))
        self.write_epoch += 1
        return self.write_epoch

    def commit(self) -> None:
        for key, entry in self.pending:
            if entry is None:
                self.disk.pop(key, None)
            else:
                self.disk[key] = DelayedEntry(entry.key, entry.received_at, entry.message)
        self.pending.clear()
        self.durable_epoch = self.write_epoch
        self._sorted = None

    def read(self, start: bytes, limit: int) -> list[DelayedEntry]:
        if self._sorted is None or len(self._sorted) != len(self.disk):
            self._sorted = sorted(self.disk)
        keys = self._sorted
        i = bisect.bisect_left(keys, start)
        return [self.disk[k] for k in keys[i:i + limit]]


def entry(due: float, n: int) -> DelayedEntry:
    return DelayedEntry(make_key(due, n), due, Message(f"t/{n}", b"", 1, False, EMPTY_PROPERTIES, msg_id=n))


class Driver:
    """What `delayed.service` does around the core, on the fake index."""

    def __init__(self, index: FakeIndex, window: int) -> None:
        self.index = index
        self.schedule = Schedule(window, pending=len(index.disk))

    def add(self, e: DelayedEntry) -> None:
        e.epoch = self.index.put(e)
        self.schedule.add(e, self.index.durable_epoch)

    def cancel(self, key: bytes) -> bool:
        found, known = self.schedule.find(key)
        if not known:
            found = self.index.disk.get(key)
        if found is None:
            return False
        self.schedule.remove(key, self.index.delete(key), self.index.durable_epoch)
        return True

    def load(self) -> None:
        while (start := self.schedule.wants_load()) is not None:
            self.schedule.loaded(self.index.read(start, self.schedule.window), self.index.durable_epoch)

    def fire(self, now: float) -> list[DelayedEntry]:
        out: list[DelayedEntry] = []
        while True:
            self.load()
            due = self.schedule.pop_due(now, 7)
            for e in due:
                self.index.delete(e.key)
            self.schedule.removed([e.key for e in due], self.index.write_epoch)
            self.schedule.settle(self.index.durable_epoch)
            out += due
            if not due:
                return out


def test_due_entries_come_out_in_due_order_and_never_early():
    d = Driver(FakeIndex(), window=8)
    d.load()
    for n, due in enumerate([5.0, 1.0, 3.0, 3.0, 9.5]):
        d.add(entry(due, n))
    assert d.schedule.next_due() == 1.0
    assert d.fire(0.999) == []
    assert [e.message.msg_id for e in d.fire(3.0)] == [1, 2, 3]
    assert d.schedule.next_due() == 5.0
    assert [e.message.msg_id for e in d.fire(100.0)] == [0, 4]
    assert d.schedule.pending == 0
    assert d.schedule.next_due() is None


def test_a_million_pending_on_disk_cost_only_the_window():
    index = FakeIndex()
    rng = random.Random(7)
    for n in range(20_000):
        e = entry(rng.uniform(0, 1000), n)
        index.disk[e.key] = e
    d = Driver(index, window=64)
    assert d.schedule.pending == 20_000
    fired: list[DelayedEntry] = []
    for now in range(0, 1001, 10):
        fired += d.fire(float(now))
        index.commit()  # the committer keeps up
        assert len(d.schedule) <= 2 * 64
    assert len(fired) == 20_000 == len({e.key for e in fired})
    assert [e.key for e in fired] == sorted(e.key for e in fired)
    assert d.schedule.pending == 0


def test_many_new_entries_due_soon_push_the_later_half_of_the_window_out():
    index = FakeIndex()
    d = Driver(index, window=4)
    d.load()
    for n in range(50):
        d.add(entry(100.0 - n, n))
        assert len(d.schedule) <= 2 * 4 + len(index.pending)
    index.commit()
    d.schedule.settle(index.durable_epoch)
    assert len(d.schedule) <= 8
    fired = d.fire(1000.0)
    assert [e.due for e in fired] == sorted(100.0 - n for n in range(50))


def test_an_entry_not_yet_written_past_the_horizon_is_not_lost_by_a_load():
    index = FakeIndex()
    for n in range(10):
        e = entry(10.0 + n, n)
        index.disk[e.key] = e
    d = Driver(index, window=4)
    d.load()  # loads 4, horizon after the 4th
    late = entry(50.0, 99)
    d.add(late)  # past the horizon, its write not durable: the disk does not show it
    assert late.key not in index.disk
    fired = d.fire(1000.0)  # loads the rest before the commit
    assert fired[-1].key == late.key
    assert len(fired) == 11


def test_a_cancel_past_the_horizon_hides_the_entry_from_a_load_before_the_delete_is_written():
    index = FakeIndex()
    for n in range(10):
        e = entry(10.0 + n, n)
        index.disk[e.key] = e
    d = Driver(index, window=4)
    d.load()
    gone = entry(18.0, 8).key
    assert d.schedule.find(gone) == (None, False)  # only the disk knows
    assert d.cancel(gone)
    assert d.schedule.find(gone) == (None, True)
    fired = d.fire(1000.0)  # the delete is still unwritten when the rest is loaded
    assert gone not in [e.key for e in fired]
    assert len(fired) == 9
    assert d.schedule.pending == 0


def test_visible_lists_unwritten_entries_and_hides_removed_ones():
    index = FakeIndex()
    for n in range(6):
        e = entry(10.0 + n, n)
        index.disk[e.key] = e
    d = Driver(index, window=2)
    d.load()
    new = entry(12.5, 50)
    d.add(new)
    d.cancel(entry(13.0, 3).key)
    s = d.schedule
    rows = index.read(b"", 100 + s.hidden())
    listed = s.visible(rows, b"", 100)
    assert [e.message.msg_id for e in listed] == [0, 1, 2, 50, 4, 5]
    first_page = s.visible(index.read(b"", 2 + s.hidden()), b"", 2)
    assert [e.message.msg_id for e in first_page] == [0, 1]


@st.composite
def operations(draw: st.DrawFn) -> list[tuple[str, float]]:
    return draw(st.lists(st.tuples(st.sampled_from(["add", "add", "add", "cancel", "commit", "advance", "restart"]),
                                   st.floats(0, 60)), max_size=120))


@settings(max_examples=60, deadline=None)
@given(ops=operations(), window=st.integers(2, 6), seed=st.integers(0, 2**32))
def test_every_entry_fires_once_at_or_after_its_time_unless_cancelled(ops, window, seed):
    rng = random.Random(seed)
    index = FakeIndex()
    d = Driver(index, window)
    now = 0.0
    live: dict[bytes, float] = {}
    fired: list[DelayedEntry] = []
    # The most the store held unwritten since the schedule last surely settled (a fire
    # or a start does): entries it held as unwritten stay until its next settle, also
    # once a commit has written them.
    unwritten_peak = 0
    for n, (op, x) in enumerate(ops):
        unwritten_peak = max(unwritten_peak, len(index.pending))
        if op == "add":
            e = entry(now + x, n)
            d.add(e)
            live[e.key] = e.due
        elif op == "cancel" and live:
            key = rng.choice(sorted(live))
            assert d.cancel(key)
            del live[key]
        elif op == "commit":
            index.commit()
        elif op == "advance":
            now += x
            got = d.fire(now)
            unwritten_peak = 0
            for e in got:
                assert e.due <= now
                assert live.pop(e.key) == e.due
            fired += got
        elif op == "restart":
            index.commit()  # what was acknowledged is on disk
            d = Driver(index, window)
            unwritten_peak = 0
        unwritten_peak = max(unwritten_peak, len(index.pending))
        assert d.schedule.pending == len(live)
        # The window, what the store has not written yet, and what a settle would drop.
        assert len(d.schedule) <= 2 * window + 2 * max(window, unwritten_peak) + 1
    fired += d.fire(now + 1000)
    assert len({e.key for e in fired}) == len(fired)
    assert d.schedule.pending == 0


def test_window_must_hold_two():
    with pytest.raises(ValueError):
        Schedule(1)
