"""Retention: which of a stream's oldest records compaction removes on one node.

Pure. A record goes while any limit is exceeded by what would be left (the count or
the bytes with it) or while it is older than `max_age_s`; records are removed oldest
first and the cut stops at the first record that stays, so what is left is always one
contiguous range ending at the newest record (one range tombstone removes the rest).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from streams import position as positions
from streams.spec import StreamSpec


@dataclass(frozen=True, slots=True)
class Cut:
    messages: int
    bytes: int
    last: str  # the newest position removed
    kept: str = ""  # the oldest position left ("" if none or not read)


def over_limits(spec: StreamSpec, messages: int, size: int, oldest: str, now_ms: int) -> bool:
    """Whether compaction has anything to do (cheap: from the stream's counters)."""
    if not messages:
        return False
    if spec.max_messages is not None and messages > spec.max_messages:
        return True
    if spec.max_bytes is not None and size > spec.max_bytes:
        return True
    return spec.max_age_s is not None and bool(oldest) and positions.wall_ms(oldest) < now_ms - spec.max_age_s * 1000


def plan_cut(spec: StreamSpec, oldest_first: Iterable[tuple[str, int]], messages: int, size: int,
             now_ms: int, budget: int = 100_000) -> Cut | None:
    """The records to remove, reading (position, stored bytes) oldest first; at most
    `budget` of them per call (the next round goes on). None when nothing goes."""
    gone = gone_bytes = 0
    last = kept = ""
    age_limit = now_ms - spec.max_age_s * 1000 if spec.max_age_s is not None else None
    for position, record_bytes in oldest_first:
        left, left_bytes = messages - gone, size - gone_bytes
        goes = ((spec.max_messages is not None and left > spec.max_messages)
                or (spec.max_bytes is not None and left_bytes > spec.max_bytes)
                or (age_limit is not None and positions.wall_ms(position) < age_limit))
        if not goes or gone >= budget:
            kept = position
            break
        gone += 1
        gone_bytes += record_bytes
        last = position
    return Cut(gone, gone_bytes, last, kept) if gone else None
