"""Session replication as the operator sees it: its metrics (README "Session
replication").  The replication itself is `replication/`."""

from __future__ import annotations

from mesh.metrics import Metrics
from replication.service import Replication


def replication_metrics(m: Metrics, replication: Replication) -> None:
    stats = replication.stats
    m.gauge_callback("meshd_replication_under_replicated_sessions",
                     "persistent sessions owned here with fewer copies than session_replicas (fewer members alive)",
                     lambda: stats.under_replicated)
    m.counter_callback("meshd_replication_degraded_episodes_total",
                       "times some session went under-replicated (one WARNING each)", lambda: stats.degraded_episodes)
    m.gauge_callback("meshd_replication_lag_changes",
                     "session changes sent to replicas and not yet confirmed (in async mode: how far they lag)",
                     replication.lag)
    m.gauge_callback("meshd_replication_backlog_sessions",
                     "sessions waiting for a new copy (re-replication after a member died, bounded per second)",
                     replication.backlog)
    m.counter_callback("meshd_replication_changes_total", "session changes queued for replicas", lambda: stats.changes)
    m.counter_callback("meshd_replication_batches_total", "batches of session changes confirmed by replicas",
                       lambda: stats.batches)
    m.counter_callback("meshd_replication_channel_batches_total",
                       "of which sent on a replication channel (one stream per replica, batches pipelined)",
                       lambda: stats.channel_batches)
    m.counter_callback("meshd_replication_snapshots_total", "whole-session snapshots sent to new or lagging replicas",
                       lambda: stats.snapshots)
    m.counter_callback("meshd_replication_replaced_total", "replicas replaced for not confirming in time",
                       lambda: stats.replaced)
    m.counter_callback("meshd_replication_applied_total", "session changes applied here as a replica",
                       lambda: stats.applied)
    m.gauge_callback("meshd_replication_copies_held", "copies of other members' sessions held here",
                     lambda: len(replication.copies_held))
    m.counter_callback("meshd_replication_takeovers_total", "sessions taken over here from a replica (owner gone)",
                       lambda: stats.takeovers)
    m.counter_callback("meshd_replication_orphan_wills_total",
                       "wills sent here for a session whose owner died and whose client did not come back",
                       lambda: stats.orphan_wills)
