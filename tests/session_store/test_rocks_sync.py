"""The RocksDB store syncs its WAL by hand (os.fdatasync, outside the GIL): every
synced batch reaches an fdatasync of the WAL file holding it, also across a memtable
switch that starts a new WAL, and `off` never syncs."""

from __future__ import annotations

import os

import pytest

from session_store.model import SubscriptionOptions
from session_store.rocks import RocksStore


@pytest.fixture
def store(tmp_path):
    s = RocksStore(tmp_path / "db")
    yield s
    s.close()


@pytest.fixture
def synced(monkeypatch):
    """Names of the files os.fdatasync was called on, in call order."""
    calls: list[str] = []
    real = os.fdatasync

    def record(fd: int) -> None:
        calls.append(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
        real(fd)

    monkeypatch.setattr(os, "fdatasync", record)
    return calls


def wals(store: RocksStore) -> list[str]:
    return sorted(n for n in os.listdir(store.path) if n.endswith(".log"))


def commit(store: RocksStore, *, sync: bool = True) -> None:
    batch, epoch = store.take_batch()
    store.write_batch(batch, sync=sync)
    store.mark_durable(epoch)


def test_a_synced_batch_is_in_the_wal_it_syncs(store, synced):
    before = os.path.getsize(os.path.join(store.path, wals(store)[-1]))
    store.put_session("c", 60, 5, None, 1)
    commit(store)
    [wal] = wals(store)
    assert synced == [wal]
    assert os.path.getsize(os.path.join(store.path, wal)) > before  # written before the sync


def test_off_never_syncs(store, synced):
    store.put_session("c", 60, 5, None, 1)
    commit(store, sync=False)
    assert synced == []
    assert list(store.load().sessions) == ["c"]


def test_a_new_wal_is_followed_and_the_old_one_synced_once(store, synced):
    store.put_session("c", 60, 5, None, 1)
    store.put_subscription("c", "t", SubscriptionOptions(1))
    commit(store)
    [old] = wals(store)
    # A memtable switch (here a flush of one family) starts a new WAL; the old one stays
    # while the other family's data in it is not flushed.
    store._db.get_column_family("sessions").flush()
    old_still, new = wals(store)
    assert old_still == old
    synced.clear()
    store.put_session("c", 61, 5, None, 2)
    commit(store)
    assert synced == [old, new]  # the superseded WAL once, then the live one
    synced.clear()
    store.put_session("c", 62, 5, None, 3)
    commit(store)
    assert synced == [new]
    assert store.load().sessions["c"].expiry_interval == 62


def test_a_deleted_wal_is_let_go(store, synced):
    store.put_session("c", 60, 5, None, 1)
    commit(store)
    [old] = wals(store)
    store._db.get_column_family("sessions").flush()  # nothing else in the old WAL: deleted
    [new] = wals(store)
    assert new != old
    store.put_session("c", 61, 5, None, 2)
    commit(store)
    assert synced[-1] == new
    assert list(store._wal_fds) == [int(new[:-4])]


class RecordingBatch:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def delete(self, key: bytes, handle: object) -> None:
        self.calls.append(("delete", key))

    def delete_range(self, begin: bytes, end: bytes, handle: object) -> None:
        self.calls.append(("range", begin, end))


def k(cid: str, seq: int) -> bytes:
    return cid.encode() + b"\x00" + seq.to_bytes(8, "big")


def test_consecutive_deletes_become_one_range_tombstone():
    from session_store.rocks import _delete_runs

    wb = RecordingBatch()
    deleted = [("a", s) for s in (7, 3, 4, 5, 6, 9, 20, 21)] + [("ab", s) for s in (8, 9, 10, 11)] + [("b", 2**64 - 1)]
    _delete_runs(wb, deleted, None)
    assert wb.calls == [
        ("range", k("a", 3), k("a", 8)),  # 3..7, whatever order they were deleted in
        ("delete", k("a", 9)),  # runs shorter than MIN_RANGE_RUN stay point tombstones
        ("delete", k("a", 20)), ("delete", k("a", 21)),
        ("range", k("ab", 8), k("ab", 12)),  # another session: its own run
        ("delete", k("b", 2**64 - 1)),
    ]


def test_range_tombstones_delete_exactly_the_acknowledged(store):
    from session_store.model import Delivery, Message
    from mqtt import Properties

    def d(seq: int) -> Delivery:
        x = Delivery(Message(f"t/{seq}", b"p", 1, False, Properties()), 1, False, ())
        x.seq = seq
        return x

    ds = {(cid, seq): d(seq) for cid in ("a", "ab") for seq in range(1, 31)}
    for cid in ("a", "ab"):
        store.put_session(cid, 60, 5, None, 1)
        for seq in range(1, 31):
            store.put_queued(cid, ds[(cid, seq)])
    commit(store)
    for seq in [*range(1, 11), 20, 22, 30]:
        store.delete_delivery("a", ds[("a", seq)])
    for seq in range(12, 20):  # sent and acknowledged: a run too
        store.delete_delivery("a", ds[("a", seq)])
        store.put_inflight("a", seq, ds[("a", seq)], "publish")
        store.delete_delivery("a", ds[("a", seq)])
    store.delete_delivery("ab", ds[("ab", 5)])
    commit(store)
    queues = {cid: [x.seq for x in s.queue] for cid, s in store.load().sessions.items()}
    assert queues == {"a": [11, 21, 23, 24, 25, 26, 27, 28, 29],
                      "ab": [s for s in range(1, 31) if s != 5]}


def test_old_wal_files_do_not_pile_up(tmp_path, monkeypatch):
    """The small `queue` memtable switches WAL files often; a record in another family
    (the session) must not keep every old one alive: the WAL cap flushes it."""
    from session_store import rocks
    from session_store.model import Delivery, Message
    from mqtt import Properties

    monkeypatch.setattr(rocks, "QUEUE_WRITE_BUFFER", 256 << 10)
    monkeypatch.setattr(rocks, "MAX_TOTAL_WAL", 1 << 20)
    store = RocksStore(tmp_path / "db")
    try:
        store.put_session("c", 60, 5, None, 1)
        previous: list[Delivery] = []
        seq = 0
        for _ in range(300):  # ~6 MB through the queue family, each batch acked in the next
            batch = []
            for _ in range(100):
                seq += 1
                d = Delivery(Message("t", bytes(200), 1, False, Properties()), 1, False, ())
                d.seq = seq
                store.put_queued("c", d)
                batch.append(d)
            for d in previous:
                store.delete_delivery("c", d)
            previous = batch
            commit(store)
        wal_bytes = sum(os.path.getsize(os.path.join(store.path, n)) for n in wals(store))
        assert wal_bytes < 3 << 20
        assert [d.seq for d in store.load().sessions["c"].queue] == [d.seq for d in previous]
    finally:
        store.close()
