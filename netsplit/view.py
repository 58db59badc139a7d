"""The node's view of partitions: the detector's state plus a short history, asked
by the API, ``$SYS``, metrics and security.

No Trio: the composition (``mesh.compose``) builds it first and gives it to security
(its ``in_minority``) and to the ``PartitionMonitor`` that feeds it.  Times in the history
are on the trace clock: the detector's monotonic seconds plus the clock's offset
from wall time, taken once, so that entries stay comparable however long we run.
"""

from __future__ import annotations

import collections
from typing import Iterable
from clock import Clock

from .detector import PartitionDetected, PartitionDetector, PartitionHealed
from .records import event_json

HISTORY = 50
Event = PartitionDetected | PartitionHealed


class PartitionView:
    def __init__(self, detector: PartitionDetector, *, clock: Clock) -> None:
        self.detector = detector
        self.clock = clock
        self.history: collections.deque[dict[str, object]] = collections.deque(maxlen=HISTORY)
        self._offset: float | None = None

    @property
    def node_id(self) -> str:
        return self.detector.node_id

    @property
    def clock_offset(self) -> float:
        """Wall minus monotonic seconds, read once (under a MockClock the two drift
        apart, so re-reading would move old events)."""
        if self._offset is None:
            self._offset = self.clock.wall() - self.clock.now()
        return self._offset

    def record(self, events: list[Event]) -> None:
        for ev in events:
            self.history.append(event_json(ev, self.clock_offset))

    # ------------------------------------------------------------------ queries

    def is_partitioned(self) -> bool:
        """A partition was detected and has not healed yet."""
        return self.detector.is_partitioned()

    def in_minority(self) -> bool:
        """This node is on the minority side of a partition that has not healed."""
        return self.detector.in_minority()

    def unreachable(self) -> frozenset[str]:
        """Members currently dead in our view that did not leave (they may come back)."""
        return self.detector.unreachable()

    def across_partition(self, member: str) -> bool:
        """Is ``member`` on the other side of a partition that has not healed?"""
        return self.detector.across_partition(member)

    def lost_to_majority(self, member: str) -> bool:
        """Is ``member`` lost as the majority side sees it, this node on that side
        (``PartitionDetector.lost_to_majority``)?"""
        return self.detector.lost_to_majority(member, self.clock.now())

    def holds_majority(self, members: Iterable[str]) -> bool:
        """Do ``members`` with this node hold the majority of the last stable view?"""
        return self.detector.holds_majority(members)

    @property
    def detected_total(self) -> int:
        return self.detector.detected_total

    @property
    def healed_total(self) -> int:
        return self.detector.healed_total

    def snapshot(self) -> dict[str, object]:
        """Current partitions and recent history, JSON-able (no member list: that is
        gossip's, added by ``PartitionMonitor.snapshot``)."""
        d = self.detector
        return {
            "partitioned": d.is_partitioned(),
            "minority": d.in_minority(),
            "partitions": [p.as_dict(self.clock_offset) for p in d.active.values()],
            "unreachable": sorted(d.unreachable()),
            "stable_view": sorted(d.stable_view),
            "detected_total": d.detected_total,
            "healed_total": d.healed_total,
            "history": list(self.history),
        }
