"""The outbox's delivery log (`replication.outbox`): each delivery's changes appended as
they come, its last state read off at batch time.  Whatever the changes, sessions and
batch sizes, every batch it gives is the one the outbox before the log gave
(`outbox_reference`): the same sessions cut at the same numbers with the same items
and counts, and an epoch no later than that one's (the same while no batch was cut),
so `sync` mode never acknowledges earlier than before."""

from __future__ import annotations

import random

import pytest

from mqtt import EMPTY_PROPERTIES
from replication.outbox import Outbox, Sinks
from session_store.model import Delivery, Message
from session_store.store import NO_RECORD
from tests.replication import outbox_reference


def _no_later(new: int | None, old: int | None) -> bool:
    """`new` holds acknowledgements at least as long as `old` (None: holds none)."""
    return old is None or (new is not None and new <= old)


class Twin:
    """The same changes into the outbox and the reference, batches compared."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.new = Outbox()
        self.old = outbox_reference.Outbox()
        self.seq = {cid: 1000 * (i + 1) for i, cid in enumerate(("a", "b", "c"))}
        self.live: dict[str, list[Delivery]] = {cid: [] for cid in self.seq}
        self.epoch = 0
        self.n = 0
        self.cut = False  # a batch was cut: epochs may be older than the reference's since

    def delivery(self, cid: str) -> None:
        rng = self.rng
        live = self.live[cid]
        if not live or rng.random() < 0.3:
            self.n += 1
            d = Delivery(Message("t", b"p", 1, False, EMPTY_PROPERTIES, msg_id=self.n, origin="n1"),
                         rng.choice((1, 2)), False, ())
            d.seq = self.n
            live.append(d)
            state = 0
        else:
            d = rng.choice(live)
            state = rng.choice((1 | rng.randrange(1, 9) << 2, 2 | 3 << 2, 0, NO_RECORD, NO_RECORD))
            if state == NO_RECORD and rng.random() < 0.7:
                live.remove(d)
        self.seq[cid] += 1
        self.epoch += rng.choice((0, 1, 1, 3))
        self.new.add_delivery(self.epoch, cid, self.seq[cid], d, state)
        self.old.add_delivery(self.epoch, cid, self.seq[cid], d, state)

    def other(self, cid: str) -> None:
        rng = self.rng
        kind = rng.choice("msqwxS")
        self.epoch += rng.choice((0, 1))
        epoch: int | None = self.epoch
        if kind in "xS":
            # At the session's current number, as `_place`'s end and a resync's snapshot
            if rng.random() < 0.5:
                epoch = None
            if kind == "S":
                self.new.snapshot_first(epoch, cid, self.seq[cid])
                self.old.snapshot_first(epoch, cid, self.seq[cid])
                return
        else:
            self.seq[cid] += 1
        self.new.add(epoch, cid, self.seq[cid], kind, kind, None)
        self.old.add(epoch, cid, self.seq[cid], kind, kind, None)

    def take(self) -> None:
        rng = self.rng
        limit = rng.choice((1, 2, 3, 5, 8, 13, 50, 2000))
        compact = rng.random() < 0.5
        new = self.new.take(limit, compact)
        old = self.old.take(limit, compact)
        assert [(t.client_id, t.first, t.last, t.count, t.items, t.snapshot) for t in new] == \
            [(t.client_id, t.first, t.last, t.count, t.items, t.snapshot) for t in old]
        # A session still pending after its part was taken was cut: from then on its
        # epochs may be older than the reference's (the log keeps its first one).
        self.cut = self.cut or any(o.client_id in self.old._sessions for o in old)
        for n, o in zip(new, old):
            assert _no_later(n.epoch, o.epoch)
            if not self.cut:
                assert n.epoch == o.epoch
        self.compare()

    def compare(self) -> None:
        assert bool(self.new) == bool(self.old)
        assert len(self.new) == len(self.old)
        for cid in self.seq:
            assert self.new.count(cid) == self.old.count(cid)
        assert _no_later(self.new.oldest(), self.old.oldest())
        if not self.cut:
            assert self.new.oldest() == self.old.oldest()


@pytest.mark.parametrize("seed", range(60))
def test_every_batch_is_the_one_the_outbox_before_the_log_gave(seed: int) -> None:
    rng = random.Random(seed)
    twin = Twin(rng)
    sessions = list(twin.seq)[: rng.choice((1, 2, 3))]
    for _ in range(600):
        cid = rng.choice(sessions)
        op = rng.random()
        if op < 0.75:
            twin.delivery(cid)
        elif op < 0.85:
            twin.other(cid)
        elif op < 0.995:
            twin.take()
        else:
            twin.new.clear()
            twin.old.clear()
        twin.compare()
    while twin.old:
        twin.take()
    assert not twin.new and twin.new.oldest() is None


def test_a_sessions_sinks_are_let_go_when_its_log_is_taken() -> None:
    """The service appends to a log only while its `Sinks` are valid: an outbox that
    takes, cuts to nothing or drops the log says so (else changes would be appended to
    a log no batch reads again)."""
    outbox = Outbox()
    sinks = Sinks()
    d = Delivery(Message("t", b"p", 1, False, EMPTY_PROPERTIES, msg_id=1, origin="n1"), 1, False, ())
    sinks.logs = [outbox.log_of("c", 5, 7, sinks)]
    sinks.replicas = ["n1"]
    sinks.logs[0].append((5, "d", d, 0))
    assert outbox.oldest() == 7 and outbox.count("c") == 1
    assert [t.items for t in outbox.take(2000, True)] == [[(5, "d", d, 0)]]
    assert sinks.replicas is None and not outbox
    sinks.logs = [outbox.log_of("c", 6, 9, sinks)]
    sinks.replicas = ["n1"]
    outbox.clear()
    assert sinks.replicas is None
