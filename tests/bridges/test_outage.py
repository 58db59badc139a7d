"""Nothing acknowledged is lost across a target outage and a kill -9 of meshd in the
middle of it (the short version of scripts/bench/bridge_outage.py: ~25 s)."""

from __future__ import annotations

import faulthandler
from typing import Any

from tests.bridges.outage import OutageParams, run_outage


def test_every_acknowledged_message_arrives_in_order_per_publisher(tmp_path: Any) -> None:
    faulthandler.dump_traceback_later(120)  # a run takes ~20 s: past 120 s, show where it stands
    try:
        result = run_outage(str(tmp_path), OutageParams(publishers=2, rate=200, before_s=2, outage_s=8, kill_at_s=3,
                                                        after_s=2, drain_timeout_s=60))
    finally:
        faulthandler.cancel_dump_traceback_later()
    summary = result.summary()
    assert result.acked_total > 500, summary  # the load ran through the outage
    assert all(len(v) > 100 for v in result.acked.values()), summary
    assert not any(result.missing.values()), summary
    assert not any(result.out_of_order.values()), summary
