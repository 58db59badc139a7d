"""The cache queue (sans-I/O) and its group commit, on the in-memory store: order,
bounds (drop-oldest by bytes, by age, counted), durability before sending, and what a
kill -9 keeps."""

from __future__ import annotations

import trio
import trio.testing

from bridges.committer import Committer
from bridges.queue import CacheQueue, decode_record, encode_record, parse_record_key, record_key
from bridges.store import MemoryQueueStore


class Writes:
    """QueueWrites that only records (the core alone)."""

    def __init__(self) -> None:
        self.write_epoch = 1
        self.ops: dict[bytes, bytes | None] = {}

    def put(self, key: bytes, value: bytes) -> None:
        self.ops[key] = value

    def delete(self, key: bytes) -> None:
        self.ops[key] = None


def test_record_keys_parse_back_even_with_zero_bytes_in_the_seq() -> None:
    for seq in (1, 0x0275, 0x010000, 2**40):
        assert parse_record_key(record_key("br.1", seq)) == ("br.1", seq)
    assert parse_record_key(b"short") is None


def test_record_round_trip() -> None:
    data = encode_record("a/b", b"\x00payload", 2, True, 1234.5)
    r = decode_record(7, data)
    assert (r.seq, r.topic, r.payload, r.qos, r.retain, r.at, r.size) == (7, "a/b", b"\x00payload", 2, True, 1234.5, len(data))


def test_in_order_and_acked_records_leave() -> None:
    w = Writes()
    q = CacheQueue("b", max_bytes=1 << 20, max_age=60, writes=w)
    seqs = [q.append(f"t/{i}", b"x", 1, False, 100.0) for i in range(5)]
    assert [r.seq for r in q.unsent(0, 10, durable_epoch=1)] == seqs
    assert [r.seq for r in q.unsent(seqs[1], 2, durable_epoch=1)] == seqs[2:4]
    assert q.ack(seqs[0]) and not q.ack(seqs[0])
    assert w.ops[record_key("b", seqs[0])] is None  # deleted on disk
    assert len(q) == 4 and q.sent_total == 1 and q.dropped_total == 0


def test_nothing_is_sendable_before_it_is_durable() -> None:
    w = Writes()
    q = CacheQueue("b", max_bytes=1 << 20, max_age=60, writes=w)
    q.append("t", b"1", 1, False, 0.0)
    w.write_epoch = 2
    q.append("t", b"2", 1, False, 0.0)
    assert [r.payload for r in q.unsent(0, 10, durable_epoch=0)] == []
    assert [r.payload for r in q.unsent(0, 10, durable_epoch=1)] == [b"1"]
    assert [r.payload for r in q.unsent(0, 10, durable_epoch=2)] == [b"1", b"2"]


def test_bytes_bound_drops_the_oldest_and_counts() -> None:
    w = Writes()
    size = len(encode_record("t", b"x" * 100, 1, False, 0.0))
    q = CacheQueue("b", max_bytes=size * 3, max_age=60, writes=w)
    for i in range(5):
        q.append("t", bytes([65 + i]) * 100, 1, False, 0.0)
    assert len(q) == 3 and q.bytes == size * 3
    assert q.dropped == {"full": 2}
    assert [r.payload[:1] for r in q.unsent(0, 10, 1) if r.payload] == [b"C", b"D", b"E"]


def test_age_bound_drops_what_is_too_old() -> None:
    q = CacheQueue("b", max_bytes=1 << 20, max_age=10, writes=Writes())
    q.append("t", b"old", 1, False, 100.0)
    q.append("t", b"new", 1, False, 105.0)
    assert q.expire(109.9) == 0
    assert q.expire(110.0) == 1
    assert q.dropped == {"expired": 1} and [r.payload for r in q.unsent(0, 5, 1)] == [b"new"]


def test_payloads_past_the_hot_budget_stay_on_disk_and_are_read_back() -> None:
    w = Writes()
    q = CacheQueue("b", max_bytes=1 << 20, max_age=60, writes=w, hot_bytes=120)  # two records of 53 bytes
    for i in range(4):
        q.append("t", bytes([48 + i]) * 40, 1, False, 0.0)
    records = q.unsent(0, 10, 1)
    assert [r.payload is None for r in records] == [False, False, True, True]
    keys = q.cold_keys(records)
    q.warm(records, [w.ops[k] for k in keys])
    assert [r.payload[:1] for r in records if r.payload] == [b"0", b"1", b"2", b"3"]


def test_restore_continues_the_sequence_and_skips_corrupt_records() -> None:
    w = Writes()
    q = CacheQueue("b", max_bytes=1 << 20, max_age=60, writes=w)
    q.restore([(3, encode_record("t", b"a", 1, False, 0.0)), (4, b"junk"), (9, encode_record("t", b"b", 0, True, 0.0))])
    assert q.corrupt == 1 and w.ops[record_key("b", 4)] is None
    assert [r.seq for r in q.unsent(0, 10, 1)] == [3, 9]
    assert q.append("t", b"c", 1, False, 0.0) == 10


async def test_group_commit_makes_records_durable_and_a_crash_keeps_them() -> None:
    store = MemoryQueueStore()
    committer = Committer(store, run_write=_inline)
    q = CacheQueue("b", max_bytes=1 << 20, max_age=60, writes=committer)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(committer.run)
        for i in range(10):
            q.append("t", str(i).encode(), 1, False, 0.0)
        epoch = committer.write_epoch
        await committer.durable(epoch)
        assert store.writes == 1  # ten appends, one synced write
        sent = q.unsent(0, 3, committer.durable_epoch)
        for r in sent:
            q.ack(r.seq)
        await committer.durable(committer.write_epoch)  # the deletes: written, not synced
        nursery.cancel_scope.cancel()
    store.crash()  # kill -9: what was not synced is gone, what was synced stays
    q2 = CacheQueue("b", max_bytes=1 << 20, max_age=60, writes=Writes())
    q2.restore((int.from_bytes(k[-8:], "big"), v) for k, v in store.items())
    # Nothing acknowledged to a publisher is lost; the 3 sent may come again (at least once).
    assert [r.payload for r in q2.unsent(0, 20, 1)] == [str(i).encode() for i in range(10)]


async def _inline(fn: object) -> None:
    assert callable(fn)
    fn()
    await trio.lowlevel.checkpoint()
