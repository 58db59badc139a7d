"""Detector facts as trace fields and JSON, shared by the node's monitor and the simulator.

Trace records (DESIGN.md contract): ``subject`` is the partition id, ``origin`` the
observing node (a partition is this node's conclusion).  Extra fields, read by
``spark_analysis``: ``peers`` (the other side, comma separated), ``majority``
(our side holds a majority of the last stable view) and ``took_us`` (detection:
onset to detection; heal: first contact to one view).  ``local`` / ``remote`` /
``missing`` lists are for people reading the file; ``suspicion_us`` on a detection is
the minimum suspicion timeout for the view's size, the yardstick for ``took_us``.
"""

from __future__ import annotations


from gossip.config import GossipConfig
from gossip.formulas import suspicion_timeout

from .detector import PartitionDetected, PartitionHealed


def _us(t: float) -> int:
    return int(round(t * 1_000_000))


def suspicion_s(config: GossipConfig, members: int) -> float:
    """The minimum suspicion timeout in a view of ``members``: each side of a split
    should hold the other dead within about this (plus probing and gossip)."""
    return suspicion_timeout(config.suspicion_mult, members, config.probe_interval)


def trace_fields(
    ev: PartitionDetected | PartitionHealed, clock_offset: float = 0.0, config: GossipConfig | None = None
) -> dict[str, object]:
    """Keyword arguments for ``TraceWriter.emit`` (``clock_offset`` turns the
    detector's monotonic seconds into the trace clock; ``config`` adds the
    suspicion timeout a detection is measured against)."""
    ts = _us(ev.at + clock_offset)
    if isinstance(ev, PartitionDetected):
        out: dict[str, object] = {
            "ts_us": ts, "kind": "partition_detected", "subject": ev.partition_id,
            "peers": ",".join(sorted(ev.remote)), "majority": ev.majority,
            "took_us": _us(ev.detection_s), "onset_ts_us": _us(ev.onset + clock_offset),
            "local": sorted(ev.local), "remote": sorted(ev.remote),
        }
        if ev.revision:
            out["revision"] = ev.revision  # same subject, revised: readers keep the last
        if config is not None:
            out["suspicion_us"] = _us(suspicion_s(config, len(ev.stable_view)))
        return out
    return {
        "ts_us": ts, "kind": "partition_healed", "subject": ev.partition_id,
        "peers": ",".join(sorted(ev.remote)), "took_us": _us(ev.heal_s),
        "duration_us": _us(ev.duration_s), "first_contact_ts_us": _us(ev.first_contact + clock_offset),
        "missing": sorted(ev.missing),
    }


def event_json(ev: PartitionDetected | PartitionHealed, clock_offset: float = 0.0) -> dict[str, object]:
    """One history entry for the API, ``meshd ctl cluster`` and ``$SYS``."""
    f = trace_fields(ev, clock_offset)
    out: dict[str, object] = {"event": f["kind"], "id": ev.partition_id, "ts_us": f["ts_us"], "peers": sorted(ev.remote)}
    if isinstance(ev, PartitionDetected):
        out.update(local=sorted(ev.local), majority=ev.majority, detection_s=round(ev.detection_s, 3),
                   revision=ev.revision)
    else:
        out.update(heal_s=round(ev.heal_s, 3), duration_s=round(ev.duration_s, 3), missing=sorted(ev.missing))
    return out
