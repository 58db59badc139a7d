"""Crash detection latency and false death declarations.

Detection of a crash of X at C: the first ``member_suspect`` about X anywhere at or
after C, and the moment every observer that was alive at C had recorded
``member_dead`` about X. An observer that itself stopped or crashed without
declaring X dead is excused; one still running that never did leaves the crash
undetected (``all_dead`` null).

A false positive is a ``member_dead`` event (one per ``event_id``) about a member
whose own traces show activity after the declaration, while it was neither stopped
nor crashed (its next own record is not a restart).
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from .lifetimes import alive_at
from .schema import END_KINDS

US = 1_000_000.0


def detection(traces: DataFrame, lifetimes: DataFrame, crashed: DataFrame) -> DataFrame:
    """Per crash: ``member``, ``crash_ts_us``, ``source``, ``first_suspect_s``,
    ``all_dead_s``, ``observers`` (required), ``declared`` (how many of them did)."""
    c = crashed.alias("c")
    suspects = (
        traces.filter((F.col("kind") == "member_suspect") & (F.col("node") != F.col("subject")))
        .alias("s")
        .join(F.broadcast(c), (F.col("s.subject") == F.col("c.member")) & (F.col("s.ts_us") >= F.col("c.crash_ts_us")))
        .groupBy("c.member")
        .agg(F.min("s.ts_us").alias("first_suspect_ts_us"))
    )
    deads = (
        traces.filter(F.col("kind") == "member_dead")
        .alias("d")
        .join(F.broadcast(c), (F.col("d.subject") == F.col("c.member")) & (F.col("d.ts_us") >= F.col("c.crash_ts_us")))
        .groupBy(F.col("c.member").alias("member"), F.col("d.node").alias("observer"))
        .agg(F.min("d.ts_us").alias("dead_ts_us"))
    )
    life = lifetimes.select(
        F.col("node").alias("observer"),
        F.col("start_ts_us").alias("_l_start_ts_us"),
        F.col("end_ts_us").alias("_l_end_ts_us"),
    )
    observers = (
        crashed.join(F.broadcast(life), alive_at("_l_", F.col("crash_ts_us")))
        .filter(F.col("observer") != F.col("member"))
        .join(deads, ["member", "observer"], "left")
        # Observers that went away without declaring are not waited for.
        .filter(F.col("dead_ts_us").isNotNull() | F.col("_l_end_ts_us").isNull())
        .groupBy("member")
        .agg(
            F.count(F.lit(1)).alias("observers"),
            F.count("dead_ts_us").alias("declared"),
            F.max("dead_ts_us").alias("last_dead_ts_us"),
        )
    )
    complete = (F.col("observers") > 0) & (F.col("observers") == F.col("declared"))
    return (
        crashed.join(suspects, "member", "left")
        .join(observers, "member", "left")
        .select(
            "member",
            "crash_ts_us",
            "source",
            ((F.col("first_suspect_ts_us") - F.col("crash_ts_us")) / US).alias("first_suspect_s"),
            F.when(complete, (F.col("last_dead_ts_us") - F.col("crash_ts_us")) / US).alias(
                "all_dead_s"
            ),
            F.coalesce("observers", F.lit(0)).alias("observers"),
            F.coalesce("declared", F.lit(0)).alias("declared"),
        )
    )


def false_positives(traces: DataFrame) -> DataFrame:
    """Per wrong ``member_dead`` event: ``member``, ``declared_by``, ``ts_us``,
    ``event_id``, ``active_ts_us`` (the member's first own record after it)."""
    declarations = (
        traces.filter(F.col("kind") == "member_dead")
        .withColumn("_eid", F.coalesce("event_id", F.concat_ws(":", "origin", "subject", "origin_ts_us")))
        .groupBy("_eid")
        .agg(
            F.min(F.struct(F.coalesce("origin_ts_us", "ts_us").alias("t"), "origin", "subject")).alias("e")
        )
        .select(
            F.col("_eid").alias("event_id"),
            F.col("e.subject").alias("member"),
            F.coalesce(F.col("e.origin"), F.lit("")).alias("declared_by"),
            F.col("e.t").alias("ts_us"),
        )
    )
    own = traces.select(F.col("node").alias("member"), F.col("ts_us").alias("o_ts"), F.col("kind").alias("o_kind"))
    # Declarations are few next to all records: ship them to the records.
    decl = F.broadcast(declarations.select("event_id", "member", "ts_us"))
    after = (
        own.join(decl, "member")
        .filter(F.col("o_ts") > F.col("ts_us"))
        .groupBy("event_id")
        .agg(F.min(F.struct("o_ts", "o_kind")).alias("next"))
    )
    lifecycle = (
        own.filter(F.col("o_kind").isin("node_start", *END_KINDS)).join(decl, "member")
        .filter(F.col("o_ts") <= F.col("ts_us"))
        .groupBy("event_id")
        .agg(F.max(F.struct("o_ts", "o_kind")).alias("prev"))
    )
    prev_kind = F.col("prev.o_kind")
    return (
        declarations.join(after, "event_id")
        .join(lifecycle, "event_id", "left")
        .filter(F.col("next.o_kind") != "node_start")
        .filter(prev_kind.isNull() | (prev_kind == "node_start"))
        .select(
            "member",
            "declared_by",
            "ts_us",
            "event_id",
            F.col("next.o_ts").alias("active_ts_us"),
        )
    )
