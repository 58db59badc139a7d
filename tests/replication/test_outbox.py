"""The owner's side of the replication stream (`replication.outbox` and the batches
`Replication` builds from it): whatever the changes and wherever a batch is cut, a
replica applying the batches in order never meets a gap and, once everything is
sent, holds exactly the owner's session; `sync` mode's floor never passes a change
whose state has not been taken for the replica."""

from __future__ import annotations

import random
import types
from typing import Any

import pytest

from mqtt import EMPTY_PROPERTIES
from replication import service
from replication.changes import ReplicaCopy, apply_changes
from replication.outbox import Outbox
from replication.service import Replication
from session_store.model import Delivery, Message, Session, SubscriptionOptions
from session_store.store import NO_RECORD


class _Clock:
    def now(self) -> float:
        return 0.0

    def wall(self) -> float:
        return 1_700_000_000.0


class _Store:
    write_epoch = 1
    write_failed = None

    def put_meta(self, key: str, value: object) -> None: ...

    def delete_meta(self, key: str) -> None: ...

    def when_locally_durable(self, epoch: int, callback: Any) -> None:
        callback()

    def hold_durable(self, floor: int | None) -> None: ...

    def on_session_change(self, tap: object) -> None: ...


class _Broker:
    def __init__(self) -> None:
        self.sessions: dict[str, Session] = {}

    def on_durable(self) -> None: ...


class _Queries:
    def handle(self, *args: object) -> None: ...

    def handle_pipelined(self, *args: object) -> None: ...


class _Members:
    def alive_members(self) -> list[str]:
        return ["n0", "n1", "n2"]


class _Claims:
    def get(self, client_id: str) -> object:
        return types.SimpleNamespace(owner="n0", stamp=types.SimpleNamespace(to_wire=lambda: [1, 0, "n0"]))


def owner(mode: str = "sync") -> tuple[Replication, _Store, Session]:
    broker, store = _Broker(), _Store()
    fakes: dict[str, Any] = {"store": store, "broker": broker, "queries": _Queries(), "members": _Members(),
                             "clock": _Clock()}
    r = Replication(node_id="n0", copies=2, mode=mode, **fakes)
    claims: Any = _Claims()
    r.use_claims(claims)
    session = Session("c", True, expiry_interval=3600)
    broker.sessions["c"] = session
    return r, store, session


def message(n: int) -> Message:
    return Message(f"t/{n}", str(n).encode(), 1, False, EMPTY_PROPERTIES, msg_id=n, origin="n1")


class Run:
    """An owner's session changing at random, batches taken for its replica at random
    (cut short by a small `MAX_BATCH`), and the replica's copy applying them."""

    def __init__(self, rng: random.Random, compact: bool | None) -> None:
        self.rng = rng
        self.compact = compact
        self.r, self.store, self.session = owner()
        tracked = self.r._track("c")
        assert tracked is not None and len(tracked.replicas) == 1
        self.peer = self.r._peers[tracked.replicas[0]]
        self.copy: ReplicaCopy | None = None
        self.live: dict[int, tuple[Delivery, int]] = {}  # the owner's deliveries: seq -> (delivery, state)
        self.subscriptions: dict[str, SubscriptionOptions] = {}
        self.unsent: dict[Delivery, int] = {}  # deliveries changed since a batch took them: first epoch
        self.n = 0

    def delivery(self, d: Delivery, state: int) -> None:
        self.store.write_epoch += 1
        self.unsent.setdefault(d, self.store.write_epoch)
        if state == NO_RECORD:
            self.live.pop(d.seq, None)
        else:
            self.live[d.seq] = (d, state)
        self.r.delivery_changed("c", d, state)

    def step(self) -> None:
        rng = self.rng
        op = rng.random()
        if op < 0.35 or not self.live:
            self.n += 1
            d = Delivery(message(self.n), 1, False, ())
            d.seq = self.session.next_seq
            self.session.next_seq += 1
            self.delivery(d, 0)
        elif op < 0.6:
            d, _ = self.live[rng.choice(list(self.live))]
            self.delivery(d, 1 | rng.randrange(1, 65536) << 2)
        elif op < 0.85:
            d, _ = self.live[rng.choice(list(self.live))]
            self.delivery(d, NO_RECORD)
        elif op < 0.9:
            d, _ = self.live[rng.choice(list(self.live))]
            self.delivery(d, NO_RECORD)  # leaves the window, back in the queue
            self.delivery(d, 0)
        elif op < 0.95:
            self.store.write_epoch += 1
            self.r.session_changed("c", 3600, 5, None, self.session.next_seq)
        else:
            f = f"s/{rng.randrange(4)}"
            self.store.write_epoch += 1
            if f in self.subscriptions and rng.random() < 0.5:
                del self.subscriptions[f]
                self.r.subscription_changed("c", f, None)
            else:
                self.subscriptions[f] = SubscriptionOptions(rng.randrange(3))
                self.r.subscription_changed("c", f, self.subscriptions[f])

    def batch(self) -> None:
        compact = self.rng.random() < 0.5 if self.compact is None else self.compact
        number, taken, request = self.r._next_batch(self.peer, compact=compact)
        for part in taken:
            for item in part.items:
                if item[1] == "d":
                    self.unsent.pop(item[2], None)
        for cid, stamp, session_changes in request:
            assert cid == "c"
            if not compact:
                assert all(ch[1] != "N" for ch in session_changes)
            result = apply_changes(self.copy, cid, "n0", stamp, session_changes)
            assert not result.resync, session_changes
            self.copy = result.copy
        self.r._confirmed(self.peer, number, taken, {"r": [], "x": []})
        if self.unsent:
            oldest = self.peer.oldest()
            assert oldest is not None and oldest <= min(self.unsent.values())

    def check_whole(self) -> None:
        copy = self.copy
        assert copy is not None
        tracked = self.r._tracked["c"]
        assert copy.seq == tracked.seq
        assert {dseq: state for dseq, (state, _) in copy.deliveries.items()} == \
            {dseq: state for dseq, (_, state) in self.live.items()}
        assert all(wire[0]["p"] == self.live[dseq][0].message.payload for dseq, (_, wire) in copy.deliveries.items())
        assert set(copy.subscriptions) == set(self.subscriptions)
        assert self.peer.oldest() is None and self.r.lag() == 0


