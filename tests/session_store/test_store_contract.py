"""One contract, two stores: the in-memory store and the RocksDB store behave alike,
and the RocksDB store gives back after a reopen exactly what was committed."""

from __future__ import annotations

import gc
from typing import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqtt import Properties, Will
from session_store.model import Delivery, Message, SubscriptionOptions
from session_store.rocks import RocksStore, StoreOpenError
from session_store.store import MemoryStore, RecoveredState, SessionStore


def commit(store: SessionStore) -> None:
    batch, epoch = store.take_batch()
    store.write_batch(batch, sync=True)
    store.mark_durable(epoch)


def delivery(topic: str, seq: int, qos: int = 1, **props) -> Delivery:
    d = Delivery(Message(topic, topic.encode() * 3, qos, False, Properties(**props) if props else Properties(), 1e9, "pub", seq), qos, False, (seq,))
    d.seq = seq
    return d


@pytest.fixture(params=["memory", "rocksdb"])
def make_store(request, tmp_path) -> Callable[..., SessionStore]:
    opened: list[SessionStore] = []

    def make(on_dirty: Callable[[], None] | None = None) -> SessionStore:
        store = MemoryStore(on_dirty=on_dirty) if request.param == "memory" else RocksStore(tmp_path / "db", on_dirty=on_dirty)
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()


def snapshot(state: RecoveredState) -> dict:
    """A comparable view of everything a store gave back."""
    out = {}
    for cid, s in state.sessions.items():
        out[cid] = {
            "meta": (s.expiry_interval, s.protocol_level, s.disconnected_at, s.next_seq),
            "subs": dict(s.subscriptions),
            "inflight": [(pid, d.message.topic, d.message.payload, d.seq, d.subscription_ids, st) for pid, d, st in s.inflight],
            "queue": [(d.message.topic, d.seq, d.qos, d.message.properties) for d in s.queue],
            "qos2": sorted(s.qos2_in),
            "will": (s.will[0], s.will[1]) if s.will else None,
        }
    out["retained"] = sorted((m.topic, m.payload) for m in state.retained)
    out["meta"] = state.meta
    return out


def test_everything_round_trips(make_store):
    store = make_store()
    store.put_session("c1", 3600, 5, 123.5, 9)
    store.put_subscription("c1", "a/#", SubscriptionOptions(1, True, False, 2, 7))
    store.put_subscription("c1", "$share/g/b", SubscriptionOptions(2))
    store.put_queued("c1", delivery("q/2", 2, user_properties=(("k", "v"),)))
    store.put_queued("c1", delivery("q/1", 1))
    store.put_queued("c1", delivery("q/300", 300))
    store.put_inflight("c1", 5, delivery("i/5", 5), "publish")
    store.put_inflight("c1", 4, delivery("i/4", 6), "pubrel")
    store.put_qos2_in("c1", 65535)
    store.put_will("c1", Will("w", b"bye", 1, True, Properties(will_delay_interval=5)), 999.0)
    store.put_retained(Message("r/t", b"kept", 1, True, Properties(content_type="text/plain")))
    store.put_meta("cluster", {"x": [1, 2]})
    commit(store)
    state = store.load()
    s = state.sessions["c1"]
    assert (s.expiry_interval, s.protocol_level, s.disconnected_at) == (3600, 5, 123.5)
    assert s.subscriptions["a/#"] == SubscriptionOptions(1, True, False, 2, 7)
    assert [d.message.topic for d in s.queue] == ["q/1", "q/2", "q/300"]  # seq order, not insertion
    assert s.queue[1].message.properties.user_properties == (("k", "v"),)
    assert [(pid, st) for pid, _, st in s.inflight] == [(5, "publish"), (4, "pubrel")]  # send order
    assert s.qos2_in == {65535}
    assert s.will[0].properties.will_delay_interval == 5 and s.will[1] == 999.0
    assert state.retained[0].properties.content_type == "text/plain"
    assert state.meta == {"cluster": {"x": [1, 2]}}


def test_delete_session_removes_only_that_session(make_store):
    store = make_store()
    for cid in ("a", "ab", "b"):
        store.put_session(cid, 60, 4, None, 1)
        store.put_subscription(cid, "t", SubscriptionOptions(1))
        store.put_queued(cid, delivery("t", 1))
        store.put_will(cid, Will("w", b""), None)
    store.delete_session("a")
    commit(store)
    state = store.load()
    assert sorted(state.sessions) == ["ab", "b"]
    assert all(len(s.queue) == 1 and s.subscriptions and s.will for s in state.sessions.values())
    assert state.skipped == 0


def test_nothing_before_commit_and_epochs(make_store):
    dirty = []
    store = make_store(on_dirty=lambda: dirty.append(1))
    store.put_session("c", 60, 4, None, 1)
    store.put_queued("c", delivery("t", 1))
    assert dirty == [1]  # once per dirty period, not per write
    assert store.has_pending() and store.write_epoch == 2 and store.durable_epoch == 0
    assert store.load().sessions == {}
    commit(store)
    assert not store.has_pending()
    assert list(store.load().sessions) == ["c"]


