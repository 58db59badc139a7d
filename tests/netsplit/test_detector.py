"""PartitionDetector: pure logic, time passed in."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from netsplit.detector import PartitionDetected, PartitionDetector, PartitionHealed

FIVE = ["n1", "n2", "n3", "n4"]  # plus ourselves, n0


def detector(window: float = 2.0, **kw: float) -> PartitionDetector:
    d = PartitionDetector("n0", window=window, **kw)
    for m in FIVE:
        assert d.member_changed(m, "alive", 0.0) == []
    return d


def feed(d: PartitionDetector, changes: list[tuple[str, str, float]]) -> list:
    out = []
    for member, state, now in changes:
        out += d.member_changed(member, state, now)
    return out


def test_three_two_split_seen_from_the_majority():
    d = detector()
    assert d.stable_view == frozenset({"n0", "n1", "n2", "n3", "n4"})
    out = feed(d, [("n3", "suspect", 10.0), ("n4", "suspect", 10.5), ("n3", "dead", 14.0)])
    assert out == []  # n4 is still only suspect
    (ev,) = d.member_changed("n4", "dead", 14.5)
    assert isinstance(ev, PartitionDetected)
    assert ev.remote == {"n3", "n4"} and ev.local == {"n0", "n1", "n2"}
    assert ev.majority is True and ev.onset == 10.0 and ev.at == 14.5
    assert ev.detection_s == pytest.approx(4.5)
    assert d.is_partitioned() and d.unreachable() == {"n3", "n4"}
    assert d.across_partition("n3") and not d.across_partition("n1")

    assert d.member_changed("n3", "alive", 30.0) == []  # half back: not healed yet
    assert not d.across_partition("n3") and d.across_partition("n4")
    (healed,) = d.member_changed("n4", "alive", 31.0)
    assert isinstance(healed, PartitionHealed)
    assert healed.partition_id == ev.partition_id and healed.missing == frozenset()
    assert healed.heal_s == pytest.approx(1.0) and healed.duration_s == pytest.approx(16.5)
    assert not d.is_partitioned() and d.unreachable() == frozenset()


def test_three_two_split_seen_from_the_minority():
    d = detector()
    out = feed(d, [("n1", "suspect", 10.0), ("n2", "suspect", 10.2), ("n4", "suspect", 10.9),
                   ("n1", "dead", 14.0), ("n2", "dead", 14.1), ("n4", "dead", 14.2)])
    (ev,) = out
    assert ev.local == {"n0", "n3"} and ev.remote == {"n1", "n2", "n4"} and ev.majority is False


def test_exact_half_goes_to_the_side_with_the_smallest_id():
    ours = PartitionDetector("a", window=1.0)
    theirs = PartitionDetector("c", window=1.0)
    for d, other in ((ours, ["b", "c", "d"]), (theirs, ["a", "b", "d"])):
        for m in other:
            d.member_changed(m, "alive", 0.0)
    (mine,) = feed(ours, [("c", "dead", 5.0), ("d", "dead", 5.1)]) + ours.tick(6.0)
    assert mine.local == {"a", "b"}
    (other,) = feed(theirs, [("a", "dead", 5.0), ("b", "dead", 5.1)]) + theirs.tick(6.0)
    assert other.local == {"c", "d"}
    assert mine.majority is True and other.majority is False


def test_detection_waits_for_the_window_and_fires_on_tick():
    d = detector(window=3.0)
    assert d.member_changed("n4", "dead", 10.0) == []
    assert d.next_deadline() == 13.0
    assert d.tick(12.9) == []
    (ev,) = d.tick(13.0)
    assert ev.remote == {"n4"} and ev.majority is True


def test_a_deadline_is_always_due_when_it_comes():
    # onset + window rounds below the onset plus the window measured back from it:
    # ticking at next_deadline() must still conclude (it once looped for ever)
    d = detector(window=4.0)
    onset = 7.275713864941367
    assert d.member_changed("n3", "dead", onset) == []
    at = d.next_deadline()
    assert at is not None and at - onset < 4.0
    (ev,) = d.tick(at)
    assert ev.remote == {"n3"} and d.next_deadline() != at


def test_refuted_suspicion_is_no_partition():
    d = detector()
    assert feed(d, [("n2", "suspect", 1.0), ("n2", "alive", 1.5)]) == []
    assert d.tick(10.0) == [] and not d.is_partitioned()
    assert d.next_deadline() is None


def test_graceful_leave_is_not_a_partition():
    d = detector()
    assert feed(d, [("n1", "left", 1.0), ("n2", "left", 1.1)]) == []
    assert d.tick(100.0) == [] and not d.is_partitioned()
    assert d.unreachable() == frozenset()
    assert d.stable_view == {"n0", "n3", "n4"}
    # a member that left while suspect drops out of the forming group as well
    assert feed(d, [("n3", "suspect", 200.0), ("n3", "left", 200.5)]) == []
    assert d.tick(300.0) == [] and not d.is_partitioned()


def test_members_lost_far_apart_are_separate_partitions():
    d = detector(window=2.0)
    (a,) = feed(d, [("n1", "dead", 10.0)]) + d.tick(12.0)
    (b,) = feed(d, [("n2", "dead", 30.0)]) + d.tick(32.0)
    assert a.remote == {"n1"} and b.remote == {"n2"} and a.partition_id != b.partition_id
    # the second one's stable view still counts n1 (lost, not gone)
    assert b.stable_view == {"n0", "n1", "n2", "n3", "n4"} and b.local == {"n0", "n3", "n4"}


def test_a_straggler_joins_the_partition_just_detected():
    d = detector(window=2.0)
    (ev,) = feed(d, [("n3", "dead", 10.0)]) + d.tick(12.0)
    assert feed(d, [("n4", "suspect", 12.5), ("n4", "dead", 13.0)]) == []
    assert d.active[ev.partition_id].remote == {"n3", "n4"}
    assert d.active[ev.partition_id].local == {"n0", "n1", "n2"}
    # once the join window has closed the partition is reported again, whole
    assert d.next_deadline() == 14.0
    (rev,) = d.tick(14.0)
    assert isinstance(rev, PartitionDetected) and rev.partition_id == ev.partition_id and rev.revision == 1
    assert rev.remote == {"n3", "n4"} and rev.local == {"n0", "n1", "n2"} and rev.majority
    assert d.tick(15.0) == [] and d.detected_total == 1


def test_a_revision_names_the_whole_other_side_and_the_minority():
    # the 3|2 split seen from n0 on the 2 side: concluded on n1 alone (majority, by
    # the view then), n2 and n3 lost just after; the revision corrects both
    d = detector(window=2.0)
    (first,) = feed(d, [("n1", "suspect", 10.0), ("n1", "dead", 11.0)]) + d.tick(12.0)
    assert first.remote == {"n1"} and first.majority
    feed(d, [("n2", "suspect", 12.5), ("n3", "suspect", 12.6), ("n2", "dead", 13.5)])
    assert d.tick(14.0) == []  # n3 is still only suspect: wait for it
    (rev,) = feed(d, [("n3", "dead", 14.5)])
    assert rev.partition_id == first.partition_id and rev.revision == 1
    assert rev.remote == {"n1", "n2", "n3"} and rev.local == {"n0", "n4"} and not rev.majority


def test_a_late_suspicion_refuted_is_taken_back_before_any_revision():
    d = detector(window=2.0)
    (first,) = feed(d, [("n1", "dead", 10.0)]) + d.tick(12.0)
    feed(d, [("n2", "suspect", 12.5), ("n2", "alive", 13.0)])
    assert d.tick(20.0) == [] and d.active[first.partition_id].local == {"n0", "n2", "n3", "n4"}
    assert not d.across_partition("n2")


def test_minority_follows_the_side_as_it_shrinks():
    d = detector(window=2.0)
    # one crash: a partition of one, the survivors hold the majority
    (ev,) = feed(d, [("n1", "dead", 10.0)]) + d.tick(12.0)
    assert d.is_partitioned() and ev.majority and not d.in_minority()
    # two stragglers join it: our side is now 2 of 5
    feed(d, [("n2", "dead", 12.5), ("n3", "dead", 13.0)])
    assert d.active[ev.partition_id].local == {"n0", "n4"} and d.in_minority()
    # a later, separate loss on a partition we already hold the majority of counts too
    e = detector(window=2.0)
    feed(e, [("n1", "dead", 10.0)]) + e.tick(12.0)
    (late,) = feed(e, [("n2", "dead", 30.0), ("n3", "dead", 30.5)]) + e.tick(33.0)
    assert not late.majority and e.in_minority()
    feed(e, [("n2", "alive", 40.0), ("n3", "alive", 40.1)])
    assert e.is_partitioned() and not e.in_minority()  # n1 is still gone: a crash


def test_partial_heal_after_grace_lists_the_missing():
    d = detector(window=1.0, heal_grace=5.0)
    feed(d, [("n3", "dead", 1.0), ("n4", "dead", 1.0)])
    (ev,) = d.tick(2.0)
    assert d.member_changed("n3", "alive", 10.0) == []
    assert d.next_deadline() == 15.0
    (healed,) = d.tick(15.0)
    assert healed.missing == {"n4"} and healed.remote == {"n3", "n4"}
    assert d.unreachable() == {"n4"}  # still dead, just no longer a partition


def test_give_up_after_forgets_a_partition_nobody_returned_from():
    d = detector(window=1.0, give_up_after=100.0)
    feed(d, [("n4", "dead", 1.0)])
    d.tick(2.0)
    assert d.next_deadline() == 102.0
    assert d.tick(102.0) == [] and not d.is_partitioned()
    assert d.expired_total == 1 and d.unreachable() == frozenset()


def test_bad_input():
    with pytest.raises(ValueError):
        PartitionDetector("n0", window=0)
    with pytest.raises(ValueError):
        detector().member_changed("n1", "zombie", 1.0)
    assert detector().member_changed("n0", "dead", 1.0) == []  # ourselves: ignored


# ---------------------------------------------------------------- properties

STATES = ["alive", "suspect", "dead", "left"]
changes = st.lists(
    st.tuples(st.sampled_from(FIVE), st.sampled_from(STATES), st.floats(0.0, 5.0)), max_size=40
)


@settings(max_examples=200, deadline=None)
@given(changes)
def test_invariants_under_any_sequence(steps):
    d = detector(window=2.0, heal_grace=10.0)
    now = 0.0
    open_ids: set[str] = set()
    for member, state, dt in steps:
        now += dt
        evs = d.member_changed(member, state, now) + d.tick(now)
        for ev in evs:
            if isinstance(ev, PartitionDetected):
                # a new partition, or a revision (late members) of an open one
                assert (ev.partition_id in open_ids) is (ev.revision > 0)
                open_ids.add(ev.partition_id)
                # the two sides never overlap and we are always on ours
                assert not (ev.local & ev.remote) and "n0" in ev.local
                # lost for good when concluded; a revision may find one suspect again
                lost = ("dead",) if ev.revision == 0 else ("dead", "suspect")
                assert ev.remote and all(d.states[m] in lost for m in ev.remote)
                assert ev.at >= ev.onset + d.window
            else:
                assert ev.partition_id in open_ids  # healed only what was detected
                open_ids.discard(ev.partition_id)
        assert set(d.active) == open_ids
        # a member that left is never unreachable nor across a partition
        for m in FIVE:
            if d.states.get(m) == "left":
                assert m not in d.unreachable() and not d.across_partition(m)
        dl = d.next_deadline()
        if dl is not None and dl <= now:
            # a deadline that is due must be settled by a tick at that time
            d.tick(now)
            assert d.next_deadline() is None or d.next_deadline() > now


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 4), st.floats(0.0, 1.9))
def test_any_cut_is_detected_once_and_heals_once(k, spread):
    d = detector(window=2.0)
    lost = FIVE[:k]
    out = []
    for i, m in enumerate(lost):
        out += d.member_changed(m, "suspect", 10.0 + spread * i / max(1, k - 1))
    for m in lost:
        out += d.member_changed(m, "dead", 15.0)
    (ev,) = out
    assert ev.remote == set(lost) and ev.majority == (k <= 2)
    back = []
    for m in lost:
        back += d.member_changed(m, "alive", 40.0)
    (healed,) = back
    assert healed.partition_id == ev.partition_id and not d.is_partitioned()


def test_lost_to_majority_only_on_the_majority_side_once_the_sides_are_settled():
    """What a replica asks before it sends a dead owner's will (issue 29): the member
    is lost and this node holds the majority, once the partition is concluded and its
    join window closed; never on the minority side, never while the member is back."""
    d = detector()
    assert not d.lost_to_majority("n3", 1.0)  # alive
    feed(d, [("n3", "suspect", 10.0), ("n3", "dead", 14.0)])
    assert d.is_partitioned()
    assert not d.lost_to_majority("n3", 14.0)  # within the join window: more may follow
    assert d.lost_to_majority("n3", 16.0)  # a crash of one: the four of us hold the majority
    assert not d.lost_to_majority("n1", 16.0)
    d.member_changed("n3", "alive", 20.0)
    assert not d.lost_to_majority("n3", 20.0)

    minority = detector()
    feed(minority, [("n1", "suspect", 10.0), ("n2", "suspect", 10.2), ("n4", "suspect", 10.9),
                    ("n1", "dead", 14.0), ("n2", "dead", 14.1), ("n4", "dead", 14.2)])
    assert minority.in_minority()
    assert not any(minority.lost_to_majority(m, 60.0) for m in ("n1", "n2", "n4"))
    # Members that answer now, counted against the last stable view (five).
    assert minority.holds_majority({"n3", "n1"}) and not minority.holds_majority({"n3"})

    opening = detector()
    feed(opening, [("n3", "suspect", 10.0), ("n3", "dead", 14.0), ("n4", "suspect", 30.0)])
    assert not opening.lost_to_majority("n3", 31.0)  # a new group is going: the sides may move
    opening.member_changed("n4", "alive", 31.5)
    assert opening.lost_to_majority("n3", 32.0)

    left = detector()
    left.member_changed("n2", "left", 5.0)
    assert left.lost_to_majority("n2", 5.0)
