"""The report job: load traces, run the transforms, write summary, tables and page.

Storage is touched only here and in ``load``; everything between is
``DataFrame -> DataFrame``.
"""

from __future__ import annotations

import csv
import json
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from . import dissemination, failures, handoffs, lifetimes, partitions, summary
from .errors import ReportError
from .load import load_traces
from .render import PlotData, render_report
from .stats import APPROX_ACCURACY, EXACT_LIMIT, Method, choose_method, one_row

FORMATS = ("html", "json", "csv", "parquet")
DEFAULT_FORMATS = ("html", "json", "csv")
PLOT_EVENT_LIMIT = 200_000  # events collected for the CDF; sampled above this
STAGES = 8


@dataclass
class ReportResult:
    summary: dict[str, Any]
    out: Path
    files: list[Path]
    timings: dict[str, float] = field(default_factory=dict)


def stderr_progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def parse_formats(spec: str) -> tuple[str, ...]:
    formats = tuple(f.strip().lower() for f in spec.split(",") if f.strip())
    unknown = [f for f in formats if f not in FORMATS]
    if unknown or not formats:
        raise ReportError(
            f"unknown format(s) {', '.join(unknown) or '(none)'}; choose from {', '.join(FORMATS)}"
        )
    return formats


def write_csv(df: DataFrame, path: Path) -> Path:
    """Stream a frame to one CSV file on the driver (tables here are per event / per node)."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(df.columns)
        for row in df.toLocalIterator():
            w.writerow(["" if v is None else v for v in row])
    return path


def write_parquet(df: DataFrame, path: Path) -> Path:
    df.coalesce(1).write.mode("overwrite").parquet(str(path))
    return path


class _Stages:
    def __init__(self, progress: Callable[[str], None]) -> None:
        self.progress = progress
        self.timings: dict[str, float] = {}
        self.n = 0

    def run(self, name: str, fn: Callable[[], Any]) -> Any:
        self.n += 1
        t0 = time.perf_counter()
        result = fn()
        dt = time.perf_counter() - t0
        self.timings[name] = round(dt, 3)
        self.progress(f"meshd report: [{self.n}/{STAGES}] {name} ({dt:.1f} s)")
        return result


def run_report(
    spark: SparkSession,
    paths: list[str],
    out: str | Path,
    *,
    formats: tuple[str, ...] = DEFAULT_FORMATS,
    crash_grace_us: int = lifetimes.DEFAULT_CRASH_GRACE_US,
    progress: Callable[[str], None] = stderr_progress,
    exact_limit: int = EXACT_LIMIT,
) -> ReportResult:
    """Build the whole report for ``paths`` into directory ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    # Local mode reads local JSON through pyarrow into a scratch folder that must
    # outlive the cached frames (Spark may re-read evicted blocks).
    scratch = None
    if (spark.sparkContext.master or "").startswith("local"):
        scratch = tempfile.TemporaryDirectory(prefix="meshd-report-")
    try:
        return _run(spark, paths, out, formats, crash_grace_us, progress, exact_limit,
                    Path(scratch.name) if scratch else None)
    finally:
        if scratch is not None:
            scratch.cleanup()


