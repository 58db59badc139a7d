"""The node's delayed messages: taken in, kept in the session store's `delayed`
column family, listed, inspected, cancelled, and fired by a small Trio driver.

`DelayedMessages` is synchronous (called on the Trio thread by the client that
received the PUBLISH, by the API, and by the driver); it records every change in the
store's open batch like the broker does, so a QoS >= 1 acknowledgement waits for the
same commit as any other (`mesh.client`). `DelayedRunner` is the driver: it sleeps
until the next due time (the schedule's, a wall time) or a ring of its doorbell (an
earlier message came in), then publishes what is due through the broker's normal
publish path, which reaches every node with a matching route.

What a kill -9 does: a message acknowledged is on disk and fires after the restart
(late, counted, oldest first). A fired message's delete is recorded once every node it
was forwarded to acknowledged it (its `AckGate` is open), so a kill before that fires it
again after the restart, never loses it; such a late firing is forwarded as a replay
with the message's original identity (origin node, message id), and a node that took it
before drops the copy (`routing.cluster`). Exactly once to subscribers on other nodes;
to this node's own subscribers, a kill between a firing and the sync of its delete
(about one commit) delivers it again after the restart: at least once there.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

import trio

from clock import Clock
from delayed.records import DelayedEntry, decode_entry, encode_entry, id_to_key, make_key
from delayed.schedule import DEFAULT_WINDOW, Schedule
from routing.links import AckGate
from session_store.model import Message
from session_store.records import RecordError

log = logging.getLogger("meshd.delayed")

FIRE_BATCH = 512  # entries published per step before the driver lets other tasks run
START_GRACE = 10.0  # seconds the first firing waits at most for the cluster's routes
ROUTES_POLL = 0.05  # seconds between two looks at whether the routes are known
LATENESS_KEPT = 1000  # on-time firings whose lateness the metrics summarize
ACK_POLL = 0.005  # seconds between two looks at the gates of fired messages still unacknowledged
# The delete epoch of a fired message whose delete is not recorded yet: hidden from
# every read of the index until it is.
NOT_YET = 1 << 62


class DelayedStore(Protocol):
    """The session store as delayed publish uses it (`session_store.store.SessionStore`)."""

    @property
    def write_epoch(self) -> int: ...
    @property
    def durable_epoch(self) -> int: ...
    def put_delayed(self, key: bytes, value: bytes) -> None: ...
    def delete_delayed(self, key: bytes) -> None: ...
    def scan_delayed(self, start: bytes, limit: int) -> list[tuple[bytes, bytes]]: ...
    def count_delayed(self) -> int: ...


class Publisher(Protocol):
    """The broker's publish path (`mesh.broker.Broker.publish`)."""

    def publish(self, msg: Message, now: float, *, gate: AckGate | None = ..., replay: bool = ...) -> int: ...


class PublishHooks(Protocol):
    """The message.publish chain (`hooks.Hooks`): rules and bridges see a delayed
    message when it is published, on its target topic, as any other."""

    @property
    def message_publish(self) -> Sequence[object]: ...
    async def run_publish(self, message: Message) -> Message | None: ...


class Bell(Protocol):
    """`mesh.doorbell.Doorbell`: rung by `DelayedMessages` when an earlier message comes in."""

    def clear(self) -> None: ...
    async def wait(self) -> None: ...


@dataclass
class DelayedStats:
    accepted: int = 0
    fired: int = 0
    late: int = 0  # fired after a restart, their time having passed while the node was down
    cancelled: int = 0
    expired: int = 0  # due, but their message expiry had passed: not published
    refused: int = 0  # `$delayed/...` PUBLISHes refused (bad delay or target)
    unreadable: int = 0  # stored records that could not be read (logged, skipped)
    dropped_by_hook: int = 0  # due, and dropped by a message.publish callback (a rule, a plugin)
    # How late the last on-time firings were (ms after their due time), for the metrics.
    lateness_ms: deque[float] = field(default_factory=lambda: deque(maxlen=LATENESS_KEPT))