@pytest.mark.parametrize("seed", range(40))
def test_batches_cut_anywhere_keep_the_copy_whole_and_the_floor_below_what_is_unsent(
        seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(seed)
    monkeypatch.setattr(service, "MAX_BATCH", rng.choice([2, 3, 5, 8, 13, 50, 2000]))
    run = Run(rng, compact=None if seed % 3 == 0 else bool(seed % 3 - 1))
    run.batch()  # the snapshot
    for _ in range(400):
        run.step()
        if rng.random() < 0.2:
            run.batch()
            if not run.peer.outbox:
                run.check_whole()
    while run.peer.outbox:
        run.batch()
    run.check_whole()


def test_a_delivery_queued_sent_and_acknowledged_between_batches_costs_the_replica_one_skip() -> None:
    run = Run(random.Random(1), compact=True)
    run.batch()
    for _ in range(100):
        run.n += 1
        d = Delivery(message(run.n), 1, False, ())
        d.seq = run.session.next_seq
        run.session.next_seq += 1
        run.delivery(d, 0)
        run.delivery(d, 1 | 7 << 2)
        run.delivery(d, NO_RECORD)
    _, _, request = run.r._next_batch(run.peer, compact=True)
    assert [ch[1:] for ch in request[0][2]] == [["N", 300]]


def test_a_delivery_gone_before_the_replica_had_it_goes_as_a_no_op_even_behind_a_later_one_sent() -> None:
    """A subscriber with messages in flight acknowledges the oldest after newer ones
    were sent: in a batch, a delivery's last change (gone) comes after a later
    delivery's (sent).  The replica had it only if an earlier batch gave it; one first
    seen in this batch as gone is a no-op, however high the deliveries sent before it
    in the batch go.  Those the replica had go as removals."""
    run = Run(random.Random(1), compact=True)
    run.batch()

    def new() -> Delivery:
        run.n += 1
        d = Delivery(message(run.n), 1, False, ())
        d.seq = run.session.next_seq
        run.session.next_seq += 1
        return d

    had = [new() for _ in range(5)]
    for i, d in enumerate(had):
        run.delivery(d, 1 | (i + 1) << 2)
    run.batch()  # the replica has the first five, in flight
    fresh = [new() for _ in range(10)]
    for i, d in enumerate(fresh):
        run.delivery(d, 1 | (i + 6) << 2)  # sent ...
        if i < 5:
            run.delivery(had[i], NO_RECORD)  # ... while the oldest in flight is acknowledged
        else:
            run.delivery(fresh[i - 5], NO_RECORD)  # never on the replica
    requests: list[Any] = []
    take = run.r._next_batch

    def recorded(peer: Any, compact: bool = False) -> Any:
        batch = take(peer, compact=compact)
        requests.append(batch[2])
        return batch

    setattr(run.r, "_next_batch", recorded)
    run.batch()
    changes = requests[0][0][2]
    removed = [ch[2] for ch in changes if ch[1] == "d" and ch[3] == NO_RECORD]
    assert removed == [d.seq for d in had]
    assert [ch[2] for ch in changes if ch[1] == "d" and ch[3] != NO_RECORD] == [d.seq for d in fresh[5:]]
    while run.peer.outbox:
        run.batch()
    run.check_whole()


def test_a_resync_snapshot_stands_for_everything_pending_of_its_session() -> None:
    box = Outbox()
    d = Delivery(message(1), 1, False, ())
    box.add_delivery(5, "c", 11, d, 0)
    box.add(6, "c", 12, "m", (0, 5, None), 2)
    box.snapshot_first(5, "c", 12)
    (part,) = box.take(2000, compact=True)
    assert part.snapshot and part.items[0][1] == "S" and part.epoch == 5 and not box
