"""The broker's side of handoffs and conflicts: installing a handed-over session,
merging the tail and merging another node's copy (sans-I/O, in-memory store)."""

from __future__ import annotations

from mesh.broker import Broker
from mqtt import EMPTY_PROPERTIES
from session_store.model import Delivery, Message, SubscriptionOptions
from session_store.store import StoredSession


def msg(origin: str, i: int) -> Message:
    return Message("t/x", str(i).encode(), 1, False, EMPTY_PROPERTIES, None, "pub", i, origin)


def delivery(m: Message, seq: int) -> Delivery:
    d = Delivery(m, 1, False, ())
    d.seq = seq
    return d


def stored(queue: list[Delivery], subs: dict | None = None) -> StoredSession:
    return StoredSession(client_id="dev", expiry_interval=3600, protocol_level=5, next_seq=100,
                         subscriptions=subs if subs is not None else {"t/#": SubscriptionOptions(1)}, queue=queue)


def test_install_indexes_subscriptions_and_keeps_queue_order():
    b = Broker(node_id="B")
    session = b.install_session(stored([delivery(msg("C", 1), 5), delivery(msg("C", 2), 6)]), now=1000.0)
    assert [d.message.msg_id for d in session.queue] == [1, 2]
    assert b.subscriptions.match("t/x") == ["dev"]
    assert session.persistent and session.stored


def test_merge_adds_only_what_is_new_and_unions_subscriptions():
    b = Broker(node_id="B")
    session = b.install_session(stored([delivery(msg("C", 1), 5)]), now=1000.0)
    copy = stored([delivery(msg("C", 1), 7), delivery(msg("C", 2), 8)], {"t/#": SubscriptionOptions(1), "u/#": SubscriptionOptions(0)})
    assert b.merge_session(copy, now=1001.0) == 1
    assert [d.message.msg_id for d in session.queue] == [1, 2]
    assert set(session.subscriptions) == {"t/#", "u/#"}
    assert b.subscriptions.match("u/y") == ["dev"]


def test_a_remembered_session_does_not_get_back_what_it_was_given():
    b = Broker(node_id="B")
    session = b.install_session(stored([]), now=1000.0)
    b.remembered["dev"] = set()
    b.deliver(session, Delivery(msg("C", 1), 1, False, ()), now=1000.0)  # queued (offline): remembered
    b.dequeue(session)  # as if sent and acknowledged
    assert b.merge_session(stored([delivery(msg("C", 1), 3), delivery(msg("C", 9), 4)]), now=1001.0) == 1
    assert [d.message.msg_id for d in session.queue] == [9]


def test_merge_tail_orders_by_sequence_and_drops_direct_copies():
    b = Broker(node_id="B")
    session = b.install_session(stored([delivery(msg("C", 1), 5)]), now=1000.0)
    direct = [delivery(msg("C", 3), 2000), delivery(msg("B", 1), 2001)]
    for d in direct:
        session.queue.append(d)
    b.merge_handed_tail(session, add=[delivery(msg("C", 2), 6), delivery(msg("C", 3), 7)], drop=[direct[0]])
    assert [(d.message.origin, d.message.msg_id) for d in session.queue] == [("C", 1), ("C", 2), ("C", 3), ("B", 1)]


def test_a_clean_session_taken_over_elsewhere_ends_here():
    from mqtt import Connect, Subscription

    class Conn:
        protocol_level = 5
        session = None

        def close(self, reason=None):
            self.closed = reason

        def take_will(self):
            return None

    b = Broker(node_id="A")
    conn = Conn()
    session, _ = b.open_session(conn, Connect(client_id="c", clean_start=True, protocol_level=5), "c", 1000.0)
    b.subscribe(session, Subscription("k/#", 0), None, 1000.0)
    assert b.detach_for_handoff("c", 1001.0) is None
    assert conn.closed == 0x8E and "c" not in b.sessions and b.subscriptions.match("k/x") == []


def test_held_messages_merged_at_a_takeover_go_before_newer_ones_that_came_directly():
    """`ahead_of`: what reached the session since its install (direct forwards) and
    what members held for the dead owner join the queue in the order their origin
    nodes numbered them; one that came both ways is queued once."""
    b = Broker(node_id="B")
    session = b.install_session(stored([delivery(msg("C", 1), 5)]), now=1000.0)
    since = session.next_seq
    for i in (4, 6):  # direct, while the held ones were being fetched
        b.deliver(session, Delivery(msg("C", i), 1, False, ()), now=1000.5)
    held = stored([delivery(msg("C", i), 0) for i in (2, 3, 4, 5)])
    assert b.merge_session(held, now=1001.0, ahead_of=since) == 3
    assert [d.message.msg_id for d in session.queue] == [1, 2, 3, 4, 5, 6]
    assert [d.seq for d in session.queue] == sorted(d.seq for d in session.queue)


def test_a_fetch_after_a_takeover_that_brings_nothing_new_leaves_the_queue_as_it_is():
    """`ahead_of` re-sorts (and renumbers) what came since only when a message joins:
    the fetches for a minute after a takeover mostly find what the session has."""
    b = Broker(node_id="B")
    session = b.install_session(stored([delivery(msg("C", 1), 5)]), now=1000.0)
    since = session.next_seq
    for i in (2, 3):
        b.deliver(session, Delivery(msg("C", i), 1, False, ()), now=1000.5)
    before = [(d.message.msg_id, d.seq) for d in session.queue]
    assert b.merge_session(stored([delivery(msg("C", 2), 0)]), now=1001.0, ahead_of=since) == 0
    assert [(d.message.msg_id, d.seq) for d in session.queue] == before
