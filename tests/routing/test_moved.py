"""What a node keeps of sessions that moved: which late forwards the old owner relays,
and its records survive a restart."""

from __future__ import annotations

from mqtt import EMPTY_PROPERTIES
from routing.moved import Moved, TakenIn, marks_from_wire
from session_store.model import Message, SubscriptionOptions
from session_store.store import StoredSession


def msg(origin: str, msg_id: int) -> Message:
    return Message("t/1", b"x", 1, False, EMPTY_PROPERTIES, None, "pub", msg_id, origin)


def test_the_old_owner_relays_unless_the_taker_got_the_forward_after_the_senders_fence() -> None:
    moved = Moved("B", 100.0, StoredSession("dev"), {"P": 10, "B": 7})
    assert moved.taker_has(msg("P", 11), "P", ("A", "B"))  # after P's mark, sent to B too
    assert not moved.taker_has(msg("P", 10), "P", ("A", "B"))  # before the fence: maybe never at B
    assert not moved.taker_has(msg("P", 11), "P", ("A", "C"))  # not sent to B
    assert not moved.taker_has(msg("Q", 50), "Q", ("A", "B"))  # Q was not fenced
    assert moved.taker_has(msg("B", 8), "B", ())  # published at B, which had the session by then
    assert not moved.taker_has(msg("B", 7), "B", ())


def test_moved_and_taken_records_round_trip() -> None:
    subs = {"t/#": SubscriptionOptions(1, False, False, 0, None)}
    moved = Moved("B", 100.5, StoredSession("dev", expiry_interval=60, protocol_level=5, subscriptions=subs), {"P": 3})
    back = Moved.from_record("dev", moved.to_record())
    assert (back.taker, back.at, back.fenced) == ("B", 100.5, {"P": 3})
    assert (back.session.expiry_interval, back.session.protocol_level, back.session.subscriptions) == (60, 5, subs)
    taken = TakenIn("A", 7.0, {"P": 9})
    assert TakenIn.from_record(taken.to_record()) == taken
    fresh = TakenIn("A", 7.0, {"A": 4}, fresh=True)
    assert TakenIn.from_record(fresh.to_record()) == fresh
    assert TakenIn.from_record({"g": "A", "a": 7.0, "m": {}}).fresh is False  # a record of an earlier version
    stale = TakenIn("A", 7.0, {}, fresh=True, stale={"C", "B"})
    assert stale.to_record()["s"] == ["B", "C"]
    assert TakenIn.from_record(stale.to_record()) == stale
    assert "s" not in fresh.to_record()  # none: the record an earlier version wrote
    assert TakenIn.from_record({"g": "A", "a": 7.0, "m": {}, "n": True}).stale == set()


def test_what_the_giver_published_while_it_held_its_copy_is_its_own_to_deliver() -> None:
    # A fallback: no word yet on the giver's copy, so it holds it still.
    taken = TakenIn("A", 7.0, fresh=True)
    assert taken.giver_kept(msg("A", 50), "A")
    assert not taken.giver_kept(msg("P", 50), "P")  # another member's: not the giver's copy
    assert not taken.giver_kept(msg("P", 50), "A")  # relayed by the giver, published elsewhere
    # Its mark (the handoff's commit, or the push of its copy): later ones are this node's.
    taken.marks["A"] = 40
    assert taken.giver_kept(msg("A", 40), "A") and not taken.giver_kept(msg("A", 41), "A")
    # A copy was here already: a held message may have been meant for it.
    assert not TakenIn("A", 7.0).giver_kept(msg("A", 50), "A")
    assert marks_from_wire({"P": 1, "Q": "x"}) == {"P": 1} and marks_from_wire(None) == {}
