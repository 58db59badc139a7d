"""The replication stream of one session and the copy a replica builds from it (pure)."""

from __future__ import annotations

import pytest

from mqtt import EMPTY_PROPERTIES
from replication import changes
from replication.changes import ChangeError, ReplicaCopy, apply_changes, skip_change
from session_store.model import Delivery, InflightEntry, Message, Session, SubscriptionOptions
from session_store.store import NO_RECORD, delivery_state


def delivery(seq: int, qos: int = 1) -> Delivery:
    d = Delivery(Message(f"t/{seq}", f"m{seq}".encode(), qos, False, EMPTY_PROPERTIES, msg_id=seq, origin="n9"), qos,
                 False, ())
    d.seq = seq
    return d


def test_changes_in_order_build_the_session_and_a_takeover_gets_it_back() -> None:
    stream = [
        changes.meta_change(11, 3600, 5, 100.0, 1),
        changes.subscription_change(12, "t/#", SubscriptionOptions(1, no_local=True)),
        changes.delivery_change(13, delivery(1), delivery_state(None)),
        changes.delivery_change(14, delivery(2), delivery_state(None)),
        changes.delivery_change(15, delivery(3, qos=2), delivery_state(None)),
        changes.delivery_change(16, delivery(1), delivery_state("publish", 7)),  # sent with packet id 7
        changes.delivery_change(17, delivery(3, qos=2), delivery_state("pubrel", 9)),
        changes.qos2_change(18, 42, True),
        changes.delivery_change(19, delivery(2), NO_RECORD),  # acknowledged
        changes.noop_change(20),
    ]
    first = ReplicaCopy("c", "n0", seq=10)
    result = apply_changes(first, "c", "n0", None, stream)
    assert not result.resync and result.copy is not None
    stored = result.copy.stored_session()
    assert (stored.expiry_interval, stored.protocol_level, stored.disconnected_at) == (3600, 5, 100.0)
    assert stored.subscriptions == {"t/#": SubscriptionOptions(1, no_local=True)}
    assert [(pid, d.message.payload, state) for pid, d, state in stored.inflight] == [(7, b"m1", "publish"),
                                                                                      (9, b"m3", "pubrel")]
    assert stored.queue == [] and stored.qos2_in == {42}
    assert result.copy.seq == 20
    assert sorted(result.put) == [1, 3] and result.deleted == [2]


def test_a_gap_or_an_unknown_session_asks_for_a_snapshot_and_a_snapshot_starts_over() -> None:
    copy = ReplicaCopy("c", "n0", seq=5)
    assert apply_changes(copy, "c", "n0", None, [changes.qos2_change(7, 1, True)]).resync  # 6 is missing
    assert apply_changes(None, "c", "n0", None, [changes.qos2_change(1, 1, True)]).resync
    # Another owner's change for a copy held for n0: a snapshot is needed first.
    assert apply_changes(copy, "c", "n1", None, [changes.qos2_change(6, 1, True)]).resync
    session = Session("c", persistent=True, expiry_interval=60)
    session.subscriptions["a/b"] = SubscriptionOptions(2)
    session.inflight[3] = InflightEntry(delivery(8), "publish")
    session.queue.append(delivery(9))
    result = apply_changes(copy, "c", "n1", None, [changes.snapshot_change(30, session), changes.qos2_change(31, 5, True)])
    assert not result.resync and result.copy is not None and result.copy.owner == "n1" and result.copy.seq == 31
    stored = result.copy.stored_session()
    assert [pid for pid, _, _ in stored.inflight] == [3]
    # The queue head may have been sent by the dead owner without the replica knowing.
    assert [d.message.payload for d in stored.queue] == [b"m9"] and stored.queue[0].dup
    # Already in the snapshot: skipped, not a gap.
    assert not apply_changes(result.copy, "c", "n1", None, [changes.qos2_change(30, 6, True)]).resync


def test_the_end_of_a_session_removes_the_copy_and_bad_input_raises_change_error() -> None:
    copy = ReplicaCopy("c", "n0", seq=1, deliveries={4: [0, changes.delivery_change(0, delivery(4), 0)[4]]})
    result = apply_changes(copy, "c", "n0", None, [changes.end_change(2)])
    assert result.ended and result.copy is None and result.deleted == [4]
    with pytest.raises(changes.ChangeError):
        apply_changes(copy, "c", "n0", None, ["nonsense"])
    with pytest.raises(changes.ChangeError):
        apply_changes(ReplicaCopy("c", "n0", seq=1), "c", "n0", None, [[2, "?"]])


def test_the_header_round_trips() -> None:
    copy = ReplicaCopy("c", "n0", seq=9, stamp=[1, 2, "n0"], expiry=30, subscriptions={"x": [1, False, False, 0, None]},
                       qos2_in={3})
    again = ReplicaCopy.from_header("c", copy.header())
    assert again == copy


