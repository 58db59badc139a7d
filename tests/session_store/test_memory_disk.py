"""MemoryDisk: what a MemoryStore wrote survives the store (a restarted process reads
it), and a crash of the machine loses exactly the writes that were never synced."""

from __future__ import annotations

from session_store.store import WRITEBACK_BATCHES, MemoryDisk, MemoryStore


def write_meta(store: MemoryStore, key: str, value: object, *, sync: bool) -> None:
    store.put_meta(key, value)
    batch, epoch = store.take_batch()
    store.write_batch(batch, sync=sync)
    store.mark_durable(epoch)


def test_a_synced_write_also_syncs_the_unsynced_ones_before_it() -> None:
    disk = MemoryDisk()
    store = MemoryStore(disk=disk)
    write_meta(store, "a", 1, sync=False)
    write_meta(store, "b", 2, sync=True)
    write_meta(store, "c", 3, sync=False)
    # A restarted process reads everything written (the page cache is still there).
    assert MemoryStore(disk=disk).load().meta == {"a": 1, "b": 2, "c": 3}
    # A crash of the machine loses only what no sync covered.
    assert disk.lose_unsynced() == 1
    assert MemoryStore(disk=disk).load().meta == {"a": 1, "b": 2}


def test_deletes_are_unsynced_too_until_a_sync() -> None:
    disk = MemoryDisk()
    store = MemoryStore(disk=disk)
    write_meta(store, "a", 1, sync=True)
    store.delete_meta("a")
    batch, _ = store.take_batch()
    store.write_batch(batch, sync=False)
    assert MemoryStore(disk=disk).load().meta == {}
    disk.lose_unsynced()
    assert MemoryStore(disk=disk).load().meta == {"a": 1}


def test_the_os_writes_old_unsynced_batches_back_by_itself() -> None:
    disk = MemoryDisk()
    store = MemoryStore(disk=disk)
    for i in range(WRITEBACK_BATCHES + 1):
        write_meta(store, f"k{i}", i, sync=False)
    disk.lose_unsynced()
    assert MemoryStore(disk=disk).load().meta == {"k0": 0}
