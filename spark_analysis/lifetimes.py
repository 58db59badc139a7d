"""When each node was alive, and which nodes crashed.

One lifetime per node: from its first record to its first ``node_stop`` /
``node_crash``. Simulator traces mark crashes with ``node_crash``; real nodes cannot,
so when a trace set has no ``node_crash`` and no simulator (``sim``) records, a node whose lines stop without
``node_stop`` more than ``crash_grace_us`` before the end of the whole trace set is
taken to have crashed at its last line (nodes still writing near the end were simply
still running when the traces were collected).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from .schema import END_KINDS

DEFAULT_CRASH_GRACE_US = 5_000_000


def node_lifetimes(traces: DataFrame, crash_grace_us: int = DEFAULT_CRASH_GRACE_US) -> DataFrame:
    """Per node: ``start_ts_us``, ``end_ts_us`` (null = running at the end), ``end_kind``
    (``node_stop`` / ``node_crash`` / ``inferred_crash`` / null), ``last_ts_us``, ``records``."""
    per_node = traces.groupBy("node").agg(
        F.min("ts_us").alias("start_ts_us"),
        F.max("ts_us").alias("last_ts_us"),
        F.count(F.lit(1)).alias("records"),
        # The simulator marks every crash; only real traces need crashes inferred.
        F.max(
            ((F.col("kind") == "node_crash") | F.coalesce(F.col("sim"), F.lit(False))).cast("int")
        ).alias("_marked"),
    )
    # End records are few: find each node's first one apart from the big pass.
    ends = (
        traces.filter(F.col("kind").isin(*END_KINDS))
        .groupBy("node")
        .agg(F.min(F.struct("ts_us", "kind")).alias("_end"))
        .select("node", F.col("_end.ts_us").alias("_end_ts"), F.col("_end.kind").alias("_end_kind"))
    )
    overall = per_node.agg(
        F.max("last_ts_us").alias("_trace_end"), F.max("_marked").alias("_has_crash_records")
    )
    per_node = per_node.join(F.broadcast(ends), "node", "left")
    inferred = (
        (F.col("_end_ts").isNull())
        & (F.col("_has_crash_records") == 0)
        & (F.col("last_ts_us") < F.col("_trace_end") - F.lit(crash_grace_us))
    )
    return per_node.crossJoin(overall).select(
        "node",
        "start_ts_us",
        F.when(inferred, F.col("last_ts_us")).otherwise(F.col("_end_ts")).alias("end_ts_us"),
        F.when(inferred, F.lit("inferred_crash")).otherwise(F.col("_end_kind")).alias("end_kind"),
        "last_ts_us",
        "records",
    )


def alive_at(lifetimes_prefix: str, ts: Column) -> Column:
    """Condition: the node of lifetime columns ``<prefix>start_ts_us``/``end_ts_us`` is up at ``ts``."""
    start = F.col(f"{lifetimes_prefix}start_ts_us")
    end = F.col(f"{lifetimes_prefix}end_ts_us")
    return (start <= ts) & (end.isNull() | (ts < end))


def crashes(lifetimes: DataFrame) -> DataFrame:
    """Per crashed node: ``member``, ``crash_ts_us``, ``source`` (``node_crash`` / ``inferred_crash``)."""
    return lifetimes.filter(F.col("end_kind").isin("node_crash", "inferred_crash")).select(
        F.col("node").alias("member"),
        F.col("end_ts_us").alias("crash_ts_us"),
        F.col("end_kind").alias("source"),
    )
