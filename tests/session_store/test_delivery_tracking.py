"""Deliveries are tracked on the `Delivery` objects: `take_batch` hands the writer only
what the store lacks, with each delivery's state as of the take."""

from __future__ import annotations

from mesh.broker import Broker
from mesh.mqtt import EMPTY_PROPERTIES
from session_store.model import Delivery, Message, SubscriptionOptions
from session_store.store import MemoryStore, SessionStore, StoredSession


def delivery(seq: int, qos: int = 1) -> Delivery:
    d = Delivery(Message(f"t/{seq}", b"p", qos, False, EMPTY_PROPERTIES, None, "pub", seq, "A"), qos, False, ())
    d.seq = seq
    return d


def commit(store: SessionStore) -> None:
    batch, epoch = store.take_batch()
    store.write_batch(batch, sync=True)
    store.mark_durable(epoch)


def stream(store: SessionStore, cid: str = "c") -> tuple[list, list]:
    s = store.load().sessions[cid]
    return [(pid, d.seq, st) for pid, d, st in s.inflight], [d.seq for d in s.queue]


def test_acknowledged_after_its_commit_is_one_tombstone_and_no_rewrite():
    store = MemoryStore()
    store.put_session("c", 60, 5, None, 1)
    d = delivery(1)
    store.put_queued("c", d)
    commit(store)
    store.delete_delivery("c", d)  # leaves the queue for the window...
    store.put_inflight("c", 9, d, "publish")
    store.delete_delivery("c", d)  # ...and is acknowledged, all in one window
    batch, _ = store.take_batch()
    assert (batch.puts, batch.deletes) == ([], [("c", 1)])


def test_a_state_back_to_what_is_stored_writes_nothing():
    store = MemoryStore()
    store.put_session("c", 60, 5, None, 1)
    d = delivery(1, qos=2)
    store.put_inflight("c", 4, d, "publish")
    commit(store)
    store.put_inflight("c", 4, d, "publish")  # e.g. resent after a reconnect
    batch, _ = store.take_batch()
    assert len(batch) == 0


def test_the_batch_holds_the_state_at_the_take():
    """A change after the take (while the writer works) goes into the next batch; the
    batch being written keeps what the delivery was when it was taken."""
    store = MemoryStore()
    store.put_session("c", 60, 5, None, 1)
    d = delivery(1)
    store.put_queued("c", d)
    batch, epoch = store.take_batch()
    store.delete_delivery("c", d)
    store.put_inflight("c", 3, d, "publish")  # sent while the batch is on its way
    store.write_batch(batch, sync=True)
    store.mark_durable(epoch)
    assert stream(store) == ([], [1])
    commit(store)
    assert stream(store) == ([(3, 1, "publish")], [])
    store.delete_delivery("c", d)
    commit(store)
    assert stream(store) == ([], [])


def test_deleting_a_session_drops_its_pending_deliveries_only():
    store = MemoryStore()
    for cid in ("a", "b"):
        store.put_session(cid, 60, 5, None, 1)
    a, b = delivery(1), delivery(1)
    store.put_queued("a", a)
    store.put_queued("b", b)
    store.delete_session("a")
    batch, epoch = store.take_batch()
    assert [(d.owner, d.seq) for d, _ in batch.puts] == [("b", 1)]
    store.write_batch(batch, sync=True)
    # A put after the delete (same window) is written after the range delete: it stays.
    store.put_session("a", 60, 5, None, 1)
    store.put_queued("a", a)
    store.delete_session("a")
    store.put_session("a", 60, 5, None, 1)
    store.put_queued("a", a)
    commit(store)
    assert stream(store, "a") == ([], [1]) and stream(store, "b") == ([], [1])


def test_a_session_stored_again_writes_its_deliveries_again():
    """Persistent, then not (its records deleted, the deliveries kept in memory), then
    persistent again: every delivery is written again, including those whose old
    record had been committed."""
    broker = Broker(node_id="A", store=MemoryStore())
    store = broker.store
    session = broker.install_session(
        StoredSession("dev", expiry_interval=60, protocol_level=5, next_seq=10,
                      subscriptions={"t/#": SubscriptionOptions(1)}, queue=[delivery(3), delivery(4)]),
        now=1000.0)
    commit(store)
    assert stream(store, "dev") == ([], [3, 4])
    broker.set_expiry(session, 0)
    commit(store)
    assert "dev" not in store.load().sessions
    broker.set_expiry(session, 60)
    commit(store)
    assert stream(store, "dev") == ([], [3, 4])


def test_restored_deliveries_know_their_records():
    """After a restart an acknowledgement of a restored delivery deletes its record, and
    moving a restored queued one into the window rewrites it."""
    store = MemoryStore()
    store.put_session("c", 60, 5, None, 1)
    store.put_queued("c", delivery(1))
    store.put_queued("c", delivery(2))
    commit(store)
    state = store.load().sessions["c"]
    first, second = state.queue
    store.delete_delivery("c", first)
    store.delete_delivery("c", second)
    store.put_inflight("c", 7, second, "publish")
    batch, epoch = store.take_batch()
    assert batch.deletes == [("c", 1)] and [(d.seq, st) for d, st in batch.puts] == [(2, 1 | 7 << 2)]
    store.write_batch(batch, sync=True)
    assert stream(store) == ([(7, 2, "publish")], [])
