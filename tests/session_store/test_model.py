"""Session bookkeeping: the queue overflow policy, expiry. (Packet ids belong to the
connection: tests/mqtt/test_server.py.)"""

from __future__ import annotations

from session_store.model import NEVER_EXPIRES, Delivery, Message, Session


def delivery(qos: int, n: int) -> Delivery:
    return Delivery(Message(f"t/{n}", b"", qos, False, None), qos, False, ())


def test_overflow_drops_qos0_first_then_oldest():
    s = Session("c", persistent=True)
    assert s.enqueue(delivery(1, 1), 3) is None
    assert s.enqueue(delivery(0, 2), 3) is None
    assert s.enqueue(delivery(1, 3), 3) is None
    dropped = s.enqueue(delivery(1, 4), 3)
    assert dropped.message.topic == "t/2"  # the queued QoS 0 goes first
    dropped = s.enqueue(delivery(0, 5), 3)
    assert dropped.message.topic == "t/5"  # a new QoS 0 into a full queue is dropped
    dropped = s.enqueue(delivery(2, 6), 3)
    assert dropped.message.topic == "t/1"  # then the oldest
    assert [d.message.topic for d in s.queue] == ["t/3", "t/4", "t/6"]
    assert s.dropped == 3


def test_what_a_recovery_merged_is_outside_the_limit_which_counts_the_rest():
    """A recovery (a takeover's held messages) puts 5 into a queue of limit 3 that held
    1: none is dropped; 2 more arrivals fit (the limit counts them and the one queued
    before), a 3rd drops the oldest (a slow consumer); the room shrinks as the client
    takes from the head."""
    s = Session("c", persistent=True)
    assert s.enqueue(delivery(1, 0), 3) is None
    before = s.recovery_starts(5)
    assert all(s.enqueue(delivery(1, n), 3) is None for n in range(1, 6))
    s.recovery_ended(5, before)
    assert s.recovered == 5
    assert all(s.enqueue(delivery(1, n), 3) is None for n in range(6, 8))
    assert s.enqueue(delivery(1, 8), 3).message.topic == "t/0"
    assert s.recovered == 5 and s.queued == 8
    for _ in range(4):
        s.queue.popleft()
        s.taken_from_queue(1)
    assert s.recovered == 1 and s.queued == 4  # t/5 .. t/8: 3 + 1 of room
    assert s.enqueue(delivery(1, 9), 3).message.topic == "t/5"
    s.queue.clear()
    s.taken_from_queue(0)
    assert s.recovered == 0


def test_a_recovery_that_queued_nothing_leaves_no_room():
    s = Session("c", persistent=True)
    for n in range(3):
        s.enqueue(delivery(1, n), 3)
    before = s.recovery_starts(10)  # all ten were known already: none queued
    s.recovery_ended(10, before)
    assert s.recovered == 0
    assert s.enqueue(delivery(1, 3), 3).message.topic == "t/0"


def test_expiry_from_disconnect_time():
    s = Session("c", persistent=True, expiry_interval=10)
    assert s.expires_at() is None  # connected
    s.disconnected_at = 100.0
    assert s.expires_at() == 110.0
    s.expiry_interval = NEVER_EXPIRES
    assert s.expires_at() is None


def test_message_remaining_expiry_rounds_up():
    m = Message("t", b"", 1, False, None, expires_at=105.2)
    assert m.remaining_expiry(100.0) == 6
    assert not m.expired(105.0)
    assert m.expired(105.2)
