"""The delayed driver on Trio's MockClock: messages fire at their due time to the
virtual millisecond, through a restart (late, oldest first), and a whole node fires
a delayed retained message at its instant."""

from __future__ import annotations

import random
from pathlib import Path

import trio
import trio.testing

from clock import TrioClock
from delayed.service import DelayedMessages, DelayedRunner, PublishHooks
from mesh.compose import build_node
from mesh.doorbell import Doorbell
from mqtt import EMPTY_PROPERTIES, Properties
from routing.links import AckGate
from session_store.model import Message
from session_store.store import MemoryDisk, MemoryStore
from tests.support import node_settings

EPOCH = 1_800_000_000.0


class Recorder:
    """The broker's publish path, as a list of (wall time, message); with `remote`,
    every message is forwarded to one node whose acknowledgement the test gives."""

    def __init__(self, clock: TrioClock, remote: bool = False) -> None:
        self.clock = clock
        self.remote = remote
        self.published: list[tuple[float, Message]] = []
        self.replays: list[bool] = []
        self.gates: list[AckGate] = []

    def publish(self, msg: Message, now: float, *, gate: AckGate | None = None, replay: bool = False) -> int:
        assert now == self.clock.wall()
        self.published.append((now, msg))
        self.replays.append(replay)
        if self.remote and gate is not None:
            gate.waiting += 1
            self.gates.append(gate)
        return 1


async def commit_forever(store: MemoryStore, dirty: Doorbell) -> None:
    """The node's committer in `sync` durability, inline."""
    while True:
        await dirty.wait()
        dirty.clear()
        while store.has_pending():
            batch, epoch = store.take_batch()
            store.write_batch(batch, sync=True)
            store.mark_durable(epoch)


def message(n: int, topic: str = "t", props: Properties = EMPTY_PROPERTIES) -> Message:
    return Message(topic, str(n).encode(), 1, False, props, msg_id=n, origin="n1")


async def start(nursery: trio.Nursery, disk: MemoryDisk, clock: TrioClock, window: int = 2048,
                remote: bool = False, hooks: PublishHooks | None = None) -> tuple[DelayedMessages, Recorder, MemoryStore]:
    dirty = Doorbell()
    store = MemoryStore(on_dirty=dirty.ring, disk=disk)
    bell = Doorbell()
    messages = DelayedMessages(store=store, clock=clock, node_id="n1", max_delay=4294967, on_change=bell.ring,
                               window=window)
    recorder = Recorder(clock, remote)
    runner = DelayedRunner(messages=messages, publisher=recorder, clock=clock, doorbell=bell,
                           routes_known=lambda: True, hooks=hooks)
    nursery.start_soon(commit_forever, store, dirty)
    nursery.start_soon(runner.run)
    return messages, recorder, store


