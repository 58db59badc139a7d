"""Deliveries are tracked on the `Delivery` objects: `take_batch` hands the writer only
what the store lacks, with each delivery's state as of the take."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from mesh.broker import Broker
from mqtt import EMPTY_PROPERTIES
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


# -- a model: what the store must give back after any sequence of broker-like steps ----------

STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("publish"), st.sampled_from("ab"), st.integers(1, 4)),  # n queued
        # queue head -> inflight (direct: `put_inflight` alone, as the broker does; else
        # `delete_delivery` first)
        st.tuples(st.just("send"), st.sampled_from("ab"), st.integers(1, 3), st.booleans()),
        # i-th inflight done (release: `release_delivery`, as the broker does; else `delete_delivery`)
        st.tuples(st.just("ack"), st.sampled_from("ab"), st.integers(0, 5), st.booleans()),
        st.tuples(st.just("pubrel"), st.sampled_from("ab"), st.integers(0, 5)),
        st.tuples(st.just("drop"), st.sampled_from("ab"), st.integers(0, 9), st.booleans()),  # i-th queued dropped
        st.tuples(st.just("end"), st.sampled_from("ab")),  # the session is deleted (and recreated)
        st.tuples(st.just("handed"), st.sampled_from("ab"), st.integers(1, 3)),  # a tail with lower seqs
        st.just(("commit",)),
        st.just(("tick",)),  # a batch-mode tick: `take_batch(hold=1)`
        st.just(("restart",)),
    ),
    max_size=60,
)


class Model:
    """A broker's view of two sessions: queue and inflight by seq, and the objects."""

    def __init__(self, store: SessionStore) -> None:
        self.store = store
        self.next_seq = 1000
        self.low_seq = 1  # a tail handed over from another node sorts before (merge_handed_tail)
        self.queue: dict[str, list[Delivery]] = {"a": [], "b": []}
        self.inflight: dict[str, list[tuple[int, Delivery, str]]] = {"a": [], "b": []}
        for cid in "ab":
            store.put_session(cid, 60, 5, None, 1)

    def step(self, op: tuple) -> None:
        store, kind = self.store, op[0]
        if kind == "publish":
            for _ in range(op[2]):
                d = delivery(self.next_seq)
                self.next_seq += 1
                self.queue[op[1]].append(d)
                store.put_queued(op[1], d)
        elif kind == "handed":
            for _ in range(op[2]):
                d = delivery(self.low_seq)
                self.low_seq += 1
                self.queue[op[1]].append(d)
                store.put_queued(op[1], d)
            self.queue[op[1]].sort(key=lambda d: d.seq)
        elif kind == "send":
            for _ in range(op[2]):
                if self.queue[op[1]]:
                    d = self.queue[op[1]].pop(0)
                    if not op[3]:
                        store.delete_delivery(op[1], d)
                    pid = d.seq % 65535 + 1
                    self.inflight[op[1]].append((pid, d, "publish"))
                    store.put_inflight(op[1], pid, d, "publish")
        elif kind in ("ack", "pubrel"):
            window = self.inflight[op[1]]
            if window:
                i = op[2] % len(window)
                pid, d, _ = window[i]
                if kind == "ack":
                    del window[i]
                    (store.release_delivery if op[3] else store.delete_delivery)(op[1], d)
                else:
                    window[i] = (pid, d, "pubrel")
                    store.put_inflight(op[1], pid, d, "pubrel")
        elif kind == "drop":
            queue = self.queue[op[1]]
            if queue:
                (store.release_delivery if op[3] else store.delete_delivery)(op[1], queue.pop(op[2] % len(queue)))
        elif kind == "end":
            store.delete_session(op[1])
            store.put_session(op[1], 60, 5, None, 1)
            self.queue[op[1]], self.inflight[op[1]] = [], []
        elif kind == "commit":
            commit(self.store)
        elif kind == "tick":
            batch, epoch = store.take_batch(hold=1)
            store.write_batch(batch, sync=True)
            store.mark_durable(epoch)

    def restart(self, store: SessionStore) -> None:
        """Continue on a restarted store with the deliveries it gave back."""
        self.store = store
        state = store.load()
        for cid in "ab":
            s = state.sessions[cid]
            self.queue[cid] = list(s.queue)
            self.inflight[cid] = list(s.inflight)

    def expected(self) -> dict:
        return {cid: ([(pid, d.seq, st) for pid, d, st in sorted(self.inflight[cid], key=lambda e: e[1].seq)],
                      [d.seq for d in self.queue[cid]]) for cid in "ab"}


def restarted(store: MemoryStore) -> MemoryStore:
    return MemoryStore(disk=store.disk)


@settings(max_examples=300, deadline=None)
@given(steps=STEPS)
def test_what_comes_back_after_a_restart_is_what_was_committed(steps):
    model = Model(MemoryStore())
    for op in steps:
        if op[0] == "restart":
            commit(model.store)  # a clean stop commits everything
            model.restart(restarted(model.store))
        else:
            model.step(op)
    commit(model.store)
    state = restarted(model.store).load()
    got = {cid: ([(pid, d.seq, st) for pid, d, st in sorted(s.inflight, key=lambda e: e[1].seq)],
                 [d.seq for d in s.queue]) for cid, s in state.sessions.items()}
    assert got == model.expected() and state.skipped == 0


def test_a_released_delivery_leaves_the_store_at_once():
    """`release_delivery` (acknowledged, dropped, expired): a delivery never written
    leaves no trace and no reference in the store; one written gets a tombstone."""
    store = MemoryStore()
    store.put_session("c", 60, 5, None, 1)
    kept, gone = delivery(1), delivery(2)
    store.put_queued("c", kept)
    commit(store)
    store.put_inflight("c", 4, kept, "publish")
    store.put_queued("c", gone)
    store.release_delivery("c", gone)
    store.release_delivery("c", kept)
    assert all(not w.deliveries for w in (*store._held, store._open))
    batch, _ = store.take_batch()
    assert (batch.puts, batch.deletes) == ([], [("c", 1)])
    store.write_batch(batch, sync=True)
    assert stream(store) == ([], [])


def test_deleting_a_session_drops_its_pending_tombstones():
    """A tombstone of an ended session must not delete a record of the session that
    replaces it (same client id, sequence numbers from 1 again)."""
    store = MemoryStore()
    store.put_session("c", 60, 5, None, 1)
    old = delivery(1)
    store.put_queued("c", old)
    commit(store)
    store.release_delivery("c", old)  # tombstone pending
    store.delete_session("c")
    store.put_session("c", 60, 5, None, 1)
    store.put_queued("c", delivery(1))
    commit(store)
    assert stream(store) == ([], [1])