class DelayedMessages:
    def __init__(self, *, store: DelayedStore, clock: Clock, node_id: str, max_delay: int,
                 on_change: Callable[[], None], window: int = DEFAULT_WINDOW) -> None:
        self.store = store
        self.clock = clock
        self.node_id = node_id
        self.max_delay = max_delay
        self.on_change = on_change
        self.started_at = clock.wall()  # fired before this: late
        self.stats = DelayedStats()
        self.schedule = Schedule(window, pending=store.count_delayed())

    def refused(self) -> None:
        """A `$delayed/...` PUBLISH was refused (counted; the client logs why)."""
        self.stats.refused += 1

    @property
    def pending(self) -> int:
        return self.schedule.pending

    # -- intake ----------------------------------------------------------------------------

    def accept(self, message: Message, delay: int, now: float) -> DelayedEntry:
        """Keep `message` (made at `now`, wall seconds: its expiry counts from then) to
        publish `delay` seconds later. Recorded in the store's open batch: durable at the
        store's next commit of `write_epoch`."""
        store = self.store
        key = make_key(now + delay, message.msg_id)
        store.put_delayed(key, encode_entry(now, message))
        entry = DelayedEntry(key, now, message, store.write_epoch)
        first = self.schedule.next_due()
        self.schedule.add(entry, store.durable_epoch)
        self.stats.accepted += 1
        if first is None or entry.due < first:
            self.on_change()
        return entry

    # -- the operator's questions ----------------------------------------------------------------

    def get(self, ident: str) -> DelayedEntry | None:
        key = id_to_key(ident)
        if key is None:
            return None
        entry, known = self.schedule.find(key)
        if known:
            return entry
        rows = self._read(key, 1)
        return rows[0] if rows and rows[0].key == key else None

    def cancel(self, ident: str) -> DelayedEntry | None:
        """Cancel a pending message; None when there is no such one (fired, cancelled,
        never was)."""
        entry = self.get(ident)
        if entry is None:
            return None
        self.store.delete_delayed(entry.key)
        self.schedule.remove(entry.key, self.store.write_epoch, self.store.durable_epoch)
        self.stats.cancelled += 1
        log.info("delayed message %s to %s cancelled", entry.id, entry.message.topic)
        return entry

    def page(self, after: str | None, limit: int) -> list[DelayedEntry]:
        """Pending messages in due order, after the one with id `after` (None: from the
        first), at most `limit`."""
        start = b""
        if after:
            key = id_to_key(after)
            if key is None:
                raise ValueError(f"after: {after!r} is not a delayed message id")
            start = key + b"\x00"
        schedule = self.schedule
        rows = self._read(start, limit + schedule.hidden())
        return schedule.visible(rows, start, limit)

    def row(self, entry: DelayedEntry) -> dict[str, object]:
        """One message as the API and `meshd ctl delayed` show it."""
        msg = entry.message
        return {
            "id": entry.id,
            "topic": msg.topic,
            "due": entry.due,
            "due_in_s": round(entry.due - self.clock.wall(), 3),
            "received_at": entry.received_at,
            "origin": msg.origin or self.node_id,
            "node": self.node_id,
            "qos": msg.qos,
            "retain": msg.retain,
            "publisher": msg.publisher,
            "payload_bytes": len(msg.payload),
            "expires_at": msg.expires_at,
        }

    # -- the driver's steps ----------------------------------------------------------------

    def load(self) -> None:
        """Read the next windows of the index while the schedule asks for them: a page
        can add nothing (its rows all cancelled or fired, their deletes not written
        yet), and an empty window would look like nothing pending."""
        schedule = self.schedule
        while (start := schedule.wants_load()) is not None:
            schedule.loaded(self._read(start, schedule.window), self.store.durable_epoch)

    def take_due(self, now: float, limit: int) -> list[DelayedEntry]:
        """Due entries (oldest first), out of the schedule; `delete` records them gone
        once they are published for good."""
        due = self.schedule.pop_due(now, limit)
        self.schedule.removed([e.key for e in due], NOT_YET)
        self.schedule.settle(self.store.durable_epoch)
        return due

    def delete(self, keys: list[bytes]) -> None:
        """Record the deletes of fired entries."""
        if keys:
            store = self.store
            for key in keys:
                store.delete_delayed(key)
            self.schedule.removed(keys, store.write_epoch)

    def _read(self, start: bytes, limit: int) -> list[DelayedEntry]:
        out: list[DelayedEntry] = []
        for key, value in self.store.scan_delayed(start, limit):
            try:
                out.append(decode_entry(key, value))
            except RecordError as exc:
                # Never fires and never blocks the index: logged, counted, dropped.
                self.stats.unreadable += 1
                log.error("delayed: dropping unreadable record %r: %s", key, exc)
                self.store.delete_delayed(key)
                self.schedule.remove(key, self.store.write_epoch, self.store.durable_epoch)
        return out