def test_every_message_fires_at_its_due_millisecond_through_window_loads() -> None:
    async def main() -> None:
        clock = TrioClock(wall_epoch=EPOCH)
        rng = random.Random(3)
        async with trio.open_nursery() as nursery:
            messages, recorder, _ = await start(nursery, MemoryDisk(), clock, window=16)
            due: dict[int, float] = {}
            for n in range(1000):
                await trio.sleep(rng.uniform(0, 0.01))
                entry = messages.accept(message(n), rng.randint(0, 30), clock.wall())
                due[n] = entry.due
            await trio.sleep(31)
            assert len(recorder.published) == 1000
            for at, msg in recorder.published:
                assert due[msg.msg_id] <= at < due[msg.msg_id] + 0.001
            assert [m.msg_id for _, m in recorder.published] == sorted(due, key=lambda n: (due[n], n))
            assert messages.pending == 0 and messages.stats.fired == 1000 and messages.stats.late == 0
            assert len(messages.schedule) == 0
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_messages_due_while_down_fire_at_start_oldest_first_and_count_late() -> None:
    disk = MemoryDisk()

    async def before_kill() -> None:
        clock = TrioClock(wall_epoch=EPOCH)
        async with trio.open_nursery() as nursery:
            messages, recorder, store = await start(nursery, disk, clock)
            for n, delay in enumerate([20, 5, 10, 3600]):
                messages.accept(message(n), delay, clock.wall())
            await trio.sleep(1)
            assert store.durable_epoch == store.write_epoch  # acknowledged: on the disk
            assert recorder.published == []
            nursery.cancel_scope.cancel()  # kill -9: nothing more runs

    async def after_restart() -> None:
        clock = TrioClock(wall_epoch=EPOCH + 60)  # back a minute later
        async with trio.open_nursery() as nursery:
            messages, recorder, _ = await start(nursery, disk, clock)
            assert messages.pending == 4
            await trio.sleep(0.001)
            assert [(at - EPOCH, m.msg_id) for at, m in recorder.published] == [(60, 1), (60, 2), (60, 0)]
            assert messages.stats.late == 3 and messages.pending == 1
            await trio.sleep(3600 - 60 - 0.002)
            assert len(recorder.published) == 3
            await trio.sleep(0.003)
            assert recorder.published[-1][1].msg_id == 3 and messages.stats.late == 3
            nursery.cancel_scope.cancel()

    trio.run(before_kill, clock=trio.testing.MockClock(autojump_threshold=0))
    trio.run(after_restart, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_cancelled_message_never_fires_and_an_earlier_one_wakes_the_driver() -> None:
    async def main() -> None:
        clock = TrioClock(wall_epoch=EPOCH)
        async with trio.open_nursery() as nursery:
            messages, recorder, _ = await start(nursery, MemoryDisk(), clock)
            late = messages.accept(message(1), 100, clock.wall())
            await trio.sleep(1)
            soon = messages.accept(message(2), 5, clock.wall())  # earlier than the one the driver sleeps for
            assert messages.cancel(late.id) is not None
            assert messages.cancel(late.id) is None
            await trio.sleep(5.0005)
            assert [(at, m.msg_id) for at, m in recorder.published] == [(soon.due, 2)]
            await trio.sleep(200)
            assert len(recorder.published) == 1 and messages.stats.cancelled == 1
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_whole_node_publishes_a_delayed_retained_message_at_its_instant(tmp_path: Path) -> None:
    async def main() -> None:
        node = build_node(node_settings(str(tmp_path / "node")), clock=TrioClock(wall_epoch=EPOCH))
        async with trio.open_nursery() as nursery:
            await nursery.start(node.serve)
            delayed = node.broker.delayed
            assert delayed is not None
            now = node.clock.wall()
            msg = node.broker.make_message("plant/7", b"on", 1, True, EMPTY_PROPERTIES, "c1", now)
            delayed.accept(msg, 30, now)
            # Its message expiry counts from the original publish: 10 s, gone before its time.
            short = node.broker.make_message("plant/8", b"on", 1, True, Properties(message_expiry_interval=10),
                                             "c1", now)
            delayed.accept(short, 30, now)
            start_at = trio.current_time()
            await trio.sleep_until(start_at + 29.999)
            assert node.broker.retained.get("plant/7") is None
            await trio.sleep_until(start_at + 30.002)
            assert node.broker.retained.get("plant/7") is not None
            assert node.broker.retained.get("plant/8") is None
            assert node.broker.stats.messages_in[1] == 1
            node.request_shutdown()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_fired_message_stays_stored_until_its_forward_is_acknowledged_and_fires_again_as_a_replay() -> None:
    disk = MemoryDisk()

    async def before_kill() -> None:
        clock = TrioClock(wall_epoch=EPOCH)
        async with trio.open_nursery() as nursery:
            messages, recorder, store = await start(nursery, disk, clock, remote=True)
            messages.accept(message(1), 5, clock.wall())
            messages.accept(message(2), 6, clock.wall())
            await trio.sleep(5.5)
            assert [m.msg_id for _, m in recorder.published] == [1] and recorder.replays == [False]
            recorder.gates[0].waiting = 0  # the remote node acknowledged message 1
            await trio.sleep(0.6)
            assert [m.msg_id for _, m in recorder.published] == [1, 2]
            assert store.durable_epoch == store.write_epoch
            assert messages.pending == 0
            assert messages.page(None, 10) == []  # fired: no longer listed, acknowledged or not
            # kill -9 now: message 2 was sent, its forward never acknowledged
            nursery.cancel_scope.cancel()

    async def after_restart() -> None:
        clock = TrioClock(wall_epoch=EPOCH + 30)
        async with trio.open_nursery() as nursery:
            messages, recorder, _ = await start(nursery, disk, clock, remote=True)
            assert messages.pending == 1
            await trio.sleep(0.001)
            assert [m.msg_id for _, m in recorder.published] == [2]
            assert recorder.replays == [True]  # the receiver drops it if it took it before
            assert messages.stats.late == 1
            nursery.cancel_scope.cancel()

    trio.run(before_kill, clock=trio.testing.MockClock(autojump_threshold=0))
    trio.run(after_restart, clock=trio.testing.MockClock(autojump_threshold=0))


class SlowHooks:
    """A message.publish chain: a callback that takes 50 ms (a bridge's durable enqueue),
    drops `t/drop` and stamps the rest."""

    message_publish = ("one callback",)

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def run_publish(self, message: Message) -> Message | None:
        self.seen.append(message.topic)
        await trio.sleep(0.05)
        if message.topic == "t/drop":
            return None
        return Message(message.topic, message.payload + b"!", message.qos, message.retain, message.properties,
                       msg_id=message.msg_id, origin=message.origin)


def test_message_publish_callbacks_see_a_delayed_message_when_it_is_published() -> None:
    async def main() -> None:
        clock = TrioClock(wall_epoch=EPOCH)
        hooks = SlowHooks()
        async with trio.open_nursery() as nursery:
            messages, recorder, _ = await start(nursery, MemoryDisk(), clock, hooks=hooks)
            messages.accept(message(1, "t/drop"), 5, clock.wall())
            kept = messages.accept(message(2, "t/keep"), 5, clock.wall())
            await trio.sleep(1)
            assert hooks.seen == []  # not at receipt: at its time, on its target topic
            await trio.sleep(4.2)
            assert hooks.seen == ["t/drop", "t/keep"]
            assert [(m.topic, m.payload) for _, m in recorder.published] == [("t/keep", b"2!")]
            assert recorder.published[0][0] == kept.due + 0.1  # after both callbacks' awaits
            assert messages.stats.dropped_by_hook == 1 and messages.stats.fired == 1 and messages.pending == 0
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_page_of_cancelled_messages_whose_deletes_are_not_written_yet_does_not_stall_the_later_ones() -> None:
    # A page read past the window can hold only messages cancelled since the last
    # commit (their rows still on disk, hidden): the window stayed empty, the driver
    # saw nothing due and waited for a doorbell that never came.  Found by the
    # schedule's property test (tests/delayed/test_schedule.py).
    disk = MemoryDisk()
    ids: list[str] = []

    async def before_kill() -> None:
        clock = TrioClock(wall_epoch=EPOCH)
        async with trio.open_nursery() as nursery:
            messages, _, store = await start(nursery, disk, clock, window=4)
            ids.extend(messages.accept(message(n), 10 + n, clock.wall()).id for n in range(12))
            await trio.testing.wait_all_tasks_blocked()  # the committer is done
            assert store.durable_epoch == store.write_epoch
            nursery.cancel_scope.cancel()

    async def after_restart() -> None:
        clock = TrioClock(wall_epoch=EPOCH)
        store = MemoryStore(on_dirty=lambda: None, disk=disk)  # no committer: the cancels' deletes stay unwritten
        bell = Doorbell()
        messages = DelayedMessages(store=store, clock=clock, node_id="n1", max_delay=4294967, on_change=bell.ring,
                                   window=4)
        recorder = Recorder(clock)
        runner = DelayedRunner(messages=messages, publisher=recorder, clock=clock, doorbell=bell,
                               routes_known=lambda: True)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(runner.run)
            await trio.testing.wait_all_tasks_blocked()
            assert messages.schedule.next_due() == EPOCH + 10  # the first page (messages 0-3) is loaded
            for n in range(4, 8):
                assert messages.cancel(ids[n]) is not None
            await trio.sleep(30)
            assert [(round(at - EPOCH, 3), m.msg_id) for at, m in recorder.published] == [
                (10.0 + n, n) for n in (0, 1, 2, 3, 8, 9, 10, 11)]
            assert store.has_pending()  # the deletes were never written
            nursery.cancel_scope.cancel()

    trio.run(before_kill, clock=trio.testing.MockClock(autojump_threshold=0))
    trio.run(after_restart, clock=trio.testing.MockClock(autojump_threshold=0))
