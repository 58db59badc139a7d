"""One node's part of every stream, in the session store's `streams` family.

Key: `<stream filter> \\0 <position>`, so one stream's records sort together and in
stream order, and a read from a position is one iterator from one key (MQTT strings
cannot contain U+0000). Value: the message as the retained-message record
(`session_store.records.encode_message`), its user property `position` included.

Appends go into the store's open batch like every other change (so a QoS 1/2
publisher's acknowledgement waits for them under the node's durability rule, and no
I/O happens on the Trio thread); reads and retention's scans are blocking and run off
the Trio thread (`streams.service`); retention's cut is one range tombstone recorded
in the batch, so compaction never blocks a publish.

Per stream the node keeps counters (messages, bytes, oldest and newest position), read
once at start (one scan of the family), and the newest position retention removed
(meta `streams/trimmed/<filter>`), which tells a replay from before it that it starts
later than asked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Mapping, Protocol

from session_store import records
from session_store.model import Message
from streams.retention import Cut

FAMILY = "streams"
TRIMMED_META = "streams/trimmed/"


class StreamBackend(Protocol):
    """The session store, as far as streams use it."""

    def put_stream_record(self, key: bytes, value: bytes) -> None: ...
    def delete_stream_range(self, start: bytes, end: bytes) -> None: ...
    def iter_range(self, cf: str, start: bytes, end: bytes | None = None) -> Iterator[tuple[bytes, bytes]]: ...
    def put_meta(self, key: str, value: object) -> None: ...


@dataclass(slots=True)
class StreamStats:
    messages: int = 0
    bytes: int = 0
    oldest: str = ""
    newest: str = ""
    trimmed: str = ""  # the newest position retention removed


@dataclass(frozen=True, slots=True)
class Page:
    records: list[tuple[str, bytes]]  # (position, encoded message) matching the filter
    last_key: str  # the last position read, matching or not
    end: bool  # nothing after last_key (as of the read)


def prefix(stream: str) -> bytes:
    return stream.encode("utf-8") + b"\x00"


def _prefix_end(stream: str) -> bytes:
    return stream.encode("utf-8") + b"\x01"


def _key(stream: str, after: str) -> bytes:
    return prefix(stream) + after.encode("ascii")


class StreamStore:
    def __init__(self, backend: StreamBackend) -> None:
        self.backend = backend
        self.stats: dict[str, StreamStats] = {}

    # -- start-up (blocking: one scan of the family) -------------------------------------

    def recover(self, meta: Mapping[str, object]) -> None:
        stats = self.stats
        for key, value in self.backend.iter_range(FAMILY, b""):
            stream_b, _, pos_b = key.partition(b"\x00")
            try:
                stream, pos = stream_b.decode("utf-8"), pos_b.decode("ascii")
            except UnicodeDecodeError:
                continue
            s = stats.get(stream)
            if s is None:
                s = stats[stream] = StreamStats(oldest=pos)
            s.messages += 1
            s.bytes += len(key) + len(value)
            s.newest = pos
        for name, trimmed in meta.items():
            if name.startswith(TRIMMED_META) and isinstance(trimmed, str):
                stats.setdefault(name[len(TRIMMED_META):], StreamStats()).trimmed = trimmed

    # -- the Trio thread -----------------------------------------------------------------

    def append(self, stream: str, position: str, msg: Message) -> None:
        key = _key(stream, position)
        value = records.encode_message(msg)
        self.backend.put_stream_record(key, value)
        s = self.stats.get(stream)
        if s is None:
            s = self.stats[stream] = StreamStats()
        if not s.messages:
            s.oldest = position
        s.messages += 1
        s.bytes += len(key) + len(value)
        s.newest = position

    def apply_cut(self, stream: str, cut: Cut) -> None:
        """Record retention's cut (one range tombstone) and its counters."""
        self.backend.delete_stream_range(prefix(stream), _key(stream, cut.last) + b"\x00")
        s = self.stats[stream]
        s.messages = max(0, s.messages - cut.messages)
        s.bytes = max(0, s.bytes - cut.bytes)
        s.trimmed = max(s.trimmed, cut.last)
        s.oldest = (cut.kept or s.newest) if s.messages else ""
        self.backend.put_meta(TRIMMED_META + stream, s.trimmed)

    # -- blocking reads (off the Trio thread) --------------------------------------------

    def read_page(self, stream: str, matches: "MatchFn | None", after: str, *, limit: int, max_bytes: int,
                  scan_limit: int) -> Page:
        """Up to `limit` records (and about `max_bytes`) after `after` whose topic
        `matches` (None: every record of the stream), reading at most `scan_limit` records."""
        found: list[tuple[str, bytes]] = []
        size = scanned = 0
        last_key = after
        cut = len(prefix(stream))
        for key, value in self.backend.iter_range(FAMILY, _key(stream, after) + b"\x00", _prefix_end(stream)):
            pos = key[cut:].decode("ascii")
            last_key = pos
            scanned += 1
            if matches is None or matches(records.decode_message(value).topic):
                found.append((pos, value))
                size += len(value)
            if len(found) >= limit or size >= max_bytes or scanned >= scan_limit:
                return Page(found, last_key, False)
        return Page(found, last_key, True)

    def oldest_first(self, stream: str) -> Iterator[tuple[str, int]]:
        """(position, stored bytes) from the oldest record on (retention's scan)."""
        cut = len(prefix(stream))
        for key, value in self.backend.iter_range(FAMILY, prefix(stream), _prefix_end(stream)):
            yield key[cut:].decode("ascii"), len(key) + len(value)

    def first_position(self, stream: str) -> str:
        for pos, _ in self.oldest_first(stream):
            return pos
        return ""


class MatchFn(Protocol):
    def __call__(self, topic: str) -> bool: ...