def test_a_skip_stands_for_no_ops_in_a_row_and_a_gap_before_it_asks_for_a_snapshot() -> None:
    copy = ReplicaCopy("c", "n0", seq=10)
    applied = apply_changes(copy, "c", "n0", None, [skip_change(11, 5), [16, "n"]])
    assert not applied.resync and applied.copy is not None and applied.copy.seq == 16 and applied.header
    # Partly in the snapshot the copy has: the rest moves the sequence on.
    applied = apply_changes(ReplicaCopy("c", "n0", seq=13), "c", "n0", None, [skip_change(11, 5)])
    assert not applied.resync and applied.copy is not None and applied.copy.seq == 15
    # Wholly in it: nothing changes.
    applied = apply_changes(ReplicaCopy("c", "n0", seq=20), "c", "n0", None, [skip_change(11, 5)])
    assert not applied.resync and applied.copy is not None and applied.copy.seq == 20 and not applied.header
    # A gap before it, another owner's copy, or no copy: a snapshot is asked for.
    assert apply_changes(ReplicaCopy("c", "n0", seq=9), "c", "n0", None, [skip_change(11, 5)]).resync
    assert apply_changes(ReplicaCopy("c", "n1", seq=10), "c", "n0", None, [skip_change(11, 5)]).resync
    assert apply_changes(None, "c", "n0", None, [skip_change(11, 5)]).resync
    with pytest.raises(ChangeError):
        apply_changes(ReplicaCopy("c", "n0", seq=10), "c", "n0", None, [[11, "N", 0]])


def test_the_will_travels_as_a_change_in_a_snapshot_and_in_the_header() -> None:
    from mqtt import Properties, Will
    from session_store import records

    will = Will("w/t", b"gone", 1, True, Properties(will_delay_interval=30))
    record = records.encode_will(will, 1234.5)
    copy = ReplicaCopy("c", "n0", seq=1)
    result = apply_changes(copy, "c", "n0", None, [changes.will_change(2, record)])
    assert result.copy is not None and result.header and result.copy.will == record
    assert result.copy.stored_session().will == (will, 1234.5)
    assert ReplicaCopy.from_header("c", result.copy.header()).will == record
    assert apply_changes(result.copy, "c", "n0", None, [changes.will_change(3, None)]).copy.will is None
    snapshot = changes.snapshot_change(9, Session("c", persistent=True), record)
    assert apply_changes(None, "c", "n1", None, [snapshot]).copy.stored_session().will == (will, 1234.5)
    with pytest.raises(changes.ChangeError):
        apply_changes(ReplicaCopy("c", "n0", seq=1), "c", "n0", None, [[2, "w", "not bytes"]])


def test_a_copy_keeps_the_keys_of_the_qos2_messages_its_session_was_given_lately() -> None:
    # A QoS 2 delivery completed at the owner: whether the replica had its record (4) or
    # it was gone before the replica heard of it (5: the gone change carries its key),
    # a takeover from the copy remembers it, so a late copy of it is not delivered again
    # (simulator seed 49 of 5 nodes, 20 clients, 60 s, 2 replicas, a crash).  QoS 1 ones
    # are not kept: a repeat of those goes with DUP.
    stream = [
        changes.delivery_change(1, delivery(4, qos=2), delivery_state(None)),
        changes.delivery_change(2, delivery(6, qos=1), delivery_state(None)),
        changes.delivery_change(3, delivery(4, qos=2), NO_RECORD),
        changes.delivery_change(4, delivery(5, qos=2), NO_RECORD),
        changes.delivery_change(5, delivery(6, qos=1), NO_RECORD),
    ]
    assert stream[3][4] == ["n9", 5] and stream[4][4] is None
    result = apply_changes(ReplicaCopy("c", "n0", seq=0), "c", "n0", None, stream)
    assert result.copy is not None and not result.copy.deliveries
    assert result.copy.stored_session().remembered == {("n9", 4), ("n9", 5)}
    # Bounded: the oldest go first.
    copy = result.copy
    more = [changes.delivery_change(6 + i, delivery(100 + i, qos=2), NO_RECORD) for i in range(changes.GIVEN_KEPT)]
    copy = apply_changes(copy, "c", "n0", None, more).copy
    assert copy is not None and len(copy.given) == changes.GIVEN_KEPT and ("n9", 4) not in copy.given
    # A snapshot from the same owner keeps them; one from another owner starts afresh.
    same = apply_changes(copy, "c", "n0", None, [changes.snapshot_change(6 + changes.GIVEN_KEPT, Session("c", True))]).copy
    assert same is not None and len(same.given) == changes.GIVEN_KEPT
    other = apply_changes(copy, "c", "n1", None, [changes.snapshot_change(1, Session("c", True))]).copy
    assert other is not None and not other.given


def test_the_given_keys_are_stored_compactly_and_read_back_in_order() -> None:
    # Kept on the replica's disk with the copy: per origin its first id, then differences.
    stream = [changes.delivery_change(1 + i, delivery(1_000_000 + 3 * i, qos=2), NO_RECORD) for i in range(4)]
    result = apply_changes(ReplicaCopy("c", "n0", seq=0), "c", "n0", None, stream)
    assert result.given and result.copy is not None
    given = dict(result.copy.given)
    given[(None, 7)] = None
    wire = changes.given_to_wire(given)
    assert wire == [["n9", 1_000_000, 3, 3, 3], [None, 7]]
    assert list(changes.given_from_wire(wire)) == list(given)
    # What does not parse is left out; more than GIVEN_KEPT keeps the newest.
    assert changes.given_from_wire([["n9", "x"], "junk", [3, 1], ["n1", 5, -1]]) == {("n1", 5): None, ("n1", 4): None}
    many = changes.given_from_wire([["n1", *range(1, changes.GIVEN_KEPT + 11)]])
    assert len(many) == changes.GIVEN_KEPT and ("n1", 1) not in many
    # A QoS 1 removal or a later state change does not rewrite them.
    quiet = apply_changes(result.copy, "c", "n0", None, [changes.delivery_change(5, delivery(9), NO_RECORD)])
    assert not quiet.given
