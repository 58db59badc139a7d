"""Facts the SWIM state machine reports to its driver (frozen, past tense), and the
one enum of member states every package uses."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class MemberState(StrEnum):
    """A member's state as one node sees it.  A ``str``: JSON, traces
    (``member_alive``) and the API keep the plain strings."""

    ALIVE = "alive"
    SUSPECT = "suspect"
    DEAD = "dead"
    LEFT = "left"  # dead by its own word: a graceful leave


ALIVE = MemberState.ALIVE
SUSPECT = MemberState.SUSPECT
DEAD = MemberState.DEAD
LEFT = MemberState.LEFT


@dataclass(frozen=True, slots=True)
class MemberChanged:
    """This node's view of ``member`` moved to ``state``."""

    ts_us: int
    member: str
    address: tuple[str, int]
    state: MemberState
    incarnation: int
    origin: str
    origin_ts_us: int
    event_id: str
    hops: int

    def __post_init__(self) -> None:
        if not isinstance(self.state, MemberState):
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
    payload: object  # whatever the origin broadcast (CBOR-encodable)
    local: bool


@dataclass(frozen=True, slots=True)
class ProbeFailed:
    """Our own probe of ``target`` got no ack: we accused it (simulator statistics)."""

    ts_us: int
    target: str
    started: float


SwimEvent = MemberChanged | BroadcastReceived | ProbeFailed
