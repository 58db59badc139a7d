"""The node's partition monitor: the Trio shell around ``PartitionDetector``.

Subscribes to the gossip service's member changes, feeds the detector with the
injected clock, sleeps until the detector's next deadline, and turns its facts into
traces (``partition_detected`` / ``partition_healed``), one log line each
(``partition.opened`` / ``partition.healed``), the
view's history and callbacks.  Everything the rest of the node asks goes through
the small query API below (or the ``PartitionView`` it shares with gossip); nothing
here decides anything the detector does not.
"""

from __future__ import annotations

import logging
import math
from typing import Callable, Protocol

import trio

from clock import Clock
from gossip.config import GossipConfig
from gossip.events import MemberState
from gossip.swim import MemberInfo
from gossip.trace import Tracer
from oplog import Event as OpEvent
from oplog import log_event

from .detector import PartitionDetected, PartitionDetector, PartitionHealed
from .records import trace_fields
from .view import Event, PartitionView

log = logging.getLogger("meshd.netsplit")


class Membership(Protocol):
    """What the monitor needs of the gossip service."""

    node_id: str
    config: GossipConfig

    def on_member_change(self, handler: Callable[[str, MemberState], None]) -> None: ...

    def members(self) -> list[MemberInfo]: ...


class PartitionMonitor:
    def __init__(self, view: PartitionView, gossip: Membership, trace: Tracer, *, clock: Clock) -> None:
        """``clock``'s ``now()`` must be on Trio's timeline: the detector's deadlines
        go to ``trio.move_on_at``."""
        self.view = view
        self.gossip = gossip
        self.trace = trace
        self.clock = clock
        self.node_id = view.node_id
        self._handlers: list[Callable[[Event], None]] = []
        self._wake = trio.Event()
        gossip.on_member_change(self.member_changed)

    @property
    def detector(self) -> PartitionDetector:
        return self.view.detector

    # ------------------------------------------------------------------ public API

    def is_partitioned(self) -> bool:
        """A partition was detected and has not healed yet."""
        return self.view.is_partitioned()

    def in_minority(self) -> bool:
        """This node is on the minority side of a partition that has not healed."""
        return self.view.in_minority()

    def unreachable(self) -> frozenset[str]:
        """Members currently dead in our view that did not leave (they may come back)."""
        return self.view.unreachable()

    def across_partition(self, member: str) -> bool:
        """Is ``member`` on the other side of a partition that has not healed?"""
        return self.view.across_partition(member)

    def on_event(self, handler: Callable[[Event], None]) -> None:
        """``handler(PartitionDetected | PartitionHealed)`` after each is traced."""
        self._handlers.append(handler)

    @property
    def detected_total(self) -> int:
        return self.view.detected_total

    @property
    def healed_total(self) -> int:
        return self.view.healed_total

    def snapshot(self) -> dict[str, object]:
        """Members, current partitions and recent history, JSON-able."""
        return {"node_id": self.node_id, "members": self.gossip.members(), **self.view.snapshot()}

    async def run(self) -> None:
        self.view.clock_offset  # pin the trace clock's offset now, inside Trio
        while True:
            deadline = self.detector.next_deadline()
            self._wake = trio.Event()
            with trio.move_on_at(deadline if deadline is not None else math.inf):
                await self._wake.wait()
            self._publish(self.detector.tick(self.clock.now()))

    def member_changed(self, member: str, state: MemberState | str) -> None:
        """Gossip's ``on_member_change`` callback: another member's state moved."""
        self._publish(self.detector.member_changed(member, state, self.clock.now()))
        self._wake.set()

    # ------------------------------------------------------------------ internals

    def _publish(self, events: list[Event]) -> None:
        offset = self.view.clock_offset
        for ev in events:
            self.trace.emit(origin=self.node_id, **trace_fields(ev, offset, self.gossip.config))
            _log_partition(ev)
        self.view.record(events)
        for ev in events:
            for h in self._handlers:
                try:
                    h(ev)
                except Exception:  # a subscriber's bug must not stop detection
                    log.exception("partition handler %r failed", h)


def _log_partition(ev: Event) -> None:
    """The one line per partition event (README "Logs")."""
    if isinstance(ev, PartitionDetected):
        log_event(log, OpEvent.PARTITION_OPENED, logging.WARNING, partition=ev.partition_id,
                  side="majority" if ev.majority else "minority", local=ev.local, remote=ev.remote,
                  view=len(ev.stable_view), detection_s=round(ev.detection_s, 3))
    else:
        log_event(log, OpEvent.PARTITION_HEALED, logging.INFO, partition=ev.partition_id, remote=ev.remote,
                  missing=ev.missing, heal_s=round(ev.heal_s, 3), duration_s=round(ev.duration_s, 3))


__all__ = ["Membership", "PartitionMonitor", "PartitionDetected", "PartitionHealed"]
