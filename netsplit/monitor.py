"""The node's partition monitor: the Trio shell around ``PartitionDetector``.

Subscribes to ``GossipService.on_member_change``, feeds the detector with Trio's
clock, sleeps until the detector's next deadline, and turns its facts into traces
(``partition_detected`` / ``partition_healed``), one log line each, counters, a
short history and callbacks.  Everything the rest of the node asks goes through
the small query API below; nothing here decides anything the detector does not.
"""

from __future__ import annotations

import collections
import logging
import math
import time
from typing import Any, Callable

import trio

from gossip.trace import NullTraceWriter, TraceWriter

from .detector import PartitionDetected, PartitionHealed, detector_for
from .records import describe, event_json, trace_fields

log = logging.getLogger("meshd.netsplit")

HISTORY = 50
Event = PartitionDetected | PartitionHealed


class PartitionMonitor:
    def __init__(self, gossip: Any, trace: TraceWriter | NullTraceWriter, *, node_id: str | None = None) -> None:
        self.gossip = gossip
        self.trace = trace
        self.node_id = node_id or gossip.node_id
        self.detector = detector_for(self.node_id, gossip.config)
        self.history: collections.deque[dict[str, Any]] = collections.deque(maxlen=HISTORY)
        self._handlers: list[Callable[[Event], None]] = []
        self._wake = trio.Event()
        self._offset = time.time() - trio.current_time() if _in_trio() else 0.0
        gossip.on_member_change(self._member_changed)
        gossip.partitions = self

    # ------------------------------------------------------------------ public API

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

    def on_event(self, handler: Callable[[Event], None]) -> None:
        """``handler(PartitionDetected | PartitionHealed)`` after each is traced."""
        self._handlers.append(handler)

    @property
    def detected_total(self) -> int:
        return self.detector.detected_total

    @property
    def healed_total(self) -> int:
        return self.detector.healed_total

    def snapshot(self) -> dict[str, Any]:
        """Members, current partitions and recent history, JSON-able."""
        d = self.detector
        return {
            "node_id": self.node_id,
            "members": self.gossip.members(),
            "partitioned": d.is_partitioned(),
            "minority": d.in_minority(),
            "partitions": [p.as_dict(self._offset) for p in d.active.values()],
            "unreachable": sorted(d.unreachable()),
            "stable_view": sorted(d.stable_view),
            "detected_total": d.detected_total,
            "healed_total": d.healed_total,
            "history": list(self.history),
        }

    async def run(self) -> None:
        self._offset = time.time() - trio.current_time()
        while True:
            deadline = self.detector.next_deadline()
            self._wake = trio.Event()
            with trio.move_on_at(deadline if deadline is not None else math.inf):
                await self._wake.wait()
            self._publish(self.detector.tick(trio.current_time()))

    # ------------------------------------------------------------------ internals

    def _member_changed(self, member: str, state: str) -> None:
        self._publish(self.detector.member_changed(member, state, trio.current_time()))
        self._wake.set()

    def _publish(self, events: list[Event]) -> None:
        for ev in events:
            self.trace.emit(origin=self.node_id, **trace_fields(ev, self._offset, self.gossip.config))
            self.history.append(event_json(ev, self._offset))
            (log.warning if isinstance(ev, PartitionDetected) else log.info)("%s", describe(ev))
            for h in self._handlers:
                try:
                    h(ev)
                except Exception:  # a subscriber's bug must not stop detection
                    log.exception("partition handler %r failed", h)


def _in_trio() -> bool:
    try:
        trio.lowlevel.current_task()
    except RuntimeError:
        return False
    return True
