"""The trace schema as Spark sees it, declared once.

Mirrors ``gossip.trace.TRACE_FIELDS`` followed by ``OPTIONAL_FIELDS``; ``tests/spark_analysis/test_schema.py`` writes
traces with the real ``TraceWriter`` and reads them back with this schema.
"""

from __future__ import annotations

from pyspark.sql.types import (
    BooleanType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
)

TRACE_SCHEMA = StructType(
    [
        StructField("ts_us", LongType(), True),
        StructField("node", StringType(), True),
        StructField("kind", StringType(), True),
        StructField("subject", StringType(), True),
        StructField("origin", StringType(), True),
        StructField("origin_ts_us", LongType(), True),
        StructField("event_id", StringType(), True),
        StructField("hops", LongType(), True),
        StructField("incarnation", LongType(), True),
        StructField("sim", BooleanType(), True),
        # optional: partition records only
        StructField("peers", StringType(), True),
        StructField("majority", BooleanType(), True),
        StructField("took_us", LongType(), True),
        StructField("suspicion_us", LongType(), True),
        # optional: session_handoff records only
        StructField("to", StringType(), True),
        StructField("outcome", StringType(), True),
        StructField("reason", StringType(), True),
        StructField("duration_ms", DoubleType(), True),
        StructField("messages", LongType(), True),
    ]
)

# A line without these is not a trace observation we can place in time.
REQUIRED_FIELDS: tuple[str, ...] = ("ts_us", "node", "kind")

# Name of the column Spark fills with lines it could not parse.
CORRUPT_COLUMN = "_corrupt_record"

# Kinds whose spread through the cluster is measured as dissemination.
BROADCAST_KINDS: tuple[str, ...] = ("broadcast", "route_add", "route_del", "config_set")
MEMBER_KINDS: tuple[str, ...] = ("member_alive", "member_suspect", "member_dead", "member_left")
DISSEMINATION_KINDS: tuple[str, ...] = BROADCAST_KINDS + MEMBER_KINDS

# Lifecycle records a node writes about itself.
END_KINDS: tuple[str, ...] = ("node_stop", "node_crash")