def test_corrupt_values_are_skipped_with_a_count(make_store):
    store = make_store()
    store.put_session("good", 60, 4, None, 1)
    store._put("sessions", b"bad", bytes, b"\xff\x00garbage")
    store._put("queue", b"good\x00" + (1).to_bytes(8, "big"), bytes, b"\x00")
    store._put("subscriptions", b"orphan\x00t", bytes, b"\xa0")
    store._changed()
    commit(store)
    state = store.load()
    assert list(state.sessions) == ["good"]
    assert state.skipped == 3


def test_put_then_delete_in_one_batch_is_never_encoded(make_store, monkeypatch):
    from session_store import records

    store = make_store()
    store.put_session("c", 60, 5, None, 1)
    commit(store)
    encoded = []
    real = records.encode_delivery_record
    monkeypatch.setattr(records, "encode_delivery_record", lambda *a, **k: encoded.append(1) or real(*a, **k))
    for pid in range(1, 101):  # deliveries acknowledged within one commit window
        d = delivery(f"t/{pid}", pid)
        store.put_inflight("c", pid, d, "publish")
        store.delete_delivery("c", d)
    store.put_inflight("c", 7, delivery("kept", 500), "publish")
    batch, epoch = store.take_batch()
    assert len(batch) == 1  # the 100 acknowledged deliveries left not even a tombstone
    store.write_batch(batch, sync=True)
    store.mark_durable(epoch)
    assert len(encoded) == 1
    assert [(pid, d.message.topic) for pid, d, _ in store.load().sessions["c"].inflight] == [(7, "kept")]


def test_pubrel_then_pubcomp_in_one_batch_leaves_nothing(make_store):
    # The PUBREL-sent rewrite is of a record already on disk: the PUBCOMP in the same
    # window must still delete it, or it comes back as inflight after a restart.
    store = make_store()
    store.put_session("c", 60, 5, None, 1)
    d = delivery("t", 1, qos=2)
    store.put_inflight("c", 3, d, "publish")
    commit(store)
    store.put_inflight("c", 3, d, "pubrel")
    store.delete_delivery("c", d)
    commit(store)
    assert store.load().sessions["c"].inflight == []


def test_queued_then_sent_is_one_record(make_store):
    """A committed queued delivery moved into the inflight window is rewritten in place:
    it comes back inflight (not also queued), and its acknowledgement removes it."""
    store = make_store()
    store.put_session("c", 60, 5, None, 1)
    ds = {seq: delivery(f"t/{seq}", seq) for seq in (1, 2, 3)}
    for d in ds.values():
        store.put_queued("c", d)
    commit(store)
    store.delete_delivery("c", ds[1])  # what the broker does when it fills the window
    store.put_inflight("c", 10, ds[1], "publish")
    store.delete_delivery("c", ds[2])
    store.put_inflight("c", 11, ds[2], "publish")
    batch, epoch = store.take_batch()
    assert len(batch) == 2  # two overwrites, no tombstones
    store.write_batch(batch, sync=True)
    store.mark_durable(epoch)
    s = store.load().sessions["c"]
    assert [(pid, d.seq, st) for pid, d, st in s.inflight] == [(10, 1, "publish"), (11, 2, "publish")]
    assert [d.seq for d in s.queue] == [3]
    store.delete_delivery("c", ds[1])
    commit(store)
    s = store.load().sessions["c"]
    assert [d.seq for _, d, _ in s.inflight] == [2] and [d.seq for d in s.queue] == [3]


def test_format_1_deliveries_are_read_and_inflight_moved(make_store):
    """A node upgraded in place loads the deliveries format 1 wrote (CBOR, inflight in
    its own family); after the first commit an acknowledgement removes them for good."""
    from session_store import records

    store = make_store()
    store.put_session("c", 60, 5, None, 9)
    q, i = delivery("q/old", 2, user_properties=(("k", "v"),)), delivery("i/old", 1)
    store._put("queue", b"c\x00" + (2).to_bytes(8, "big"), records.encode_delivery, q)
    store._put("inflight", b"c\x00" + (1).to_bytes(8, "big"), lambda: records.encode_delivery(i, state="pubrel", packet_id=42))
    store._changed()
    commit(store)
    state = store.load()
    s = state.sessions["c"]
    assert state.skipped == 0
    assert [(pid, d.message.topic, d.seq, st) for pid, d, st in s.inflight] == [(42, "i/old", 1, "pubrel")]
    assert [(d.message.topic, d.seq, d.message.properties.user_properties) for d in s.queue] == [("q/old", 2, (("k", "v"),))]
    commit(store)  # the move written by load
    assert list(store.scan("inflight")) == []
    s = store.load().sessions["c"]
    assert [(pid, st) for pid, _, st in s.inflight] == [(42, "pubrel")]
    store.delete_delivery("c", s.inflight[0][1])
    store.delete_delivery("c", s.queue[0])
    commit(store)
    s = store.load().sessions["c"]
    assert s.inflight == [] and s.queue == []


