"""Crash detection latency, and what each death declaration was (the classification
table in README.md, "Classification", implemented here and only here).

Detection of a crash of X at C: the first ``member_suspect`` about X anywhere at or
after C, and the moment every observer that was alive at C had recorded
``member_dead`` about X (before X restarted, if it did). An observer that itself
stopped or crashed without declaring X dead is excused; one still running that
never did leaves the crash undetected (``all_dead`` null).

A declaration is a ``member_dead`` event (one per ``event_id``): its origin
(``declared_by``) declared ``member`` dead at ``ts_us`` (the origin's clock).  Its
class, first match wins:

1. ``leave``: the member had stopped (``node_stop``) and not started again.
2. ``restart``: the member had crashed (or was killed: inferred) and started again later.
3. ``true_detection``: the member had crashed and never came back.
4. ``partition``: the member was alive, but the declarer and the member were on
   different sides of a partition one of them detected (a ``partition_detected``
   of either naming the other, from its onset to its heal).
5. ``false_positive``: the member was alive and reachable, and wrote records after.
6. ``unverified``: the member was not seen down, yet wrote nothing after (its traces
   end there, or are missing): nothing says whether it was alive.

"Had" compares clocks of two nodes: every comparison allows ``CLOCK_SLACK_US`` of
skew between them (a declaration up to that long before a crash counts as a
detection of it).
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from .lifetimes import CRASH_KINDS, alive_at

US = 1_000_000.0
CLOCK_SLACK_US = 2_000_000
CLASSES: tuple[str, ...] = ("true_detection", "restart", "leave", "partition", "false_positive", "unverified")


def detection(traces: DataFrame, lifetimes: DataFrame, crashed: DataFrame) -> DataFrame:
    """Per crash: ``member``, ``crash_ts_us``, ``source``, ``restart_ts_us``,
    ``first_suspect_s``, ``all_dead_s``, ``observers`` (required), ``declared``
    (how many of them did)."""
    c = crashed.alias("c")
    # until the member came back: a later life's deaths belong to a later crash
    in_crash = lambda a: (  # noqa: E731
        (F.col(f"{a}.subject") == F.col("c.member"))
        & (F.col(f"{a}.ts_us") >= F.col("c.crash_ts_us"))
        & (F.col("c.restart_ts_us").isNull() | (F.col(f"{a}.ts_us") < F.col("c.restart_ts_us")))
    )
    suspects = (
        traces.filter((F.col("kind") == "member_suspect") & (F.col("node") != F.col("subject")))
        .alias("s")
        .join(F.broadcast(c), in_crash("s"))
        .groupBy("c.member", "c.crash_ts_us")
        .agg(F.min("s.ts_us").alias("first_suspect_ts_us"))
    )
    deads = (
        traces.filter(F.col("kind") == "member_dead")
        .alias("d")
        .join(F.broadcast(c), in_crash("d"))
        .groupBy(F.col("c.member").alias("member"), F.col("c.crash_ts_us").alias("crash_ts_us"),
                 F.col("d.node").alias("observer"))
        .agg(F.min("d.ts_us").alias("dead_ts_us"))
    )
    life = lifetimes.select(
        F.col("node").alias("observer"),
        F.col("start_ts_us").alias("_l_start_ts_us"),
        F.col("end_ts_us").alias("_l_end_ts_us"),
    )
    key = ["member", "crash_ts_us"]
    observers = (
        crashed.join(F.broadcast(life), alive_at("_l_", F.col("crash_ts_us")))
        .filter(F.col("observer") != F.col("member"))
        .join(deads, key + ["observer"], "left")
        # Observers that went away without declaring are not waited for.
        .filter(F.col("dead_ts_us").isNotNull() | F.col("_l_end_ts_us").isNull())
        .groupBy(*key)
        .agg(
            F.count(F.lit(1)).alias("observers"),
            F.count("dead_ts_us").alias("declared"),
            F.max("dead_ts_us").alias("last_dead_ts_us"),
        )
    )
    complete = (F.col("observers") > 0) & (F.col("observers") == F.col("declared"))
    return (
        crashed.join(suspects, key, "left")
        .join(observers, key, "left")
        .select(
            "member",
            "crash_ts_us",
            "source",
            "restart_ts_us",
            ((F.col("first_suspect_ts_us") - F.col("crash_ts_us")) / US).alias("first_suspect_s"),
            F.when(complete, (F.col("last_dead_ts_us") - F.col("crash_ts_us")) / US).alias(
                "all_dead_s"
            ),
            F.coalesce("observers", F.lit(0)).alias("observers"),
            F.coalesce("declared", F.lit(0)).alias("declared"),
        )
    )


def declarations(traces: DataFrame, lifetimes: DataFrame, episodes: DataFrame) -> DataFrame:
    """Per ``member_dead`` event: ``event_id``, ``member``, ``declared_by``, ``ts_us``,
    ``class`` (see the module docstring) and ``active_ts_us`` (the member's first own
    record after it, null if none)."""
    decl = (
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
    slack = F.lit(CLOCK_SLACK_US)
    # 1-3: the member was down (a life of it had ended, and the next had not begun)
    down = (
        decl.join(
            F.broadcast(lifetimes.filter(F.col("end_ts_us").isNotNull()).select(
                F.col("node").alias("member"), "end_ts_us", "end_kind", "restart_ts_us")),
            "member",
        )
        .filter(
            (F.col("ts_us") >= F.col("end_ts_us") - slack)
            & (F.col("restart_ts_us").isNull() | (F.col("ts_us") < F.col("restart_ts_us") + slack))
        )
        .groupBy("event_id")
        .agg(F.max(F.struct("end_ts_us", "end_kind", "restart_ts_us")).alias("_down"))
    )
    # 4: the two were on different sides of a partition either of them detected
    ep = F.broadcast(episodes.select(
        F.col("node").alias("_p_node"),
        F.split(F.coalesce("peers", F.lit("")), r"[,\s]+").alias("_p_peers"),
        (F.col("detected_ts_us") - F.coalesce(F.col("detection_s") * US, F.lit(0.0)).cast("long")).alias("_p_from"),
        F.col("healed_ts_us").alias("_p_to"),
    ))
    split = (
        decl.join(
            ep,
            (
                ((F.col("_p_node") == F.col("declared_by")) & F.array_contains("_p_peers", F.col("member")))
                | ((F.col("_p_node") == F.col("member")) & F.array_contains("_p_peers", F.col("declared_by")))
            )
            & (F.col("ts_us") >= F.col("_p_from") - slack)
            & (F.col("_p_to").isNull() | (F.col("ts_us") <= F.col("_p_to") + slack)),
        )
        .select("event_id")
        .distinct()
        .withColumn("_split", F.lit(True))
    )
    # 5-6: the member's own activity after the declaration
    own = traces.select(F.col("node").alias("member"), F.col("ts_us").alias("_o_ts"))
    after = (
        own.join(F.broadcast(decl.select("event_id", "member", "ts_us")), "member")
        .filter(F.col("_o_ts") > F.col("ts_us"))
        .groupBy("event_id")
        .agg(F.min("_o_ts").alias("active_ts_us"))
    )
    kind = F.col("_down.end_kind")
    cls = (
        F.when(kind == "node_stop", "leave")
        .when(kind.isin(*CRASH_KINDS) & F.col("_down.restart_ts_us").isNotNull(), "restart")
        .when(kind.isin(*CRASH_KINDS), "true_detection")
        .when(F.col("_split"), "partition")
        .when(F.col("active_ts_us").isNotNull(), "false_positive")
        .otherwise("unverified")
    )
    return (
        decl.join(down, "event_id", "left")
        .join(split, "event_id", "left")
        .join(after, "event_id", "left")
        .select("event_id", "member", "declared_by", "ts_us", cls.alias("class"), "active_ts_us")
    )


def false_positives(classified: DataFrame) -> DataFrame:
    """The declarations of a member that was alive and reachable: ``member``,
    ``declared_by``, ``ts_us``, ``event_id``, ``active_ts_us``."""
    return classified.filter(F.col("class") == "false_positive").select(
        "member", "declared_by", "ts_us", "event_id", "active_ts_us"
    )