def _run(
    spark: SparkSession,
    paths: list[str],
    out: Path,
    formats: tuple[str, ...],
    crash_grace_us: int,
    progress: Callable[[str], None],
    exact_limit: int,
    scratch: Path | None,
) -> ReportResult:
    stages = _Stages(progress)
    written: list[Path] = []
    loaded = stages.run("load traces", lambda: load_traces(spark, paths, decode_dir=scratch))
    if loaded.bad_lines:
        progress(f"meshd report: skipped {loaded.bad_lines} bad line(s)")
    traces = loaded.traces

    def basics() -> tuple[DataFrame, DataFrame, DataFrame, dict[str, Any]]:
        life = lifetimes.node_lifetimes(traces, crash_grace_us).cache()
        heads = dissemination.alive_counts(traces, life).cache()
        obs = dissemination.observations(traces, life, heads).cache()
        span = one_row(traces.agg(
            F.min("ts_us"), F.max("ts_us"), F.max(F.col("sim").cast("int"))
        ))
        facts = {
            "nodes": life.count(),
            "observations": obs.count(),  # materializes the cache inside this stage
            "time_span_s": (span[1] - span[0]) / 1e6,
            "sim": bool(span[2]),
        }
        return life, obs, heads, facts

    life, obs, heads, facts = stages.run("node lifetimes and observations", basics)

    def dissem() -> tuple[DataFrame, DataFrame, dict[str, Any], Method]:
        arrays = dissemination.delay_arrays(obs, heads).cache()
        events = dissemination.event_table(arrays).cache()
        ev_method = choose_method(events, limit=exact_limit)
        dsum = summary.dissemination_summary(events, obs, ev_method)
        return arrays, events, dsum, ev_method

    arrays, events, dissem_summary, ev_method = stages.run("dissemination", dissem)

    def detect() -> tuple[DataFrame, DataFrame, dict[str, Any], dict[str, Any]]:
        crashed = lifetimes.crashes(life)
        det = failures.detection(traces, life, crashed).cache()
        fp = failures.false_positives(traces).cache()
        method = choose_method(det, limit=exact_limit)
        return det, fp, summary.detection_summary(det, method), summary.false_positive_summary(fp)

    det, fp, det_summary, fp_summary = stages.run("crash detection and false positives", detect)

    def lag_and_partitions() -> tuple[DataFrame, DataFrame, list, dict[str, Any], Method]:
        lag_method = choose_method(obs, ["node"], limit=exact_limit)
        lag = dissemination.per_node_lag(obs, lag_method).cache()
        episodes = partitions.partition_episodes(traces).cache()
        part_method = choose_method(episodes, limit=exact_limit)
        return lag, episodes, summary.lag_summary(lag), summary.partition_summary(episodes, part_method), lag_method

    lag, episodes, lag_top, part_summary, lag_method = stages.run(
        "per-node lag and partitions", lag_and_partitions
    )

    def sessions() -> tuple[DataFrame, dict[str, Any]]:
        moves = handoffs.handoffs(traces).cache()
        return moves, summary.handoff_summary(moves)

    moves, handoff_summary = stages.run("session handoffs", sessions)

    result_summary: dict[str, Any] = {
        "nodes": facts["nodes"],
        "events": loaded.rows,
        "time_span_s": summary.json_number(facts["time_span_s"]),
        "observations": facts["observations"],
        "sim": facts["sim"],
        "input": {"paths": list(paths), "files": loaded.files, "bad_lines": loaded.bad_lines},
        "dissemination": dissem_summary,
        "detection": det_summary,
        "false_positives": fp_summary,
        "partitions": part_summary,
        "handoffs": handoff_summary,
        "per_node_lag": lag_top,
        "percentiles": {
            "exact_limit_rows_per_group": exact_limit,
            "approx_accuracy": APPROX_ACCURACY,
            "coverage_times": {"method": "exact", "interpolation": "nearest-rank"},
            "events": ev_method.as_json(),
            "hops": {"method": "exact", "interpolation": "linear", "from": "histogram"},
            "per_node_lag": lag_method.as_json(),
        },
    }

    def tables() -> None:
        nodes = life.join(lag, "node", "left").orderBy("node")
        frames = {
            "events": events.orderBy("origin_ts_us", "event_id"),
            "nodes": nodes,
            "crashes": det.orderBy("crash_ts_us", "member"),
            "false_positives": fp.orderBy("ts_us", "member"),
            "partitions": episodes.orderBy("detected_ts_us", "node"),
            "handoffs": moves.orderBy("ts_us", "client_id"),
        }
        for name, df in frames.items():
            if "csv" in formats:
                written.append(write_csv(df, out / f"{name}.csv"))
            if "parquet" in formats:
                written.append(write_parquet(df, out / f"{name}.parquet"))
        if "json" in formats:
            path = out / "summary.json"
            path.write_text(json.dumps(result_summary, indent=2) + "\n", encoding="utf-8")
            written.append(path)

    stages.run("write tables", tables)

    def page() -> None:
        if "html" not in formats:
            return
        plots = collect_plot_data(arrays, events, det)
        plots.lag = lag_top
        html_path = render_report(result_summary, plots, out)
        written.extend(sorted(out.glob("*.png")) + [html_path])

    stages.run("plots and html", page)
    for df in (traces, life, obs, heads, arrays, events, det, fp, lag, episodes, moves):
        df.unpersist()
    return ReportResult(result_summary, out, written, stages.timings)


def collect_plot_data(arrays: DataFrame, events: DataFrame, det: DataFrame) -> PlotData:
    """Bring the (small) series the plots need to the driver."""
    plots = PlotData()
    plots.curve = [r.asDict() for r in dissemination.infection_curve(arrays).collect()]
    n_events = events.count()
    sample = events if n_events <= PLOT_EVENT_LIMIT else events.sample(
        fraction=PLOT_EVENT_LIMIT / n_events, seed=7
    )
    for r in sample.select("kind", "t100_s").collect():
        if r["t100_s"] is None:
            plots.incomplete_by_kind[r["kind"]] = plots.incomplete_by_kind.get(r["kind"], 0) + 1
        else:
            plots.t100_by_kind.setdefault(r["kind"], []).append(r["t100_s"])
    for r in det.select("first_suspect_s", "all_dead_s").collect():
        if r["first_suspect_s"] is not None:
            plots.first_suspect_s.append(r["first_suspect_s"])
        if r["all_dead_s"] is not None:
            plots.all_dead_s.append(r["all_dead_s"])
    return plots