def test_session_delete_then_recreate_in_one_batch(make_store):
    store = make_store()
    store.put_session("c", 60, 5, None, 1)
    store.put_subscription("c", "old", SubscriptionOptions(1))
    commit(store)
    store.put_subscription("c", "older", SubscriptionOptions(1))
    store.delete_session("c")
    store.put_session("c", 60, 5, None, 1)
    store.put_subscription("c", "new", SubscriptionOptions(0))
    commit(store)
    assert list(store.load().sessions["c"].subscriptions) == ["new"]


def test_rocksdb_locked_by_another_open_is_a_clear_error(tmp_path):
    first = RocksStore(tmp_path / "db")
    try:
        with pytest.raises(StoreOpenError, match="cannot open session store"):
            RocksStore(tmp_path / "db")
    finally:
        first.close()


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("session"), st.sampled_from("abc"), st.integers(0, 10)),
        st.tuples(st.just("delete"), st.sampled_from("abc")),
        st.tuples(st.just("sub"), st.sampled_from("abc"), st.sampled_from(["x", "y/#", "+/z"]), st.integers(0, 2)),
        st.tuples(st.just("unsub"), st.sampled_from("abc"), st.sampled_from(["x", "y/#", "+/z"])),
        st.tuples(st.just("queue"), st.sampled_from("abc"), st.integers(1, 50)),
        st.tuples(st.just("dequeue"), st.sampled_from("abc"), st.integers(1, 50)),
        st.tuples(st.just("inflight"), st.sampled_from("abc"), st.integers(1, 5), st.integers(1, 50)),
        st.tuples(st.just("ack"), st.sampled_from("abc"), st.integers(1, 5)),
        st.tuples(st.just("qos2"), st.sampled_from("abc"), st.integers(1, 5), st.booleans()),
        st.tuples(st.just("retain"), st.sampled_from(["r1", "r2"]), st.booleans()),
        st.just(("commit",)),
    ),
    max_size=40,
)


def apply(store: SessionStore, op: tuple, live: dict[tuple[str, int], Delivery]) -> None:
    """`live`: the delivery objects by (client id, seq), one per delivery as the broker
    keeps them (a deleted session's are gone)."""
    kind = op[0]

    def the(cid: str, seq: int, topic: str) -> Delivery:
        if (cid, seq) not in live:
            live[(cid, seq)] = delivery(topic, seq)
        return live[(cid, seq)]

    if kind == "session":
        store.put_session(op[1], 60 + op[2], 5, float(op[2]), op[2])
    elif kind == "delete":
        store.delete_session(op[1])
        for key in [key for key in live if key[0] == op[1]]:
            del live[key]
    elif kind == "sub":
        store.put_subscription(op[1], op[2], SubscriptionOptions(op[3]))
    elif kind == "unsub":
        store.delete_subscription(op[1], op[2])
    elif kind == "queue":
        store.put_queued(op[1], the(op[1], op[2], f"t/{op[2]}"))
    elif kind == "dequeue":
        store.delete_delivery(op[1], the(op[1], op[2], f"t/{op[2]}"))
    elif kind == "inflight":
        store.put_inflight(op[1], op[2], the(op[1], op[3], f"i/{op[3]}"), "publish")
    elif kind == "ack":
        store.delete_delivery(op[1], the(op[1], op[2], f"i/{op[2]}"))
    elif kind == "qos2":
        (store.put_qos2_in if op[3] else store.delete_qos2_in)(op[1], op[2])
    elif kind == "retain":
        if op[2]:
            store.put_retained(Message(op[1], b"v", 1, True, Properties()))
        else:
            store.delete_retained(op[1])
    elif kind == "commit":
        commit(store)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS)
def test_random_operations_survive_reopen_and_match_memory(tmp_path_factory, ops):
    path = tmp_path_factory.mktemp("prop") / "db"
    memory, rocks = MemoryStore(), RocksStore(path)
    live_m: dict[tuple[str, int], Delivery] = {}
    live_r: dict[tuple[str, int], Delivery] = {}
    for op in ops:
        apply(memory, op, live_m)
        apply(rocks, op, live_r)
    commit(memory)
    commit(rocks)
    before = snapshot(rocks.load())
    rocks.close()
    gc.collect()
    reopened = RocksStore(path)
    try:
        after = snapshot(reopened.load())
    finally:
        reopened.close()
    assert after == before
    assert after == snapshot(memory.load())


def test_exchanges_wait_for_the_async_replicas_floor():
    """`async` replication holds no acknowledgement, only what `when_replicated` waits
    for: called at once with nothing unconfirmed, else once `hold_exchanges` passes its
    epoch (None: every change is on the replicas)."""
    store = MemoryStore()
    called: list[int] = []
    store.when_replicated(5, lambda: called.append(5))
    assert called == [5]
    store.hold_exchanges(3)
    store.when_replicated(4, lambda: called.append(4))
    store.when_replicated(6, lambda: called.append(6))
    assert called == [5] and store.exchanges_waiting and store.exchange_floor == 3
    store.hold_exchanges(4)
    assert called == [5, 4]
    store.hold_exchanges(None)
    assert called == [5, 4, 6] and not store.exchanges_waiting
    assert store.durable_epoch == store.local_durable_epoch  # acknowledgements never held
