"""The partition lines (README "Logs"): the monitor in virtual time logs one line when
it concludes a partition opened and one when it healed, with both sides."""

from __future__ import annotations

import logging

import pytest
import trio
import trio.testing

from clock import TrioClock
from netsplit.detector import detector_for
from netsplit.monitor import PartitionMonitor
from netsplit.view import PartitionView
from oplog import EVENT_ATTR, FIELDS_ATTR
from tests.netsplit.test_monitor import FakeGossip, ListTrace


def partition_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, int, str, dict]]:
    return [(getattr(r, EVENT_ATTR), r.levelno, r.getMessage(), getattr(r, FIELDS_ATTR)) for r in caplog.records
            if getattr(r, EVENT_ATTR, "").startswith("partition.")]


def test_opened_and_healed_lines_name_both_sides(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="meshd.netsplit")

    async def main() -> None:
        gossip = FakeGossip()
        view = PartitionView(detector_for(gossip.node_id, gossip.config), clock=TrioClock())
        mon = PartitionMonitor(view, gossip, ListTrace(), clock=TrioClock())
        async with trio.open_nursery() as nursery:
            nursery.start_soon(mon.run)
            for m in ("n1", "n2", "n3", "n4"):
                gossip.change(m, "alive")
            gossip.change("n3", "dead")
            gossip.change("n4", "dead")
            await trio.sleep(mon.detector.window + 0.01)
            assert mon.is_partitioned()
            ((event, level, line, opened),) = partition_lines(caplog)
            assert (event, level) == ("partition.opened", logging.WARNING)
            assert line.startswith("partition.opened partition=n0/1 side=majority local=n0,n1,n2 remote=n3,n4 view=5")
            assert opened["remote"] == ["n3", "n4"] and opened["detection_s"] == round(mon.detector.window, 3)
            gossip.change("n3", "alive")
            gossip.change("n4", "alive")
            await trio.sleep(0)
            event, level, line, healed = partition_lines(caplog)[-1]
            assert (event, level) == ("partition.healed", logging.INFO)
            assert line.startswith("partition.healed partition=n0/1 remote=n3,n4 missing=")
            assert healed["missing"] == [] and healed["duration_s"] == 0.01  # from detection to heal
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