class DelayedRunner:
    """The Trio driver: fires due messages through `publisher` at their time."""

    def __init__(self, *, messages: DelayedMessages, publisher: Publisher, clock: Clock, doorbell: Bell,
                 routes_known: Callable[[], bool], start_grace: float = START_GRACE,
                 hooks: PublishHooks | None = None) -> None:
        self.messages = messages
        self.hooks = hooks
        self.publisher = publisher
        self.clock = clock
        self.doorbell = doorbell
        self.routes_known = routes_known
        self.start_grace = start_grace
        # Fired messages whose forwards are not all acknowledged yet: (gate, key).
        self._unacked: list[tuple[AckGate, bytes]] = []

    async def run(self) -> None:
        # Messages that fell due while the node was down go out at start, but not
        # before this node knows where its cluster's subscribers are (a restarted node
        # starts with no remote routes), or `start_grace` seconds. A node with none
        # pending does not wait (nor wake up to look).
        if self.messages.pending:
            with trio.move_on_after(self.start_grace):
                while not self.routes_known():
                    await trio.sleep(ROUTES_POLL)
        messages = self.messages
        while True:
            self.doorbell.clear()
            messages.load()
            if await self.fire(self.clock.wall()) == FIRE_BATCH:
                await trio.sleep(0)  # more are due: let the connections run between batches
                continue
            due = messages.schedule.next_due()
            delay = math.inf if due is None else max(0.0, due - self.clock.wall())
            if self._unacked:
                delay = min(delay, ACK_POLL)
            with trio.move_on_after(delay):
                await self.doorbell.wait()
            self.settle_acks()

    def settle_acks(self) -> None:
        """Delete the fired messages every node has acknowledged."""
        if self._unacked:
            done = [key for gate, key in self._unacked if not gate.waiting]
            self._unacked = [(gate, key) for gate, key in self._unacked if gate.waiting]
            self.messages.delete(done)

    async def fire(self, now: float) -> int:
        """Publish what is due at `now` (at most FIRE_BATCH); how many were taken. With
        message.publish callbacks, each message passes them first (they may await)."""
        messages = self.messages
        due = messages.take_due(now, FIRE_BATCH)
        stats = messages.stats
        started = messages.started_at
        late = 0
        done: list[bytes] = []
        for entry in due:
            msg = entry.message
            if msg.expired(now):
                stats.expired += 1
                log.info("delayed message %s to %s expired before its time: not published", entry.id, msg.topic)
                done.append(entry.key)
                continue
            hooks = self.hooks
            if hooks is not None and hooks.message_publish:
                hooked = await hooks.run_publish(msg)
                if hooked is None:
                    stats.dropped_by_hook += 1
                    done.append(entry.key)
                    continue
                msg = hooked
                now = self.clock.wall()
            # Due before this start: it may have gone out before a kill -9 (its delete
            # not yet recorded): forwarded as a replay, which a node that took it drops.
            was_due = entry.due < started
            gate = AckGate()
            self.publisher.publish(msg, now, gate=gate, replay=was_due)
            if gate.waiting:
                self._unacked.append((gate, entry.key))
            else:
                done.append(entry.key)
            stats.fired += 1
            if was_due:
                late += 1
            else:
                stats.lateness_ms.append((now - entry.due) * 1000)
        messages.delete(done)
        if late:
            stats.late += late
            log.info("delayed: published %d messages late (due while the node was down), the oldest %.3f s late",
                     late, now - due[0].due)
        return len(due)
