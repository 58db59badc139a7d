"""What a replica writes of the copies it holds (`Replication._persist`, the store's
`replica` family): the owner's own record format and key shape, so a copy costs its
replica no more bytes than the session costs its owner; runs of acknowledged
deliveries as range tombstones; everything back after a restart, an older version's
records (meta `repld/...`) included, moved into the family."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from mqtt import EMPTY_PROPERTIES, Properties
from replication import changes
from replication.service import DELIVERY_META, HEADER_META, Replication
from session_store.handoff import delivery_to_wire
from session_store.model import Delivery, Message
from session_store.rocks import RocksStore
from session_store.store import NO_RECORD, MemoryStore, SessionStore, delivery_state


class _Clock:
    def now(self) -> float:
        return 0.0

    def wall(self) -> float:
        return 1_700_000_000.0


class _Broker:
    sessions: dict[str, Any] = {}

    def on_durable(self) -> None: ...


class _Queries:
    def handle(self, *args: object) -> None: ...

    def handle_pipelined(self, *args: object) -> None: ...


class _Members:
    def alive_members(self) -> list[str]:
        return ["n0", "n1"]


def replica(store: SessionStore) -> Replication:
    state = store.load()
    fakes: dict[str, Any] = {"store": store, "broker": _Broker(), "queries": _Queries(), "members": _Members(),
                             "clock": _Clock()}
    return Replication(node_id="n1", copies=2, mode="sync", recovered_meta=state.meta,
                       recovered_replica=state.replica, **fakes)


def commit(store: SessionStore) -> None:
    batch, epoch = store.take_batch()
    store.write_batch(batch, sync=True)
    store.mark_durable(epoch)


def delivery(seq: int, props: Properties = EMPTY_PROPERTIES) -> Delivery:
    d = Delivery(Message("bench/repl", b"x" * 64, 1, False, props, publisher="repl-pub-0", msg_id=seq, origin="n2"),
                 1, False, ())
    d.seq = seq
    return d


def batch(r: Replication, *session_changes: list[object]) -> None:
    answer = r._apply_batch("n0", {"b": [["c", None, list(session_changes)]]})
    assert answer == {"r": [], "x": []}


@pytest.fixture(params=["memory", "rocksdb"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], SessionStore]]:
    opened: list[SessionStore] = []
    disk = MemoryStore().disk

    def make() -> SessionStore:
        for store in opened:
            store.close()
        store: SessionStore = MemoryStore(disk=disk) if request.param == "memory" else RocksStore(tmp_path / "db")
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()


def stored(store: SessionStore, cf: str) -> dict[bytes, bytes]:
    return dict(store.scan(cf))


def test_a_copy_costs_its_replica_no_more_bytes_a_delivery_than_the_session_costs_its_owner() -> None:
    owner, holder = MemoryStore(), MemoryStore()
    r = replica(holder)
    queued = [delivery(1000 + i) for i in range(20)]
    for i, d in enumerate(queued):
        if i % 2:
            owner.put_inflight("c", i + 1, d, "publish")
        else:
            owner.put_queued("c", d)
    commit(owner)
    snapshot: list[object] = [
        [delivery_state("publish", i + 1) if i % 2 else delivery_state(None), delivery_to_wire(d)]
        for i, d in enumerate(queued)]
    image = {"x": 3600, "l": 5, "d": None, "n": 1100, "s": [], "q2": []}
    batch(r, [7, "S", image, snapshot])
    commit(holder)
    own = stored(owner, "queue")
    held = stored(holder, "replica")
    assert len(own) == len(held) == 20
    assert sum(len(k) + len(v) for k, v in held.items()) <= sum(len(k) + len(v) for k, v in own.items())


def test_the_copy_comes_back_after_a_restart_and_a_run_of_acknowledged_deliveries_is_one_tombstone(
        make_store: Callable[[], SessionStore]) -> None:
    store = make_store()
    r = replica(store)
    image = {"x": 3600, "l": 5, "d": None, "n": 1, "s": [], "q2": []}
    props = Properties(content_type="text/plain", user_properties=(("k", "v"),))
    batch(r, [10, "S", image, []],
          *[changes.delivery_change(11 + i, delivery(i + 1, props), 0) for i in range(10)],
          changes.delivery_change(21, delivery(3, props), delivery_state("publish", 7)))
    commit(store)
    before = {dseq: list(v) for dseq, v in r.copies_held["c"].deliveries.items()}
    r = replica(store := make_store())
    assert r.copies_held["c"].deliveries == before
    assert r.copies_held["c"].stored_session().inflight[0][0] == 7
    # 1..6 acknowledged in one batch: one range tombstone; 9 alone: a point one.
    batch(r, *[changes.delivery_change(22 + i, delivery(i + 1), NO_RECORD) for i in range(6)],
          changes.delivery_change(28, delivery(9), NO_RECORD))
    pending, _ = store.take_batch()
    assert len(pending.range_deletes) == 1 and len(pending.ops) == 2  # the point tombstone and the header
    store.write_batch(pending, sync=True)
    r = replica(store := make_store())
    assert sorted(r.copies_held["c"].deliveries) == [7, 8, 10]
    # The session ended: its records go with it.
    batch(r, [29, "x"])
    commit(store)
    r = replica(store := make_store())
    assert r.copies_held == {} and stored(store, "replica") == {}


def test_an_older_versions_records_are_read_and_moved_into_the_replica_family(
        make_store: Callable[[], SessionStore]) -> None:
    store = make_store()
    header = changes.ReplicaCopy("c", "n0", seq=12, next_seq=5).header()
    store.put_meta(HEADER_META + "c", header)
    wires = {dseq: [delivery_state(None), delivery_to_wire(delivery(dseq))] for dseq in (3, 4)}
    for dseq, value in wires.items():
        store.put_meta(f"{DELIVERY_META}c/{dseq:020d}", value)
    commit(store)
    r = replica(store)
    assert r.copies_held["c"].deliveries == wires
    commit(store)
    r = replica(store := make_store())
    assert r.copies_held["c"].deliveries == wires
    assert not any(key.startswith(DELIVERY_META) for key in store.load().meta)
    assert len(stored(store, "replica")) == 2
