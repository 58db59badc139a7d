"""The writer in gossip/ and the reader's StructType agree (DESIGN.md, "Traces")."""

from __future__ import annotations

import pytest
from pyspark.sql.types import BooleanType, LongType, StringType
from pyspark.testing import assertDataFrameEqual

from gossip.trace import OPTIONAL_FIELDS, TRACE_FIELDS, TraceWriter, trace_record
from spark_analysis.load import load_traces
from spark_analysis.schema import TRACE_SCHEMA

pytestmark = pytest.mark.spark


def test_schema_declares_exactly_the_writer_fields():
    assert tuple(TRACE_SCHEMA.fieldNames()) == TRACE_FIELDS + OPTIONAL_FIELDS
    types = {f.name: f.dataType for f in TRACE_SCHEMA.fields}
    assert types["majority"] == BooleanType() and types["took_us"] == LongType() and types["peers"] == StringType()
    # Timestamps are microseconds since the epoch: past 2**31, so 64-bit.
    assert types["ts_us"] == LongType() and types["origin_ts_us"] == LongType()
    assert types["sim"] == BooleanType() and types["node"] == StringType()


def test_rotated_writer_output_reads_back_with_the_schema(spark, tmp_path):
    records = [
        trace_record(
            ts_us=1_700_000_000_000_000 + i,
            node="n1",
            kind="broadcast" if i % 2 else "member_suspect",
            subject=f"s{i}",
            origin="n0",
            origin_ts_us=1_700_000_000_000_000,
            event_id=f"e{i}",
            hops=i % 4,
            incarnation=i if i % 3 else None,
            sim=bool(i % 2),
            note="extra fields are allowed and ignored",
            # partition records carry the optional fields; others leave them out
            **({"peers": "n3,n4", "majority": bool(i % 2), "took_us": 1000 * i, "suspicion_us": 4_000_000}
               if i % 5 == 0 else {}),
        )
        for i in range(40)
    ]
    # Small max_bytes: the writer rotates to n1.jsonl.1, .2, ... on the way.
    with TraceWriter(tmp_path, "n1", max_bytes=2000, backups=50) as writer:
        for rec in records:
            writer.write(rec)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert "n1.jsonl.1" in files and len(files) > 2

    # FAILFAST: any line the schema cannot take raises instead of nulling.
    strict = spark.read.schema(TRACE_SCHEMA).option("mode", "FAILFAST").json(
        [str(p) for p in tmp_path.iterdir()]
    )
    expected = spark.createDataFrame(
        [tuple(rec.get(f) for f in TRACE_FIELDS + OPTIONAL_FIELDS) for rec in records], TRACE_SCHEMA
    )
    assertDataFrameEqual(strict, expected)

    loaded = load_traces(spark, [str(tmp_path)])
    assert (loaded.rows, loaded.bad_lines, loaded.files) == (40, 0, len(files))
    assertDataFrameEqual(loaded.traces, expected)

    # The local fast path (pyarrow decodes, Spark reads Parquet) gives the same rows.
    fast = load_traces(spark, [str(tmp_path)], decode_dir=tmp_path.parent / "decoded")
    assert (fast.rows, fast.bad_lines) == (40, 0)
    assert list((tmp_path.parent / "decoded").glob("*.parquet"))
    assertDataFrameEqual(fast.traces, expected)
