"""The Trio side of one client's replay subscriptions.

`StreamTap` belongs to one client connection: the client asks it about every delivery
before sending it (`intercept`), so that while a replay reads the stored parts, the
subscription's live messages go to the merge (`streams.merge`) instead of the wire.
`ReplayCursor` is one replay subscription: it asks nodes for pages (one outstanding
page per node: the flow control that keeps a replay of a gigabyte out of memory),
feeds the merge and delivers what it releases, one message at a time, only while the
client's inflight window and outbox have room.
"""

from __future__ import annotations

import json
import logging
from collections import deque
from dataclasses import dataclass
from typing import Awaitable, Callable, Iterable, Protocol

import trio

from clock import Clock
from mqtt import Properties
from mqtt.topics import topic_matches
from session_store.model import Delivery, Message
from streams.merge import Marker, Record, ReplayMerge
from streams.request import ReplayRequest

log = logging.getLogger("meshd.streams")

POSITION_PROPERTY = "position"
RETRY_MISSING = 1.0  # seconds between two attempts to read a missing node's part
POLL_TAIL = 0.05  # a node with nothing new yet and no route to us: ask again after this
ROOM_POLL = 0.05  # no window room: look again after this (an ack wakes us sooner)
MARKER_PREFIX = "$replay/"


class FetchFailed(Exception):
    """A node's part cannot be read now (down, unreachable, no answer)."""


@dataclass(frozen=True, slots=True)
class FetchedPage:
    records: list[tuple[str, Message]]
    last_key: str
    end: bool
    trimmed: str


# (node, stream, subscription filter, after) -> the node's next page
Fetcher = Callable[[str, str, str, str], Awaitable[FetchedPage]]


class ReplaySink(Protocol):
    """The client connection a replay delivers to (`mesh.client.Client`)."""

    @property
    def closing(self) -> bool: ...

    def replay_has_room(self) -> bool: ...

    def deliver(self, delivery: Delivery, now: float) -> None: ...


def position_of(msg: Message) -> str | None:
    for name, value in msg.properties.user_properties:
        if name == POSITION_PROPERTY:
            return value
    return None


class ReplayCursor:
    def __init__(self, *, tap: "StreamTap", request: ReplayRequest, stream: str, qos: int,
                 subscription_ids: tuple[int, ...], origins: Iterable[str], fetch: Fetcher, clock: Clock) -> None:
        self.tap = tap
        self.request = request
        self.topic_filter = request.topic_filter
        self.stream = stream
        self.qos = qos
        self.subscription_ids = subscription_ids
        self.fetch = fetch
        self.clock = clock
        self.merge = ReplayMerge(request.after, origins)
        self.scope = trio.CancelScope()
        self._pending: deque[Record | Marker] = deque()
        self._changed = trio.Event()
        self._room = trio.Event()

    # -- called from the client (synchronous) -------------------------------------------

    def offer_live(self, msg: Message, position: str) -> bool:
        """True if the cursor takes the live message (held, dropped, or queued behind
        replayed ones); False: the client delivers it now."""
        record = Record(position, msg)
        now = self.merge.live(record)
        # What the merge released before this one goes first (a node that just went
        # live releases its held messages, which this one must not overtake).
        self._pending.extend(self.merge.take())
        if now and not self._pending:
            return False
        if now:
            self._pending.append(record)
        self._changed.set()
        return True

    def wake(self) -> None:
        self._room.set()

    # -- the task ------------------------------------------------------------------------

    async def run(self) -> None:
        with self.scope:
            try:
                async with trio.open_nursery() as nursery:
                    while not self.tap.sink.closing:
                        self._changed = trio.Event()
                        for node, after in self.merge.to_fetch():
                            nursery.start_soon(self._fetch, node, after)
                        self._pending.extend(self.merge.take())
                        await self._send_pending()
                        await self._changed.wait()
                    nursery.cancel_scope.cancel()
            finally:
                self.tap.cursor_ended(self)

    async def _fetch(self, node: str, after: str) -> None:
        try:
            page = await self.fetch(node, self.stream, self.topic_filter, after)
        except FetchFailed as exc:
            log.info("replay of %s: the part of %s is missing: %s", self.topic_filter, node, exc)
            self.merge.failed(node)
            self._changed.set()
            await trio.sleep(RETRY_MISSING)
            self.merge.retry(node)
            self._changed.set()
            return
        if not page.records and not page.end:
            await trio.sleep(POLL_TAIL)  # caught up, but the node does not forward to us yet
        self.merge.page(node, [Record(p, m) for p, m in page.records], page.last_key, page.end, page.trimmed)
        self._changed.set()

    async def _send_pending(self) -> None:
        sink = self.tap.sink
        pending = self._pending
        while pending and not sink.closing:
            if not sink.replay_has_room():
                self._room = trio.Event()
                with trio.move_on_after(ROOM_POLL):
                    await self._room.wait()
                continue
            item = pending.popleft()
            msg = item.item if isinstance(item, Record) else self._marker(item)
            assert isinstance(msg, Message)
            self.tap.push(Delivery(msg, min(msg.qos, self.qos), False, self.subscription_ids), self.clock.wall())
            if not pending:
                pending.extend(self.merge.take())

    def _marker(self, marker: Marker) -> Message:
        """`$replay/<kind>/<node>`: a node's part is missing, recovered, or starts later
        than asked (retention removed what was before)."""
        body = {"node": marker.origin, "filter": self.topic_filter}
        props: list[tuple[str, str]] = [("replay", marker.kind), ("node", marker.origin)]
        if marker.kind == "truncated":
            body["first"] = marker.detail
            props.append(("truncated", "1"))
        elif marker.kind == "missing":
            props.append(("missing", marker.origin))
        return Message(f"{MARKER_PREFIX}{marker.kind}/{marker.origin}", json.dumps(body).encode(), min(1, self.qos),
                       False, Properties(user_properties=tuple(props)), origin=None)


class StreamTap:
    """One client's replay subscriptions, by filter."""

    def __init__(self, sink: ReplaySink) -> None:
        self.sink = sink
        self.cursors: dict[str, ReplayCursor] = {}
        self._pushing = False

    def intercept(self, delivery: Delivery) -> bool:
        """Whether a replay takes this delivery (the client must not send it now)."""
        if self._pushing or not self.cursors:
            return False
        msg = delivery.message
        for cursor in self.cursors.values():
            if topic_matches(cursor.topic_filter, msg.topic):
                position = position_of(msg)
                if position is None:
                    return True  # not kept in the stream: not part of a replay subscription
                return cursor.offer_live(msg, position)
        return False

    def push(self, delivery: Delivery, now: float) -> None:
        self._pushing = True
        try:
            self.sink.deliver(delivery, now)
        finally:
            self._pushing = False

    def add(self, cursor: ReplayCursor) -> None:
        old = self.cursors.pop(cursor.topic_filter, None)
        if old is not None:
            old.scope.cancel()
        self.cursors[cursor.topic_filter] = cursor

    def remove(self, topic_filter: str) -> None:
        cursor = self.cursors.pop(topic_filter, None)
        if cursor is not None:
            cursor.scope.cancel()

    def room(self) -> None:
        for cursor in self.cursors.values():
            cursor.wake()

    def close(self) -> None:
        for cursor in list(self.cursors.values()):
            cursor.scope.cancel()
        self.cursors.clear()

    def cursor_ended(self, cursor: ReplayCursor) -> None:
        if self.cursors.get(cursor.topic_filter) is cursor:
            del self.cursors[cursor.topic_filter]
