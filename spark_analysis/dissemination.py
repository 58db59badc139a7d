"""How fast broadcast-like events reach the nodes that were alive when they were made.

An event is every record sharing an ``event_id`` whose kind is in
``DISSEMINATION_KINDS``. An observation is a node's first record of an event (the
origin's own ``hops`` 0 record counts). Coverage time tP is nearest-rank: the delay
from ``origin_ts_us`` until ``ceil(P/100 * alive)`` of the nodes alive at the origin
time had observed the event; null when that many never did.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from .lifetimes import alive_at
from .schema import DISSEMINATION_KINDS
from .stats import Method, pct, sorted_array_pct

US = 1_000_000.0

# Coverage targets in basis points (1/100 of a percent) so ranks are integer math.
HEADLINE_BP: dict[str, int] = {"t50_s": 5000, "t90_s": 9000, "t99_s": 9900, "t100_s": 10000}


def _event_heads(traces: DataFrame) -> DataFrame:
    d = traces.filter(F.col("kind").isin(*DISSEMINATION_KINDS) & F.col("event_id").isNotNull())
    return d.groupBy("event_id").agg(
        F.min("kind").alias("kind"),
        F.min(F.coalesce("origin_ts_us", "ts_us")).alias("origin_ts_us"),
        # Every record of an event names the same origin; min() just picks it cheaply.
        F.min("origin").alias("origin"),
    )


def observations(
    traces: DataFrame, lifetimes: DataFrame, heads: DataFrame | None = None
) -> DataFrame:
    """Per (event, observing node alive at the origin time): ``event_id``, ``node``, its
    first ``hops`` and ``delay_us`` (first observation minus the origin time), and
    ``own`` (the node is the event's origin). Narrow on purpose: it is the largest
    frame of the report (about one row per node per event) and is cached.

    ``heads`` (from ``alive_counts``) saves recomputing the events. The result is
    hash-partitioned by ``event_id``, so per-event aggregations after it need no
    further shuffle of the observations."""
    if heads is None:
        heads = _event_heads(traces)
    firsts = (
        traces.filter(F.col("kind").isin(*DISSEMINATION_KINDS) & F.col("event_id").isNotNull())
        .repartition("event_id")
        .groupBy("event_id", "node")
        .agg(F.min("ts_us").alias("ts_us"), F.min("hops").alias("hops"))
    )
    life = lifetimes.select(
        F.col("node").alias("_l_node"),
        F.col("start_ts_us").alias("_l_start_ts_us"),
        F.col("end_ts_us").alias("_l_end_ts_us"),
    )
    # Events are far fewer than observations (one per node each): ship them, don't shuffle.
    events = heads.select("event_id", "kind", "origin", "origin_ts_us")
    joined = firsts.join(F.broadcast(events), "event_id").join(
        F.broadcast(life), F.col("node") == F.col("_l_node")
    )
    return joined.filter(alive_at("_l_", F.col("origin_ts_us"))).select(
        "event_id",
        "node",
        "hops",
        (F.col("ts_us") - F.col("origin_ts_us")).alias("delay_us"),
        (F.col("node") == F.col("origin")).alias("own"),
    )


def alive_counts(traces: DataFrame, lifetimes: DataFrame) -> DataFrame:
    """Per event: ``event_id``, ``kind``, ``origin``, ``origin_ts_us``, ``alive_nodes``."""
    life = lifetimes.select(
        F.col("start_ts_us").alias("_l_start_ts_us"), F.col("end_ts_us").alias("_l_end_ts_us")
    )
    heads = _event_heads(traces)
    alive = (
        heads.join(F.broadcast(life), alive_at("_l_", F.col("origin_ts_us")))
        .groupBy("event_id")
        .agg(F.count(F.lit(1)).alias("alive_nodes"))
    )
    return heads.join(alive, "event_id", "left").select(
        "event_id",
        "kind",
        "origin",
        "origin_ts_us",
        F.coalesce("alive_nodes", F.lit(0)).alias("alive_nodes"),
    )


def delay_arrays(obs: DataFrame, heads: DataFrame) -> DataFrame:
    """Per event (from ``heads``): ``observed_nodes``, ``max_hops`` and ``delays``, the
    sorted observation delays in µs. One shuffle of the observations; every coverage
    time is then a lookup in the array (worth caching: the table and curve share it)."""
    per_event = obs.groupBy("event_id").agg(
        F.count(F.lit(1)).alias("observed_nodes"),
        F.max("hops").alias("max_hops"),
        F.sort_array(F.collect_list("delay_us")).alias("delays"),
    )
    return heads.join(per_event, "event_id", "left").select(
        *heads.columns,
        F.coalesce("observed_nodes", F.lit(0)).alias("observed_nodes"),
        "max_hops",
        F.coalesce("delays", F.array().cast("array<bigint>")).alias("delays"),
    )


def coverage_time_us(bp: int | Column) -> Column:
    """Over ``delay_arrays`` rows: µs until ``ceil(bp/10000 * alive_nodes)`` nodes had
    observed the event (nearest rank), null if that many never did."""
    bp_col = bp if isinstance(bp, Column) else F.lit(bp)
    rank = ((bp_col * F.col("alive_nodes") + 9999) / 10000).cast("long")  # integer ceil
    reached = (rank >= 1) & (rank <= F.size("delays"))
    return F.when(reached, F.element_at("delays", rank.cast("int")))


def event_table(arrays: DataFrame) -> DataFrame:
    """The per-event table: alive/observed counts, coverage, t50..t100 in seconds, max hops."""
    return arrays.select(
        "event_id",
        "kind",
        "origin",
        "origin_ts_us",
        "alive_nodes",
        "observed_nodes",
        # No node alive at the origin time (its traces rotated away, say): no coverage.
        F.when(F.col("alive_nodes") > 0, F.col("observed_nodes") / F.col("alive_nodes")).alias(
            "coverage"
        ),
        coverage_time_us(HEADLINE_BP["t100_s"]).isNotNull().alias("full_coverage"),
        *[(coverage_time_us(bp) / US).alias(name) for name, bp in HEADLINE_BP.items()],
        "max_hops",
    )


def infection_curve(arrays: DataFrame, points: int = 50) -> DataFrame:
    """Per coverage fraction: p01/median/p99 (over events) of the time to reach it (s).

    Events that never reach a fraction count as infinitely slow (null in the
    output when the percentile lands on them). ``percentile_approx`` keeps values
    that occur in the data, which that needs; with fewer than 10,000 events it is
    the exact nearest rank.
    """
    step = 10000 // points
    never = F.lit(2**62)
    t = arrays.filter(F.col("alive_nodes") > 0).select(
        F.explode(F.sequence(F.lit(step), F.lit(10000), F.lit(step))).alias("bp"), "alive_nodes", "delays"
    ).select("bp", F.coalesce(coverage_time_us(F.col("bp")), never).alias("d"))
    agg = t.groupBy("bp").agg(
        F.percentile_approx("d", F.lit(0.5), 10000).alias("p50"),
        F.percentile_approx("d", F.lit(0.99), 10000).alias("p99"),
        F.percentile_approx("d", F.lit(0.01), 10000).alias("p01"),
    )
    return agg.select(
        (F.col("bp") / 10000.0).alias("fraction"),
        *[F.when(F.col(c) < never, F.col(c) / US).alias(f"{c}_s") for c in ("p01", "p50", "p99")],
    ).orderBy("fraction")


def per_node_lag(obs: DataFrame, method: Method) -> DataFrame:
    """Per observing node: observations of others' events and their delay p50/p99/max (s)."""
    d = obs.filter(~F.col("own")).withColumn("delay_s", F.col("delay_us") / US)
    if not method.exact:
        return d.groupBy("node").agg(
            F.count(F.lit(1)).alias("observations"),
            pct("delay_s", 0.5, method).alias("lag_p50_s"),
            pct("delay_s", 0.99, method).alias("lag_p99_s"),
            F.max("delay_s").alias("lag_max_s"),
        )
    per_node = d.groupBy("node").agg(F.sort_array(F.collect_list("delay_s")).alias("_d"))
    return per_node.select(
        "node",
        F.size("_d").cast("long").alias("observations"),
        sorted_array_pct("_d", 0.5).alias("lag_p50_s"),
        sorted_array_pct("_d", 0.99).alias("lag_p99_s"),
        F.element_at("_d", -1).alias("lag_max_s"),
    )
