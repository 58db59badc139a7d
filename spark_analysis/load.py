"""The input edge: find trace files, parse them with the trace schema, count bad lines.

Local paths are expanded here (directories searched for ``*.jsonl``, rotated
``*.jsonl.N``, gzip ``*.gz`` and ``*.parquet``; shell globs expanded); a path with a
URI scheme (``hdfs://``, ``s3a://``, ...) goes to Spark untouched.
"""

from __future__ import annotations

import glob
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from .errors import NoTracesError, SchemaMismatchError
from .keep import keep, small
from .schema import CORRUPT_COLUMN, REQUIRED_FIELDS, TRACE_SCHEMA
from .stats import one_row

# <node>.jsonl, rotated <node>.jsonl.3, compressed <node>.jsonl.gz / .jsonl.3.gz. Plain
# .json is left alone in folders (summary.json sits beside simulator traces); a file
# named on the command line is read whatever its name.
_JSON_NAME = re.compile(r".*\.jsonl(\.\d+)?(\.gz)?$")
_PARQUET_NAME = re.compile(r".*\.parquet$")
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


@dataclass(frozen=True)
class Inputs:
    json_paths: list[str]
    parquet_paths: list[str]

    @property
    def count(self) -> int:
        return len(self.json_paths) + len(self.parquet_paths)

    def local_bytes(self) -> int | None:
        """Total size of the input files, None when some are remote (Spark lists those)."""
        total = 0
        for path in self.json_paths + self.parquet_paths:
            if _URI.match(path):
                return None
            total += Path(path).stat().st_size
        return total


@dataclass
class Loaded:
    traces: DataFrame  # TRACE_SCHEMA columns, valid rows only (cached JSON, or checkpointed when small)
    rows: int
    bad_lines: int
    files: int
    start_ts_us: int = 0  # first and last valid record (the same pass as the counts)
    end_ts_us: int = 0
    sim: bool = False


def _classify(name: str) -> str | None:
    if _PARQUET_NAME.match(name):
        return "parquet"
    if _JSON_NAME.match(name):
        return "json"
    return None


def resolve_inputs(paths: list[str]) -> Inputs:
    """Expand the command-line paths into trace files; raise NoTracesError if one has none."""
    if not paths:
        raise NoTracesError("no trace paths given")
    json_paths: list[str] = []
    parquet_paths: list[str] = []
    for raw in paths:
        if _URI.match(raw) and not raw.startswith("file://"):
            # Remote storage: Spark lists it; the format follows the name.
            (parquet_paths if ".parquet" in raw else json_paths).append(raw)
            continue
        local = raw[len("file://"):] if raw.startswith("file://") else raw
        matches = sorted(glob.glob(local)) if glob.has_magic(local) else [local]
        found = 0
        for match in matches:
            p = Path(match)
            if p.is_dir():
                candidates = sorted(f for f in p.rglob("*") if f.is_file())
            elif p.is_file():
                candidates = [p]
            else:
                continue
            for f in candidates:
                kind = _classify(f.name)
                # A file named explicitly is read as JSON Lines whatever its name.
                if kind is None and p.is_file():
                    kind = "json"
                if kind == "json":
                    json_paths.append(str(f.resolve()))
                    found += 1
                elif kind == "parquet":
                    parquet_paths.append(str(f.resolve()))
                    found += 1
        if not matches or not any(Path(m).exists() for m in matches):
            raise NoTracesError(f"{raw}: no such file or directory")
        if found == 0:
            raise NoTracesError(
                f"{raw}: no trace files (*.jsonl, *.jsonl.N, *.jsonl.gz, *.parquet)"
            )
    return Inputs(json_paths, parquet_paths)


def _read_json(spark: SparkSession, paths: list[str]) -> DataFrame:
    schema = StructType(TRACE_SCHEMA.fields + [StructField(CORRUPT_COLUMN, StringType(), True)])
    return (
        spark.read.schema(schema)
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", CORRUPT_COLUMN)
        .json(paths)
    )


def _read_parquet(spark: SparkSession, paths: list[str]) -> DataFrame:
    df = spark.read.parquet(*paths)
    present = {f.name: f.dataType for f in df.schema.fields}
    missing = [name for name in REQUIRED_FIELDS if name not in present]
    if missing:
        raise SchemaMismatchError(
            f"parquet input lacks trace field(s) {', '.join(missing)} "
            f"(has: {', '.join(sorted(present)) or 'nothing'})"
        )
    cols = []
    for field in TRACE_SCHEMA.fields:
        have = present.get(field.name)
        if have is None:
            cols.append(F.lit(None).cast(field.dataType).alias(field.name))
            continue
        numeric_ok = isinstance(field.dataType, LongType) and have.typeName() in (
            "long", "integer", "short", "byte",
        )
        if have != field.dataType and not numeric_ok:
            raise SchemaMismatchError(
                f"parquet field {field.name} is {have.simpleString()}, "
                f"expected {field.dataType.simpleString()}"
            )
        cols.append(F.col(field.name).cast(field.dataType).alias(field.name))
    cols.append(F.lit(None).cast(StringType()).alias(CORRUPT_COLUMN))
    return df.select(*cols)


