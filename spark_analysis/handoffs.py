"""Session handoffs: how long a client waited for its session on the node it
reconnected to, from the ``session_handoff`` traces.

The taker writes one record per takeover: ``subject`` the client id, ``origin`` the
node the session came from, ``to`` the taker, ``outcome`` (``ok``: moved;
``fallback``: the owner did not answer, a local copy or a new session was used;
``merged``: a copy held elsewhere was merged in later, written by the node that held
it), ``duration_ms`` (CONNECT to session here) and ``messages`` (inflight + queued
messages that came along).
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from .stats import APPROX_ACCURACY


def handoffs(traces: DataFrame) -> DataFrame:
    """One row per handoff record."""
    return traces.filter(F.col("kind") == "session_handoff").select(
        F.col("subject").alias("client_id"),
        F.col("origin").alias("from_node"),
        F.col("to").alias("to_node"),
        F.coalesce(F.col("outcome"), F.lit("ok")).alias("outcome"),
        F.col("duration_ms").cast("double").alias("duration_ms"),
        F.col("messages").cast("long").alias("messages"),
        "ts_us",
    )


def handoff_summary(rows: DataFrame) -> DataFrame:
    """Per outcome: count, duration median / p99 / max (ms), messages moved."""
    return (
        rows.groupBy("outcome")
        .agg(
            F.count(F.lit(1)).alias("handoffs"),
            F.percentile_approx("duration_ms", 0.5, APPROX_ACCURACY).alias("median_ms"),
            F.percentile_approx("duration_ms", 0.99, APPROX_ACCURACY).alias("p99_ms"),
            F.max("duration_ms").alias("max_ms"),
            F.sum("messages").alias("messages"),
        )
        .orderBy("outcome")
    )
