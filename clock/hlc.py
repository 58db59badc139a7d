"""Hybrid logical clocks (Kulkarni et al.): timestamps that follow wall time but never
go backwards and always order a change after every change it has seen.

Pure: the wall clock is passed in (milliseconds).  A timestamp is the tuple
`(wall_ms, logical, node_id)`; comparing tuples gives the order used for
last-writer-wins registers, with the node id breaking exact ties (DESIGN.md, 5).
"""

from __future__ import annotations

from typing import NamedTuple


class HlcTimestamp(NamedTuple):
    wall_ms: int
    logical: int
    node: str

    def to_wire(self) -> list[int | str]:
        return [self.wall_ms, self.logical, self.node]

    @classmethod
    def from_wire(cls, data: object) -> "HlcTimestamp":
        if not isinstance(data, (list, tuple)) or len(data) != 3:
            raise ValueError("bad HLC timestamp")
        wall, logical, node = data
        if not isinstance(wall, int) or not isinstance(logical, int) or not isinstance(node, str):
            raise ValueError("bad HLC timestamp")
        return cls(wall, logical, node)

    def __str__(self) -> str:
        return f"{self.wall_ms}.{self.logical}@{self.node}"


class HybridLogicalClock:
    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.wall_ms = 0
        self.logical = 0

    def now(self, wall_ms: int) -> HlcTimestamp:
        """A timestamp for a local event."""
        if wall_ms > self.wall_ms:
            self.wall_ms, self.logical = wall_ms, 0
        else:
            self.logical += 1
        return HlcTimestamp(self.wall_ms, self.logical, self.node_id)

    def observe(self, remote: HlcTimestamp, wall_ms: int) -> None:
        """Move past a timestamp received from another node."""
        top = max(self.wall_ms, remote.wall_ms, wall_ms)
        if top == self.wall_ms == remote.wall_ms:
            self.logical = max(self.logical, remote.logical) + 1
        elif top == self.wall_ms:
            self.logical += 1
        elif top == remote.wall_ms:
            self.logical = remote.logical + 1
        else:
            self.logical = 0
        self.wall_ms = top