def _describe_mismatch(samples: list[str]) -> str | None:
    """Say which fields are wrong when bad lines are JSON objects, else None."""
    problems: list[str] = []
    for line in samples:
        try:
            obj: Any = json.loads(line)
        except ValueError:
            return None
        if not isinstance(obj, dict):
            return None
        for field in TRACE_SCHEMA.fields:
            value = obj.get(field.name)
            if value is None:
                if field.name in REQUIRED_FIELDS:
                    problems.append(f"{field.name} missing")
                continue
            want_int = isinstance(field.dataType, LongType)
            if want_int and (isinstance(value, bool) or not isinstance(value, int)):
                problems.append(f"{field.name} is {type(value).__name__}, expected integer")
            elif isinstance(field.dataType, StringType) and not isinstance(value, str):
                problems.append(f"{field.name} is {type(value).__name__}, expected string")
    return "; ".join(dict.fromkeys(problems)) or None


def load_traces(
    spark: SparkSession, paths: list[str], *, decode_dir: Path | None = None
) -> Loaded:
    """Read every trace file under ``paths``; skip and count lines that do not parse.

    With ``decode_dir`` (local mode, a scratch folder that outlives the returned
    frame), local JSON files are decoded by pyarrow first (see ``arrow_decode``).
    Raises NoTracesError when nothing usable is found and SchemaMismatchError when
    the lines are JSON (or Parquet) but not trace records.
    """
    inputs = resolve_inputs(paths)
    json_paths, parquet_paths = inputs.json_paths, list(inputs.parquet_paths)
    if decode_dir is not None and json_paths and not any(_URI.match(p) for p in json_paths):
        from .arrow_decode import decode_to_parquet

        decoded, json_paths = decode_to_parquet(json_paths, decode_dir)
        parquet_paths += decoded
    frames = []
    if json_paths:
        frames.append(_read_json(spark, json_paths))
    if parquet_paths:
        frames.append(_read_parquet(spark, parquet_paths))
    if not frames:  # every file decoded to nothing: all empty
        raise NoTracesError(f"{', '.join(paths)}: trace files are empty")
    raw = frames[0] if len(frames) == 1 else frames[0].unionByName(frames[1])
    bad = F.col(CORRUPT_COLUMN).isNotNull()
    for name in REQUIRED_FIELDS:
        bad = bad | F.col(name).isNull()
    # JSON is parsed once: cache the typed fields (nulled on bad lines) and a bad-line
    # flag, not the raw text, since every metric reads these rows again. Parquet is
    # not cached: re-reading only the columns a metric needs costs less than building
    # the cache (10 M rows: ~2 s a pass against ~25 s).
    flagged = raw.select(
        *[F.when(~bad, F.col(f)).alias(f) for f in TRACE_SCHEMA.fieldNames()],
        bad.alias("_bad"),
    )
    if json_paths:
        flagged = flagged.cache()
    counts = one_row(flagged.agg(
        F.count(F.lit(1)).alias("total"), F.sum(F.col("_bad").cast("long")).alias("bad"),
        F.min("ts_us").alias("start"), F.max("ts_us").alias("end"),
        F.max(F.coalesce(F.col("sim"), F.lit(False)).cast("int")).alias("sim"),
    ))
    total, bad_lines = int(counts["total"]), int(counts["bad"] or 0)
    if total == 0:
        flagged.unpersist()
        raise NoTracesError(f"{', '.join(paths)}: trace files are empty")
    if bad_lines == total:
        flagged.unpersist()
        # Nothing usable, so the input is small or wrong: look at a few raw lines.
        samples = [
            r[0] or json.dumps({k: r[k] for k in TRACE_SCHEMA.fieldNames()})
            for r in raw.select(CORRUPT_COLUMN, *TRACE_SCHEMA.fieldNames()).limit(5).collect()
        ]
        detail = _describe_mismatch(samples)
        if detail:
            raise SchemaMismatchError(
                f"{', '.join(paths)}: lines are JSON but not trace records ({detail})"
            )
        raise NoTracesError(
            f"{', '.join(paths)}: no valid trace lines ({bad_lines} bad line(s) skipped)"
        )
    rows = total - bad_lines
    traces = flagged.filter(~F.col("_bad")).select(*TRACE_SCHEMA.fieldNames())
    if small(rows):
        # Small input: every metric plans from a leaf holding the valid rows (keep.py).
        traces = keep(traces, rows)
        flagged.unpersist()
    return Loaded(traces=traces, rows=rows, bad_lines=bad_lines, files=inputs.count,
                  start_ts_us=int(counts["start"]), end_ts_us=int(counts["end"]), sim=bool(counts["sim"]))
