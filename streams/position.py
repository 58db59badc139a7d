"""Stream positions: a message's place in the cluster-wide order of a stream, as a
string whose plain string order is that order.

A position is the hybrid logical clock stamp of the publish on the node that accepted
it, plus that node's id: `<wall ms, 12 hex>-<logical, 8 hex>-<node id>`, e.g.
`018c2f3a4b5c-00000000-n1`. The two numbers are fixed width and lower-case hex, and the
node id comes last, so comparing strings compares (wall ms, logical, node) tuples:
positions from one node grow with every publish there, ties between nodes are broken
by the node id, and a consumer may keep the string as an opaque cursor.

Pure: the wall clock is passed in.
"""

from __future__ import annotations

import re
from datetime import datetime

EARLIEST = ""  # the exclusive lower bound below every position
_POSITION = re.compile(r"[0-9a-f]{12}-[0-9a-f]{8}-[A-Za-z0-9_.-]{1,128}")
_MAX_WALL = (1 << 48) - 1
_MAX_LOGICAL = (1 << 32) - 1


class PositionError(ValueError):
    """Not a position, `earliest` or an RFC 3339 time; `str()` says which part is wrong."""


def encode(wall_ms: int, logical: int, node: str) -> str:
    return f"{wall_ms:012x}-{logical:08x}-{node}"


def is_position(text: str) -> bool:
    return _POSITION.fullmatch(text) is not None


def origin(position: str) -> str:
    """The id of the node that accepted the message."""
    return position[22:]


def wall_ms(position: str) -> int:
    return int(position[:12], 16)


def time_bound(wall: float) -> str:
    """The exclusive bound just below every position stamped at or after `wall`
    (epoch seconds): `<wall ms>-` sorts before `<wall ms>-00000000-...`."""
    return f"{max(0, int(wall * 1000)):012x}-"


def parse_start(text: str) -> str:
    """`earliest`, a position or an RFC 3339 time, as the exclusive lower bound of a
    replay: a replay gets the messages whose position is greater. A position means
    "after this one" (a consumer resumes after the last message it processed); a time
    means "stamped at or after it"."""
    if text == "earliest":
        return EARLIEST
    if is_position(text):
        return text
    if "T" in text.upper() and (":" in text):
        try:
            when = datetime.fromisoformat(text.replace("z", "Z"))
        except ValueError:
            raise PositionError(f"{text!r} is neither a position nor an RFC 3339 time") from None
        if when.tzinfo is None:
            raise PositionError(f"{text!r} has no time zone offset (RFC 3339 needs Z or +hh:mm)")
        return time_bound(when.timestamp())
    raise PositionError(f"{text!r} is not earliest, a position (like 018c2f3a4b5c-00000000-n1) or an RFC 3339 time")


class PositionClock:
    """One node's position stamps: a hybrid logical clock that never repeats a stamp,
    not even across a restart whose wall clock went back (`observe` the positions found
    on disk at start)."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.wall_ms = 0
        self.logical = 0

    def next(self, wall_ms: int) -> str:
        if wall_ms > self.wall_ms:
            self.wall_ms, self.logical = min(wall_ms, _MAX_WALL), 0
        else:
            self.logical += 1
            if self.logical > _MAX_LOGICAL:  # 4 billion stamps in one millisecond: borrow the next
                self.wall_ms, self.logical = self.wall_ms + 1, 0
        return encode(self.wall_ms, self.logical, self.node_id)

    def observe(self, position: str) -> None:
        """Move past a stamp (one of ours found on disk)."""
        stamp = (wall_ms(position), int(position[13:21], 16))
        if stamp > (self.wall_ms, self.logical):
            self.wall_ms, self.logical = stamp
