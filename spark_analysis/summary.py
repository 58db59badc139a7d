"""From result frames to the plain dicts of summary.json (the only place that collects)."""

from __future__ import annotations

import math
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from .failures import CLASSES
from .handoffs import handoff_summary as per_outcome
from .stats import Method, one_row, pct

LIST_LIMIT = 1000  # rows kept in summary.json lists; the CSV tables hold them all
LAG_TOP = 10


def json_number(value: Any, digits: int = 6) -> Any:
    """JSON-safe number: rounded floats, None for null/NaN."""
    if value is None:
        return None
    if isinstance(value, float):
        return None if math.isnan(value) else round(value, digits)
    return value


def counts_percentile(counts: list[tuple[float, int]], p: float) -> float | None:
    """Exact linear-interpolation percentile (as Spark's ``percentile``) from a
    histogram of ``(value, count)``; used for hop counts, which are small integers."""
    pairs = sorted((v, n) for v, n in counts if v is not None and n > 0)
    total = sum(n for _, n in pairs)
    if total == 0:
        return None
    pos = p * (total - 1)
    lo_i, frac = int(math.floor(pos)), pos - math.floor(pos)

    def value_at(i: int) -> float:
        seen = 0
        for v, n in pairs:
            seen += n
            if i < seen:
                return float(v)
        return float(pairs[-1][0])

    lo = value_at(lo_i)
    return lo if frac == 0 else lo + frac * (value_at(lo_i + 1) - lo)


# An event that never reached a level counts as infinitely slow in the medians of
# t50/t90/t99 (a stand-in far beyond any run; results past NEVER_CUT read as null).
# Taking every median over the same events keeps them ordered: per event
# t50 <= t90 <= t99, so the medians are too (medians over only the events that
# reached each level are not: fewer, faster events reach 90 %).
NEVER_S = 1e18
NEVER_CUT_S = 1e9


def _reached_median(col: str, ev: Method) -> Column:
    m = pct(F.coalesce(F.col(col), F.lit(NEVER_S)), 0.5, ev)
    return F.when(m < NEVER_CUT_S, m)


def _dissemination_aggs(ev: Method) -> list:
    full_t100 = F.when(F.col("full_coverage"), F.col("t100_s"))
    event_aggs = [
        F.count(F.lit(1)).alias("events"),
        F.avg(F.col("full_coverage").cast("double")).alias("full_coverage_ratio"),
        _reached_median("t50_s", ev).alias("t50_s_median"),
        _reached_median("t90_s", ev).alias("t90_s_median"),
        _reached_median("t99_s", ev).alias("t99_s_median"),
        pct(full_t100, 0.5, ev).alias("t100_p50"),
        pct(full_t100, 0.9, ev).alias("t100_p90"),
        pct(full_t100, 0.99, ev).alias("t100_p99"),
        F.max(full_t100).alias("t100_max"),
    ]
    return event_aggs


def _shape(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "events": int(row.get("events") or 0),
        "full_coverage_ratio": json_number(row.get("full_coverage_ratio")),
        "t50_s_median": json_number(row.get("t50_s_median")),
        "t90_s_median": json_number(row.get("t90_s_median")),
        "t99_s_median": json_number(row.get("t99_s_median")),
        "t100_s": {k: json_number(row.get(f"t100_{k}")) for k in ("p50", "p90", "p99", "max")},
        "hops": {k: json_number(row.get(f"hops_{k}")) for k in ("p50", "p99")},
    }


def dissemination_summary(events: DataFrame, obs: DataFrame, ev: Method) -> dict[str, Any]:
    """Overall and ``by_kind`` dissemination numbers (see the issue's summary shape).

    Hop percentiles are exact at any size: hops are small integers, so a histogram
    per kind (a few dozen rows) is collected and interpolated here."""
    event_aggs = _dissemination_aggs(ev)
    overall = one_row(events.agg(*event_aggs)).asDict()
    by_kind_rows = {r["kind"]: r.asDict() for r in events.groupBy("kind").agg(*event_aggs).collect()}
    hist: dict[str, list[tuple[float, int]]] = {}
    per_event = obs.groupBy("event_id", "hops").count()  # ~events x distinct hops rows
    kinds = events.select("event_id", "kind")
    for r in per_event.join(kinds, "event_id").groupBy("kind", "hops").agg(F.sum("count")).collect():
        hist.setdefault(r["kind"], []).append((r["hops"], r[2]))
    everything = [pair for pairs in hist.values() for pair in pairs]
    for target, pairs in [(overall, everything)] + [
        (by_kind_rows.setdefault(k, {"kind": k}), v) for k, v in hist.items()
    ]:
        target["hops_p50"] = counts_percentile(pairs, 0.5)
        target["hops_p99"] = counts_percentile(pairs, 0.99)
    result = _shape(overall)
    result["by_kind"] = {k: _shape(v) for k, v in sorted(by_kind_rows.items())}
    return result


