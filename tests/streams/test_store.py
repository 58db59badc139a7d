"""One node's part of a stream in the session store: appends through the open batch,
pages read by position (one iterator), retention's range tombstone, counters and the
trimmed position recovered at start; on real RocksDB and on the in-memory store."""

from __future__ import annotations

import pytest

from mqtt import Properties
from session_store.model import Message
from session_store.rocks import RocksStore
from session_store.store import MemoryDisk, MemoryStore, SessionStore
from streams import position as p
from streams.retention import plan_cut
from streams.spec import StreamSpec
from streams.store import StreamStore


def commit(store: SessionStore) -> None:
    batch, epoch = store.take_batch()
    store.write_batch(batch, sync=True)
    store.mark_durable(epoch)


def message(topic: str, i: int, pos: str) -> Message:
    return Message(topic, str(i).encode(), 1, False, Properties(user_properties=(("position", pos),)))


@pytest.fixture(params=["rocks", "memory"])
def opener(request, tmp_path):
    disk = MemoryDisk()
    opened: list[SessionStore] = []

    def open_store() -> SessionStore:
        store: SessionStore = RocksStore(tmp_path / "db") if request.param == "rocks" else MemoryStore(disk=disk)
        opened.append(store)
        return store

    yield open_store
    for store in opened:
        store.close()


def test_pages_cut_and_recovery(opener):
    backend = opener()
    streams = StreamStore(backend)
    positions = [p.encode(1000 + i, 0, "n1") for i in range(10)]
    for i, pos in enumerate(positions):
        streams.append("a/#", pos, message(f"a/{i % 2}", i, pos))
    streams.append("b", p.encode(5000, 0, "n1"), message("b", 0, p.encode(5000, 0, "n1")))
    assert backend.write_epoch > backend.durable_epoch  # recorded, not written yet
    commit(backend)

    page = streams.read_page("a/#", None, p.EARLIEST, limit=4, max_bytes=1 << 20, scan_limit=100)
    assert [pos for pos, _ in page.records] == positions[:4] and page.last_key == positions[3] and not page.end
    page = streams.read_page("a/#", lambda t: t == "a/1", positions[3], limit=100, max_bytes=1 << 20, scan_limit=100)
    assert [pos for pos, _ in page.records] == positions[5::2] and page.end and page.last_key == positions[-1]
    page = streams.read_page("a/#", None, positions[-1], limit=100, max_bytes=1 << 20, scan_limit=100)
    assert page.records == [] and page.end

    stats = streams.stats["a/#"]
    assert (stats.messages, stats.oldest, stats.newest) == (10, positions[0], positions[-1])
    cut = plan_cut(StreamSpec("a/#", max_messages=6), streams.oldest_first("a/#"), stats.messages, stats.bytes, 0)
    assert cut is not None and cut.messages == 4 and cut.last == positions[3]
    streams.apply_cut("a/#", cut)
    commit(backend)
    page = streams.read_page("a/#", None, p.EARLIEST, limit=100, max_bytes=1 << 20, scan_limit=100)
    assert [pos for pos, _ in page.records] == positions[4:]
    assert streams.first_position("b") == p.encode(5000, 0, "n1")  # the other stream untouched

    meta = backend.load().meta
    backend.close()
    again = StreamStore(opener())
    again.recover(meta)
    s = again.stats["a/#"]
    assert (s.messages, s.bytes, s.oldest, s.newest, s.trimmed) == (6, stats.bytes, positions[4], positions[-1], positions[3])
    assert again.stats["b"].messages == 1
