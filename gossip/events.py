"""Facts the SWIM state machine reports to its driver (frozen, past tense)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ALIVE = "alive"
SUSPECT = "suspect"
DEAD = "dead"
LEFT = "left"
STATES = (ALIVE, SUSPECT, DEAD, LEFT)


@dataclass(frozen=True, slots=True)
class MemberChanged:
    """This node's view of ``member`` moved to ``state``."""

    ts_us: int
    member: str
    address: tuple[str, int]
    state: str
    incarnation: int
    origin: str
    origin_ts_us: int
    event_id: str
    hops: int

    def __post_init__(self) -> None:
        if self.state not in STATES:
            raise ValueError(f"unknown member state {self.state!r}")


@dataclass(frozen=True, slots=True)
class BroadcastReceived:
    """A user broadcast seen for the first time (``local``: we originated it)."""

    ts_us: int
    kind: str
    key: str
    origin: str
    origin_ts_us: int
    event_id: str
    hops: int
    payload: Any
    local: bool


@dataclass(frozen=True, slots=True)
class ProbeFailed:
    """Our own probe of ``target`` got no ack: we accused it (simulator statistics)."""

    ts_us: int
    target: str
    started: float