def detection_summary(det: DataFrame, method: Method) -> dict[str, Any]:
    row = one_row(det.agg(
        F.count(F.lit(1)).alias("crashes"),
        pct("first_suspect_s", 0.5, method).alias("first_suspect_p50_s"),
        pct("all_dead_s", 0.5, method).alias("all_dead_p50_s"),
        pct("all_dead_s", 0.99, method).alias("all_dead_p99_s"),
        F.sum(F.col("all_dead_s").isNull().cast("int")).alias("undetected"),
        F.sum(F.col("first_suspect_s").isNull().cast("int")).alias("never_suspected"),
    ))
    crashes = det.orderBy("crash_ts_us", "member").limit(LIST_LIMIT).collect()
    return {
        "list": [
            {
                "member": r["member"], "crash_ts_us": int(r["crash_ts_us"]), "source": r["source"],
                "restart_ts_us": r["restart_ts_us"], "first_suspect_s": json_number(r["first_suspect_s"]),
                "all_dead_s": json_number(r["all_dead_s"]), "observers": int(r["observers"]),
                "declared": int(r["declared"]),
            }
            for r in crashes
        ],
        "crashes": int(row["crashes"]),
        "first_suspect_p50_s": json_number(row["first_suspect_p50_s"]),
        "all_dead_p50_s": json_number(row["all_dead_p50_s"]),
        "all_dead_p99_s": json_number(row["all_dead_p99_s"]),
        "undetected": int(row["undetected"] or 0),
        "never_suspected": int(row["never_suspected"] or 0),
    }


def false_positive_summary(fp: DataFrame, count: int | None = None) -> dict[str, Any]:
    """``count`` when known (from the classification), else counted here."""
    if count is None:
        count = fp.count()
    rows = fp.orderBy("ts_us", "member", "declared_by").limit(LIST_LIMIT).collect()
    return {
        "count": count,
        "list": [
            {"member": r["member"], "declared_by": r["declared_by"], "ts_us": int(r["ts_us"])}
            for r in rows
        ],
    }


def declaration_summary(classified: DataFrame) -> dict[str, Any]:
    """How many ``member_dead`` declarations fell in each class (README, "Classification")."""
    counts = {r["class"]: int(r["count"]) for r in classified.groupBy("class").count().collect()}
    return {"count": sum(counts.values()), "by_class": {c: counts.get(c, 0) for c in CLASSES}}


def _partition_aggs(method: Method) -> list:
    return [
        F.count(F.lit(1)).alias("count"),
        F.count("healed_ts_us").alias("healed"),
        pct("detection_s", 0.5, method).alias("detection_s_p50"),
        pct("detection_s", 0.99, method).alias("detection_s_p99"),
        F.max("detection_s").alias("detection_s_max"),
        pct("suspect_to_dead_s", 0.5, method).alias("suspect_to_dead_s_p50"),
        F.max("suspect_to_dead_s").alias("suspect_to_dead_s_max"),
        F.sum(F.col("within_bound").cast("int")).alias("within_bound"),
        F.count("within_bound").alias("bound_known"),
        pct("heal_s", 0.5, method).alias("heal_s_p50"),
        pct("heal_s", 0.99, method).alias("heal_s_p99"),
        F.max("heal_s").alias("heal_s_max"),
    ]


def _partition_shape(row: dict[str, Any]) -> dict[str, Any]:
    out = {k: json_number(row.get(k)) for k in (
        "detection_s_p50", "detection_s_p99", "detection_s_max", "suspect_to_dead_s_p50", "suspect_to_dead_s_max",
        "heal_s_p50", "heal_s_p99", "heal_s_max",
    )}
    out.update(count=int(row.get("count") or 0), healed=int(row.get("healed") or 0))
    known = int(row.get("bound_known") or 0)
    # detections within suspicion timeout + 3 s, of those whose timeout is known
    out["within_bound"] = f"{int(row.get('within_bound') or 0)}/{known}" if known else None
    return out


def partition_summary(episodes: DataFrame, method: Method) -> dict[str, Any]:
    """Overall and per side (``majority`` / ``minority``, as each observer saw its
    own side) detection and heal times."""
    aggs = _partition_aggs(method)
    result = _partition_shape(one_row(episodes.agg(*aggs)).asDict())
    side = F.when(F.col("majority"), "majority").when(~F.col("majority"), "minority").otherwise("unknown")
    by_side = {r["side"]: _partition_shape(r.asDict()) for r in episodes.groupBy(side.alias("side")).agg(*aggs).collect()}
    result["by_side"] = {k: by_side[k] for k in sorted(by_side)}
    rows = episodes.orderBy("detected_ts_us", "node").limit(LIST_LIMIT).collect()
    result["list"] = [
        {
            "node": r["node"],
            "subject": r["subject"],
            "peers": r["peers"],
            "majority": r["majority"],
            "detected_ts_us": r["detected_ts_us"],
            "healed_ts_us": r["healed_ts_us"],
            "detection_s": json_number(r["detection_s"]),
            "suspect_to_dead_s": json_number(r["suspect_to_dead_s"]),
            "heal_s": json_number(r["heal_s"]),
            "split_s": json_number(r["split_s"]),
            "within_bound": r["within_bound"],
        }
        for r in rows
    ]
    return result


def lag_summary(lag: DataFrame, top: int = LAG_TOP) -> list[dict[str, Any]]:
    rows = lag.orderBy(F.col("lag_p50_s").desc_nulls_last(), "node").limit(top).collect()
    return [
        {
            "node": r["node"],
            "observations": int(r["observations"]),
            "lag_p50_s": json_number(r["lag_p50_s"]),
            "lag_p99_s": json_number(r["lag_p99_s"]),
            "lag_max_s": json_number(r["lag_max_s"]),
        }
        for r in rows
    ]


def handoff_summary(rows: DataFrame) -> dict[str, Any]:
    """Session handoffs per outcome: count, duration median / p99 / max, messages."""
    by_outcome = {
        r["outcome"]: {
            "handoffs": r["handoffs"],
            "median_ms": json_number(r["median_ms"]),
            "p99_ms": json_number(r["p99_ms"]),
            "max_ms": json_number(r["max_ms"]),
            "messages": r["messages"] or 0,
        }
        for r in per_outcome(rows).collect()
    }
    return {"count": sum(v["handoffs"] for v in by_outcome.values()), "by_outcome": by_outcome}
