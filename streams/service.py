"""The node's streams: appends on the publish path, one cursor per replay subscription,
the cluster query that serves this node's part, and retention's compaction.

Built by `mesh.compose` before the broker (the broker calls `append` for every
message published through this node) and run by the node (`run`: the cursors'
nursery and the compaction loop). Other nodes read this node's part with the cluster
query `stream_read` (`routing.queries`: a stream of its own per page, so an older
node that does not know the query closes it, and such a node holds no stream):

    -> {s: stream filter, f: subscription filter, a: after}
    <- {m: [[position, message record], ...], k: last key read, end: bool, t: trimmed}
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, replace
from typing import Any, Awaitable, Callable, Iterable, Mapping, Protocol, Sequence, TypeVar

import trio

from clock import Clock
from mqtt import EMPTY_PROPERTIES, Properties, ReasonCode
from mqtt.topics import topic_matches
from routing.queries import QueryFailed, QueryUnanswered
from session_store import records
from session_store.model import Message
from streams import position as positions
from streams.cursor import FetchedPage, FetchFailed, ReplayCursor, ReplaySink, StreamTap
from streams.position import PositionClock
from streams.request import ReplayRefused, ReplayRequest
from streams.retention import over_limits, plan_cut
from streams.spec import StreamSpec, matching, parse_specs, stream_for
from streams.store import StreamBackend, StreamStore

log = logging.getLogger("meshd.streams")

T = TypeVar("T")
Offload = Callable[[Callable[[], T]], Awaitable[T]]

READ_QUERY = "stream_read"
PAGE_MESSAGES = 512
PAGE_BYTES = 1 << 20
SCAN_LIMIT = 20_000  # records read for one page at most (a filter that matches few)
PAGE_TIMEOUT = 10.0  # a busy node may take a while to read a page; a dead one fails at once (connection refused)
COMPACT_INTERVAL = 1.0
DURABLE_POLL = 0.002


class StreamQueries(Protocol):
    def handle(self, query: str, handler: Callable[[str, Mapping[str, Any]], Awaitable[object]]) -> None: ...
    async def ask(self, peer: str, query: str, args: Mapping[str, object], timeout: float = ...) -> object: ...


class Members(Protocol):
    def members(self) -> Sequence[Mapping[str, Any]]: ...
    def member_state(self, member_id: str) -> str | None: ...


class RouteView(Protocol):
    def has_route(self, node: str, topic_filter: str) -> bool: ...


class StreamDisk(StreamBackend, Protocol):
    """The session store: streams' records, and how far its writes are durable."""

    @property
    def write_epoch(self) -> int: ...

    @property
    def durable_epoch(self) -> int: ...


async def _in_thread(fn: Callable[[], T]) -> T:
    return await trio.to_thread.run_sync(fn)


@dataclass(frozen=True, slots=True)
class ReplayOpened:
    tap: StreamTap
    user_properties: tuple[tuple[str, str], ...]


