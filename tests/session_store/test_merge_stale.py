"""session_store.handoff.merge_stale: what a stale copy adds to a session handed over."""

from __future__ import annotations

from mqtt import EMPTY_PROPERTIES
from session_store.handoff import merge_stale
from session_store.model import Delivery, Message, Session
from session_store.store import StoredSession


def message(origin: str, msg_id: int) -> Message:
    return Message("t/1", b"x", 1, False, EMPTY_PROPERTIES, None, "p", msg_id, origin)


def stale_with(*msgs: Message) -> Session:
    stale = Session("s", persistent=True)
    for m in msgs:
        stale.enqueue(Delivery(m, 1, False, ()), 100)
    return stale


def test_the_stale_copy_adds_what_the_image_has_not() -> None:
    image = StoredSession("s", queue=[Delivery(message("A", 1), 1, False, ())])
    merged = merge_stale(image, stale_with(message("A", 1), message("A", 2)))
    assert [(d.message.origin, d.message.msg_id) for d in merged.queue] == [("A", 1), ("A", 2)]


def test_what_the_session_was_given_where_it_was_is_not_added_again() -> None:
    # Seed 5627 of 3 nodes, 6 clients, 15 s: given A/2 on the node it fell back onto,
    # the session came back here, and this node's stale copy held A/2 too.
    image = StoredSession("s", remembered={("A", 2)})
    merged = merge_stale(image, stale_with(message("A", 2), message("A", 3)))
    assert [(d.message.origin, d.message.msg_id) for d in merged.queue] == [("A", 3)]
