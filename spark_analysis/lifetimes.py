"""When each node was alive (its lives: a restarted node has several), and its crashes.

A node's life starts at its first record, or at a later ``node_start`` (a restart),
and ends at its first ``node_stop`` / ``node_crash`` in that life.  A restarting
node writes a few records just before its ``node_start`` (its own ``member_alive``
is stamped as the gossip machine is built); records up to ``START_SLACK_US`` before
a ``node_start`` belong to the new life.

Simulator traces mark crashes with ``node_crash``; real nodes cannot, so:

- a life followed by a restart but without ``node_stop`` / ``node_crash`` ended in a
  crash at its last record (the node was killed and started again);
- the last life, when the trace set has no ``node_crash`` and no simulator (``sim``)
  records, ended in a crash at its last record if that is more than
  ``crash_grace_us`` before the end of the whole trace set (nodes still writing near
  the end were simply still running when the traces were collected).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from .schema import END_KINDS

DEFAULT_CRASH_GRACE_US = 5_000_000
START_SLACK_US = 1_000_000
CRASH_KINDS: tuple[str, ...] = ("node_crash", "inferred_crash")


def node_lifetimes(traces: DataFrame, crash_grace_us: int = DEFAULT_CRASH_GRACE_US) -> DataFrame:
    """Per life: ``node``, ``life`` (0, 1, ... in time order), ``start_ts_us``,
    ``end_ts_us`` (null = running at the end), ``end_kind`` (``node_stop`` /
    ``node_crash`` / ``inferred_crash`` / null), ``last_ts_us``, ``records``,
    ``restart_ts_us`` (the next life's start, null if none)."""
    first = traces.groupBy("node").agg(F.min("ts_us").alias("_first"))
    # Life boundaries: the first record, then every node_start after it.  Starts are
    # few (one per life): computed apart from the big pass, then broadcast.
    restarts = (
        traces.filter(F.col("kind") == "node_start")
        .select("node", (F.col("ts_us") - START_SLACK_US).alias("_b"))
        .join(first, "node")
        .filter(F.col("_b") > F.col("_first"))
        .select("node", "_b")
    )
    w = Window.partitionBy("node").orderBy("_b")
    bounds = (
        first.select("node", F.col("_first").alias("_b"))
        .unionByName(restarts)
        .distinct()
        .select(
            "node",
            (F.row_number().over(w) - 1).alias("life"),
            F.col("_b").alias("_from"),
            F.lead("_b").over(w).alias("_to"),
        )
    )
    t = traces.select("node", "ts_us", "kind", "sim").join(F.broadcast(bounds), "node").filter(
        (F.col("ts_us") >= F.col("_from")) & (F.col("_to").isNull() | (F.col("ts_us") < F.col("_to")))
    )
    is_end = F.col("kind").isin(*END_KINDS)
    lives = t.groupBy("node", "life").agg(
        F.min("ts_us").alias("start_ts_us"),
        F.max("ts_us").alias("last_ts_us"),
        F.count(F.lit(1)).alias("records"),
        F.min(F.when(is_end, F.struct("ts_us", "kind"))).alias("_end"),
        # The simulator marks every crash; only real traces need crashes inferred.
        F.max(((F.col("kind") == "node_crash") | F.coalesce(F.col("sim"), F.lit(False))).cast("int")).alias("_marked"),
        F.first("_to").alias("_to"),
    )
    overall = lives.agg(F.max("last_ts_us").alias("_trace_end"), F.max("_marked").alias("_has_crash_records"))
    wl = Window.partitionBy("node").orderBy("life")
    restarted = F.col("_to").isNotNull()
    inferred = F.col("_end").isNull() & (
        restarted
        | ((F.col("_has_crash_records") == 0) & (F.col("last_ts_us") < F.col("_trace_end") - F.lit(crash_grace_us)))
    )
    return lives.crossJoin(F.broadcast(overall)).select(
        "node",
        "life",
        "start_ts_us",
        F.when(inferred, F.col("last_ts_us")).otherwise(F.col("_end.ts_us")).alias("end_ts_us"),
        F.when(inferred, F.lit("inferred_crash")).otherwise(F.col("_end.kind")).alias("end_kind"),
        "last_ts_us",
        "records",
        F.lead("start_ts_us").over(wl).alias("restart_ts_us"),
    )


def alive_at(lifetimes_prefix: str, ts: Column) -> Column:
    """Condition: the node of lifetime columns ``<prefix>start_ts_us``/``end_ts_us`` is up at ``ts``."""
    start = F.col(f"{lifetimes_prefix}start_ts_us")
    end = F.col(f"{lifetimes_prefix}end_ts_us")
    return (start <= ts) & (end.isNull() | (ts < end))


def crashes(lifetimes: DataFrame) -> DataFrame:
    """Per crash: ``member``, ``crash_ts_us``, ``source`` (``node_crash`` /
    ``inferred_crash``), ``restart_ts_us`` (when it came back, null if never)."""
    return lifetimes.filter(F.col("end_kind").isin(*CRASH_KINDS)).select(
        F.col("node").alias("member"),
        F.col("end_ts_us").alias("crash_ts_us"),
        F.col("end_kind").alias("source"),
        "restart_ts_us",
    )
