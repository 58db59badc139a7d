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

from . import dissemination, failures, handoffs, lifetimes, partitions, summary, truth_check
from .errors import ReportError
from .keep import keep
from .load import load_traces
from .render import PlotData, Timeline, render_report
from .stats import APPROX_ACCURACY, EXACT_LIMIT, Method, choose_method

FORMATS = ("html", "json", "csv", "parquet")
DEFAULT_FORMATS = ("html", "json", "csv")
PLOT_EVENT_LIMIT = 200_000  # events collected for the CDF; sampled above this
STAGES = 9


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
        for row in df.collect():  # per event / node / crash: small; one job, not one per partition
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
        done = round(100 * self.n / STAGES)
        self.progress(f"meshd report: [{self.n}/{STAGES}] {done:3d}% {name} ({dt:.1f} s)")
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

    def provisional(df: DataFrame) -> Method:
        # Input of at most exact_limit rows has no larger group: exact, without a
        # counting pass (the group's size is filled in from the result).
        if loaded.rows <= exact_limit:
            return Method(exact=True, largest_group=-1)
        return choose_method(df, limit=exact_limit)

    def settled(method: Method, rows: int) -> Method:
        return Method(exact=True, largest_group=rows) if method.largest_group < 0 else method

    def basics() -> tuple[DataFrame, DataFrame, DataFrame, dict[str, Any]]:
        life = keep(lifetimes.node_lifetimes(traces, crash_grace_us), loaded.rows)
        heads = keep(dissemination.alive_counts(traces, life), loaded.rows)
        obs = keep(dissemination.observations(traces, life, heads), loaded.rows)
        facts = {
            "nodes": life.select("node").distinct().count(),
            "observations": obs.count(),  # a large input's cache is filled inside this stage
            "time_span_s": (loaded.end_ts_us - loaded.start_ts_us) / 1e6,
            "start_ts_us": loaded.start_ts_us,
            "sim": loaded.sim,
        }
        return life, obs, heads, facts

    life, obs, heads, facts = stages.run("node lifetimes and observations", basics)

    def dissem() -> tuple[DataFrame, DataFrame, dict[str, Any], Method]:
        arrays = keep(dissemination.delay_arrays(obs, heads), loaded.rows)
        events = keep(dissemination.event_table(arrays), loaded.rows)
        ev_method = provisional(events)
        dsum = summary.dissemination_summary(events, obs, ev_method)
        return arrays, events, dsum, settled(ev_method, dsum["events"])

    arrays, events, dissem_summary, ev_method = stages.run("dissemination", dissem)

    def parts() -> tuple[DataFrame, dict[str, Any]]:
        episodes = keep(partitions.partition_episodes(traces), loaded.rows)
        part_method = provisional(episodes)
        part = summary.partition_summary(episodes, part_method)
        return episodes, part

    episodes, part_summary = stages.run("partitions", parts)

    def detect() -> tuple[DataFrame, DataFrame, DataFrame, dict[str, Any], dict[str, Any], dict[str, Any]]:
        crashed = lifetimes.crashes(life)
        det = keep(failures.detection(traces, life, crashed), loaded.rows)
        classified = keep(failures.declarations(traces, life, episodes), loaded.rows)
        fp = failures.false_positives(classified)
        method = provisional(det)
        decl = summary.declaration_summary(classified)
        return (det, classified, fp, summary.detection_summary(det, method),
                summary.false_positive_summary(fp, decl["by_class"]["false_positive"]), decl)

    det, classified, fp, det_summary, fp_summary, decl_summary = stages.run(
        "crash detection and declarations", detect)

    def lag_stage() -> tuple[DataFrame, list, Method]:
        lag_method = choose_method(obs, ["node"], limit=exact_limit)
        lag = keep(dissemination.per_node_lag(obs, lag_method), loaded.rows)
        return lag, summary.lag_summary(lag), lag_method

    lag, lag_top, lag_method = stages.run("per-node lag", lag_stage)

    def sessions() -> tuple[DataFrame, dict[str, Any]]:
        moves = keep(handoffs.handoffs(traces), loaded.rows)
        return moves, summary.handoff_summary(moves)

    moves, handoff_summary = stages.run("session handoffs", sessions)

    result_summary: dict[str, Any] = {
        "nodes": facts["nodes"],
        "events": loaded.rows,
        "time_span_s": summary.json_number(facts["time_span_s"]),
        "start_ts_us": facts["start_ts_us"],  # the run's start: figures count seconds from here
        "observations": facts["observations"],
        "sim": facts["sim"],
        "input": {"paths": list(paths), "files": loaded.files, "bad_lines": loaded.bad_lines},
        "dissemination": dissem_summary,
        "detection": det_summary,
        "false_positives": fp_summary,
        "declarations": decl_summary,
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

    checked = truth_check.check(result_summary, paths)
    if checked is not None:
        result_summary["truth_check"] = checked

    def tables() -> None:
        nodes = life.join(lag, "node", "left").orderBy("node")
        frames = {
            "events": events.orderBy("origin_ts_us", "event_id"),
            "nodes": nodes,
            "crashes": det.orderBy("crash_ts_us", "member"),
            "false_positives": fp.orderBy("ts_us", "member"),
            "declarations": classified.orderBy("ts_us", "event_id"),
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
        plots = collect_plot_data(arrays, events, det, dissem_summary["events"])
        plots.lag = lag_top
        plots.timeline = collect_timeline(classified, episodes, det, facts["start_ts_us"])
        html_path = render_report(result_summary, plots, out, formats)
        written.extend(sorted(out.glob("*.png")) + [html_path])

    stages.run("plots and html", page)
    for df in (traces, life, obs, heads, arrays, events, det, classified, lag, episodes, moves):
        df.unpersist()
    return ReportResult(result_summary, out, written, stages.timings)


def collect_timeline(classified: DataFrame, episodes: DataFrame, det: DataFrame, start_us: int) -> Timeline:
    """Declarations per class and second, crashes, restarts and partitions, in seconds
    from the run's start (aggregated in Spark: a few rows per second of the run)."""
    tl = Timeline()
    sec = F.floor((F.col("ts_us") - F.lit(start_us)) / 1e6).cast("long")
    for r in classified.groupBy(sec.alias("s"), "class").count().collect():
        tl.declarations.setdefault(r["class"], {})[int(r["s"])] = int(r["count"])
    for r in det.select("member", "crash_ts_us", "restart_ts_us").collect():
        tl.crashes.append((r["member"], (r["crash_ts_us"] - start_us) / 1e6,
                           None if r["restart_ts_us"] is None else (r["restart_ts_us"] - start_us) / 1e6))
    # a crash is a partition of one to the detector: shade only groups of two or more
    span = episodes.filter(F.size(F.split("peers", ",")) > 1).agg(
        F.min("detected_ts_us"), F.max("healed_ts_us"), F.count(F.lit(1)), F.count("healed_ts_us")
    ).first()
    if span is not None and span[2]:
        tl.partition = ((span[0] - start_us) / 1e6,
                        None if span[1] is None or span[3] < span[2] else (span[1] - start_us) / 1e6)
    return tl


def collect_plot_data(arrays: DataFrame, events: DataFrame, det: DataFrame, n_events: int) -> PlotData:
    """Bring the (small) series the plots need to the driver."""
    plots = PlotData(events=n_events)
    plots.curve = [r.asDict() for r in dissemination.infection_curve(arrays).collect()] if n_events else []
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