class StreamService:
    def __init__(self, *, node_id: str, clock: Clock, store: StreamDisk, specs: Iterable[StreamSpec],
                 recovered_meta: Mapping[str, object], queries: StreamQueries, members: Members, routes: RouteView,
                 offload: Offload[Any] | None = None) -> None:
        self.node_id = node_id
        self.clock = clock
        self.disk = store
        self.store = StreamStore(store)
        self.store.recover(recovered_meta)
        self.positions = PositionClock(node_id)
        for stats in self.store.stats.values():
            if stats.newest and positions.origin(stats.newest) == node_id:
                self.positions.observe(stats.newest)
        self.specs: tuple[StreamSpec, ...] = tuple(specs)
        self.queries = queries
        self.members = members
        self.routes = routes
        self.offload: Offload[Any] = offload if offload is not None else _in_thread
        self.taps: dict[object, StreamTap] = {}
        self._nursery: trio.Nursery | None = None
        self.appended = 0
        self.replays_started = 0
        self.pages_served = 0
        self.trimmed_total = 0
        queries.handle(READ_QUERY, self._answer_read)

    # -- configuration -------------------------------------------------------------------

    def set_specs(self, raw: object) -> None:
        """The streams in effect (a cluster-wide change: `mesh.config_sync`)."""
        self.specs = parse_specs(raw)
        log.info("streams: %s", ", ".join(s.filter for s in self.specs) or "none")

    # -- the publish path (the broker, synchronous) --------------------------------------

    def append(self, msg: Message, now: float) -> Message:
        """Keep a message published through this node in every stream it belongs to;
        the message to route on (with its `position` user property) if it was kept."""
        specs = self.specs
        if not specs:
            return msg
        streams = [s for s in matching(specs, msg.topic) if s.keeps(msg.properties.user_properties)]
        if not streams:
            return msg
        position = self.positions.next(int(now * 1000))
        # A publisher's own `position` property would lie about the order: replaced.
        props = msg.properties
        if props is EMPTY_PROPERTIES:  # the common case, without dataclasses.replace's 28 getattrs
            props = Properties(user_properties=(("position", position),))
        else:
            user = tuple(p for p in props.user_properties if p[0] != "position") + (("position", position),)
            props = replace(props, user_properties=user)
        kept = Message(msg.topic, msg.payload, msg.qos, msg.retain, props, msg.expires_at, msg.publisher, msg.msg_id,
                       msg.origin)
        for spec in streams:
            self.store.append(spec.filter, position, kept)
        self.appended += 1
        return kept

    # -- replay subscriptions (the client, synchronous) ----------------------------------

    def open_replay(self, sink: ReplaySink, request: ReplayRequest, qos: int,
                    subscription_ids: tuple[int, ...]) -> ReplayOpened:
        """Start a replay for a client; raises ReplayRefused (the SUBACK code and why)."""
        spec = stream_for(self.specs, request.topic_filter)
        if spec is None:
            raise ReplayRefused(ReasonCode.TOPIC_FILTER_INVALID,
                                f"no stream holds {request.topic_filter!r} (streams: "
                                + (", ".join(s.filter for s in self.specs) or "none") + ")")
        if self._nursery is None:
            raise ReplayRefused(ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR, "streams are not running on this node")
        origins, down = self._origins()
        tap = self.taps.get(sink)
        if tap is None:
            tap = self.taps[sink] = StreamTap(sink)
        cursor = ReplayCursor(tap=tap, request=request, stream=spec.filter, qos=qos, subscription_ids=subscription_ids,
                              origins=origins, fetch=self._fetch, clock=self.clock)
        tap.add(cursor)
        self._nursery.start_soon(self._run_cursor, cursor)
        self.replays_started += 1
        props: list[tuple[str, str]] = [("stream", spec.filter)]
        if down:
            props.append(("missing", ",".join(down)))
        stats = self.store.stats.get(spec.filter)
        if stats is not None and stats.trimmed and stats.trimmed > request.after:
            props.append(("truncated", "1"))
        return ReplayOpened(tap, tuple(props))

    async def _run_cursor(self, cursor: ReplayCursor) -> None:
        try:
            await cursor.run()
        except Exception:
            # A bug in one replay ends that replay (its client keeps the live
            # subscription), never the node.
            log.exception("replay of %s failed", cursor.topic_filter)

    def client_gone(self, sink: object) -> None:
        tap = self.taps.pop(sink, None)
        if tap is not None:
            tap.close()

    def _origins(self) -> tuple[list[str], list[str]]:
        """The nodes whose parts a replay reads (every member that has not left), and
        those of them held dead now."""
        origins, down = [self.node_id], []
        for member in self.members.members():
            node, state = member["id"], member["state"]
            if node == self.node_id or state == "left":
                continue
            origins.append(node)
            if state == "dead":
                down.append(node)
        return origins, sorted(down)

    # -- reading parts -------------------------------------------------------------------

    async def _fetch(self, node: str, stream: str, sub_filter: str, after: str) -> FetchedPage:
        args = {"s": stream, "f": sub_filter, "a": after}
        if node == self.node_id:
            reply: object = await self._answer_read(node, args)
        else:
            if self.members.member_state(node) not in ("alive", "suspect"):
                raise FetchFailed("not alive")
            try:
                reply = await self._ask_read(node, args)
            except _HoldsNoPart:
                return FetchedPage([], after, True, "")
        try:
            return _page_from_wire(reply, after)
        except (records.RecordError, KeyError, TypeError, ValueError) as exc:
            raise FetchFailed(f"bad page ({exc})") from None

    async def _ask_read(self, node: str, args: Mapping[str, object]) -> object:
        """A member's answer to a page read; _HoldsNoPart for a version without streams,
        FetchFailed when its part cannot be read now."""
        try:
            return await self._ask_read_once(node, args)
        except QueryUnanswered:
            # A version without cluster queries closes every query unanswered, and so
            # does a member killed while it read the page (its kernel closes the
            # socket). Only the first closes a second query too: the dead one refuses
            # it. Taking a dead member for an old one would end the replay without its
            # part and with no `missing` marker.
            try:
                return await self._ask_read_once(node, args)
            except QueryUnanswered:
                log.info("%s closed two stream reads unanswered: a version without streams, it holds no part", node)
                raise _HoldsNoPart() from None

    async def _ask_read_once(self, node: str, args: Mapping[str, object]) -> object:
        try:
            return await self.queries.ask(node, READ_QUERY, args, timeout=PAGE_TIMEOUT)
        except QueryUnanswered:
            raise
        except QueryFailed as exc:
            if str(exc).startswith("unknown query"):
                raise _HoldsNoPart() from None  # a version with cluster queries but without streams
            raise FetchFailed(str(exc)) from None

    async def _answer_read(self, peer: str, args: Mapping[str, Any]) -> object:
        stream, sub_filter, after = args["s"], args["f"], args["a"]
        if not all(isinstance(v, str) for v in (stream, sub_filter, after)):
            raise TypeError("s, f and a are strings")
        # Asked first: if the asker's route is known now, every message stored after
        # now is forwarded to it, so the end of this read is the start of its live ones.
        forwards = peer == self.node_id or self.routes.has_route(peer, sub_filter)
        epoch = self.disk.write_epoch
        while self.disk.durable_epoch < epoch:  # what was published before now is on disk
            await trio.sleep(DURABLE_POLL)
        matches = None if sub_filter == stream else functools.partial(topic_matches, sub_filter)
        page = await self.offload(functools.partial(self.store.read_page, stream, matches, after, limit=PAGE_MESSAGES,
                                                    max_bytes=PAGE_BYTES, scan_limit=SCAN_LIMIT))
        self.pages_served += 1
        stats = self.store.stats.get(stream)
        return {"m": [[p, v] for p, v in page.records], "k": page.last_key, "end": page.end and forwards,
                "t": stats.trimmed if stats is not None else ""}

    # -- the node's task -----------------------------------------------------------------

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            try:
                while True:
                    await trio.sleep(COMPACT_INTERVAL)
                    try:
                        await self.compact()
                    except Exception:
                        log.exception("stream compaction failed; trying again in %g s", COMPACT_INTERVAL)
            finally:
                self._nursery = None
                for tap in self.taps.values():
                    tap.close()

    async def compact(self) -> int:
        """One round of retention over every stream; how many records went."""
        removed = 0
        for spec in self.specs:
            stats = self.store.stats.get(spec.filter)
            now_ms = int(self.clock.wall() * 1000)
            if stats is None or not over_limits(spec, stats.messages, stats.bytes, stats.oldest, now_ms):
                continue
            cut = await self.offload(functools.partial(
                lambda s, st, n: plan_cut(s, self.store.oldest_first(s.filter), st.messages, st.bytes, n),
                spec, stats, now_ms))
            if cut is not None:
                self.store.apply_cut(spec.filter, cut)
                removed += cut.messages
                self.trimmed_total += cut.messages
        return removed

    # -- the operator's view -------------------------------------------------------------

    def part_counts(self) -> dict[str, tuple[int, int]]:
        """(messages, bytes) of this node's part of every configured stream (metrics)."""
        out = {}
        for spec in self.specs:
            stats = self.store.stats.get(spec.filter)
            out[spec.filter] = (stats.messages, stats.bytes) if stats is not None else (0, 0)
        return out

    def describe(self) -> list[dict[str, object]]:
        """Every configured stream with this node's counters (`GET /api/v1/streams`)."""
        out: list[dict[str, object]] = []
        for spec in self.specs:
            stats = self.store.stats.get(spec.filter)
            out.append({
                "filter": spec.filter, "max_age_s": spec.max_age_s, "max_bytes": spec.max_bytes,
                "max_messages": spec.max_messages, "keep": spec.keep,
                "messages": stats.messages if stats else 0, "bytes": stats.bytes if stats else 0,
                "oldest": stats.oldest if stats else "", "newest": stats.newest if stats else "",
                "trimmed": stats.trimmed if stats else "",
                "replays": sum(1 for tap in self.taps.values() for c in tap.cursors.values() if c.stream == spec.filter),
            })
        return out


class _HoldsNoPart(Exception):
    """The member is a version without streams: it keeps no stream messages."""


def _page_from_wire(reply: object, after: str) -> FetchedPage:
    if not isinstance(reply, dict):
        raise TypeError(f"a page is a map, not {type(reply).__name__}")
    found: list[tuple[str, Message]] = []
    for item in reply["m"]:
        pos, value = item
        if not isinstance(pos, str) or not isinstance(value, bytes) or not positions.is_position(pos) or pos <= after:
            raise ValueError(f"bad record {pos!r}")
        found.append((pos, records.decode_message(value)))
    last_key, end, trimmed = reply["k"], reply["end"], reply.get("t", "")
    if not isinstance(last_key, str) or not isinstance(end, bool) or not isinstance(trimmed, str):
        raise TypeError("k, end and t")
    return FetchedPage(found, last_key, end, trimmed)
