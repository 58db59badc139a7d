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
