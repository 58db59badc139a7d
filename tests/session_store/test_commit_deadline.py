"""`batch` durability writes a delivery only when its deadline comes: the committer
ticks every half window and each tick holds back the deliveries first changed in the
last half window (`take_batch(hold=1)`).  So a delivery acknowledged before its deadline
never reaches the disk, and one still unacknowledged at its deadline is on disk within
the window (what `kill -9` may lose is bounded by `durability_batch_ms`)."""

from __future__ import annotations

import threading
import time

from mqtt import EMPTY_PROPERTIES, Properties, Puback, Subscribe, Subscription
from session_store.model import Delivery, Message
from session_store.store import EARLY_WRITE_BUDGET, MemoryStore
from tests.mesh.test_broker_raw import Raw
from tests.support import Client, MeshdProcess


def delivery(seq: int) -> Delivery:
    d = Delivery(Message(f"t/{seq}", b"p", 1, False, EMPTY_PROPERTIES, None, "pub", seq, "A"), 1, False, ())
    d.seq = seq
    return d


def tick(store: MemoryStore, hold: int = 1) -> tuple[list, list, int]:
    batch, epoch = store.take_batch(hold)
    puts, deletes = [(d.seq, state) for d, state in batch.puts], list(batch.deletes)
    store.write_batch(batch, sync=True)
    store.mark_durable(epoch)
    return puts, deletes, epoch


def test_a_change_is_written_at_the_second_tick_and_not_before():
    store = MemoryStore()
    store.put_session("c", 60, 5, None, 1)
    d = delivery(1)
    store.put_queued("c", d)
    epoch_after_put = store.write_epoch
    puts, _, epoch = tick(store)  # the window closes: nothing due yet
    assert puts == [] and epoch < epoch_after_put and store.has_pending()
    assert store.load().sessions == {}
    puts, _, epoch = tick(store)  # its deadline: written, with the session
    assert puts == [(1, 0)] and epoch >= epoch_after_put and not store.has_pending()
    assert [q.seq for q in store.load().sessions["c"].queue] == [1]


def test_long_lived_deliveries_are_written_once_per_window():
    """Deliveries that outlive their deadline: a tick that writes them takes the newest
    window along (holding it back would cost one more synced write for records that
    most likely outlive their deadline too), so there is one synced write per window."""
    store = MemoryStore()
    store.put_session("c", 60, 5, None, 1)
    tick(store, hold=0)
    writes = []
    for seq in range(1, 7):
        store.put_queued("c", delivery(seq))  # never acknowledged
        puts, _, _ = tick(store)
        writes.append([s for s, _ in puts])
    assert writes == [[], [1, 2], [], [3, 4], [], [5, 6]]
    assert not store.has_pending()


def test_a_mostly_acknowledged_window_holds_a_big_newest_one_back():
    """3 of 4 deliveries due were acknowledged before their deadline: a newest window
    of 2 x EARLY_WRITE_BUDGET deliveries waits for its own deadline (writing it now
    would most likely write 1.5 x the budget in records that need none); a small one
    goes along with the write that is due."""
    for young, along in ((2 * EARLY_WRITE_BUDGET, False), (10, True)):
        store = MemoryStore()
        store.put_session("c", 60, 5, None, 1)
        tick(store, hold=0)
        first = [delivery(seq) for seq in range(1, 5)]
        for d in first:
            store.put_queued("c", d)
        tick(store)  # held
        for d in first[:3]:
            store.release_delivery("c", d)  # acknowledged before the deadline
        for seq in range(5, 5 + young):
            store.put_queued("c", delivery(seq))
        puts, _, _ = tick(store)
        assert [s for s, _ in puts] == [4] + (list(range(5, 5 + young)) if along else [])
        puts, _, _ = tick(store)
        assert [s for s, _ in puts] == ([] if along else list(range(5, 5 + young)))
        assert not store.has_pending()


def one_held_delivery() -> tuple[MemoryStore, Delivery]:
    """A session whose delivery 1 was queued in the window that just closed: held, not due."""
    store = MemoryStore()
    store.put_session("c", 60, 5, None, 1)
    tick(store, hold=0)
    d = delivery(1)
    store.put_queued("c", d)
    tick(store)
    return store, d


def test_acknowledged_before_its_deadline_is_never_written():
    store, d = one_held_delivery()
    store.delete_delivery("c", d)  # leaves the queue...
    store.put_inflight("c", 3, d, "publish")
    store.delete_delivery("c", d)  # ...and is acknowledged before its deadline
    puts, deletes, _ = tick(store)
    assert (puts, deletes) == ([], [])
    tick(store)
    tick(store)
    assert not store.has_pending()
    assert store.load().sessions["c"].queue == [] and store.load().sessions["c"].inflight == []


def test_a_later_change_keeps_the_first_changes_deadline():
    """Queued in one window, sent in the next: written at the first one's deadline, with
    its state at that tick."""
    store, d = one_held_delivery()
    store.put_inflight("c", 7, d, "publish")
    puts, _, _ = tick(store)
    assert puts == [(1, 1 | 7 << 2)]
    assert [(pid, s) for pid, _, s in store.load().sessions["c"].inflight] == [(7, "publish")]


def test_other_changes_follow_the_same_deadline():
    store = MemoryStore()
    store.put_session("c", 60, 5, None, 1)
    store.put_qos2_in("c", 5)
    store.put_retained(Message("r/1", b"x", 1, True, EMPTY_PROPERTIES))
    _, _, epoch = tick(store)
    assert store.load().sessions == {} and epoch == 0
    tick(store)
    state = store.load()
    assert state.sessions["c"].qos2_in == {5} and [m.topic for m in state.retained] == ["r/1"]
    assert not store.has_pending()


def test_a_session_deleted_while_its_deliveries_are_held_leaves_nothing():
    store = MemoryStore()
    store.put_session("c", 60, 5, None, 1)
    tick(store, hold=0)
    store.put_queued("c", delivery(1))
    tick(store)  # held
    store.delete_session("c")
    tick(store)
    tick(store)
    assert store.load().sessions == {} and list(store.scan("queue")) == []


def test_deliveries_acknowledged_before_their_deadline_are_never_written(node_factory):
    """A persistent subscriber that acknowledges every message ~100 ms after it came,
    one message every 40 ms for 1.6 s, window 1000 ms (ticks every 500): no delivery is
    ever written.  (With one commit per window taking everything, every commit would
    find two or three of them unacknowledged and write them.)"""
    node = node_factory(durability="batch", durability_batch_ms=1000)
    store = node.node.store
    written: list[int] = []
    lock = threading.Lock()
    real = store.write_batch

    def counting(batch, *, sync):
        with lock:
            written.append(len(batch.puts))
        real(batch, sync=sync)

    store.write_batch = counting
    raw = Raw(node.mqtt_port)
    raw.connect(client_id="keeper", clean_start=False, properties=Properties(session_expiry_interval=600))
    raw.send(Subscribe(packet_id=1, subscriptions=(Subscription("k/#", 1),)))
    assert type(raw.recv()).__name__ == "Suback"
    pub = Client("pub", version=5)
    pub.connect(node.mqtt_port)
    deadline = time.monotonic() + 5
    while store.has_pending() and time.monotonic() < deadline:  # the session is on disk
        time.sleep(0.05)
    with lock:
        written.clear()
    puts_before = store.stats.delivery_puts
    acks: list[tuple[float, int]] = []
    got: list[bytes] = []
    next_pub, sent, end = time.monotonic(), 0, time.monotonic() + 1.6
    while time.monotonic() < end or acks or len(got) < sent:
        now = time.monotonic()
        if now >= next_pub and now < end:
            pub.publish("k/1", str(sent).encode(), qos=1, wait=False)
            sent += 1
            next_pub += 0.04
        while acks and acks[0][0] <= now:
            raw.send(Puback(packet_id=acks.pop(0)[1]))
        try:
            p = raw.recv(0.005)
        except TimeoutError:
            continue
        got.append(p.payload)
        acks.append((time.monotonic() + 0.1, p.packet_id))
    assert got == [str(i).encode() for i in range(sent)] and sent >= 30
    time.sleep(1.3)  # past every deadline: nothing is left pending
    assert not store.has_pending()
    with lock:
        assert sum(written) == 0, written
    assert store.stats.delivery_puts == puts_before  # what meshd_store_records_written_total shows
    pub.disconnect()


def test_acknowledged_message_survives_kill_9_once_its_deadline_passed(tmp_path):
    data = str(tmp_path / "data")
    flags = ("--durability", "batch", "--durability-batch-ms", "400")
    node = MeshdProcess(data, *flags).start()
    try:
        sub = Client("keeper", version=5, clean=False)
        sub.connect(node.port, expiry=3600)
        sub.subscribe("s/#", 1)
        sub.disconnect()
        time.sleep(0.5)  # the session and subscription are on disk
        pub = Client("pub", version=5)
        pub.connect(node.port)
        pub.publish("s/1", b"early", qos=1)  # PUBACK at once (batch mode)
        time.sleep(0.6)  # past its deadline (400 ms + a tick's slack)
        pub.publish("s/1", b"late", qos=1)  # acknowledged, deadline not passed
        node.kill()
        node = MeshdProcess(data, *flags, port=node.port).start()
        sub2 = Client("keeper", version=5, clean=False)
        flags_, _, _ = sub2.connect(node.port, expiry=3600)
        assert flags_.session_present
        got = [m.payload for m in sub2.expect(1)]
        assert got == [b"early"]
        # "late" was acknowledged just before the kill, within the documented loss
        # window: it may be lost (it is held until its deadline), never duplicated.
        rest = []
        try:
            rest = [m.payload for m in sub2.expect(1, timeout=0.5)]
        except AssertionError:
            pass
        assert rest in ([], [b"late"])
        sub2.disconnect()
    finally:
        node.__exit__()
