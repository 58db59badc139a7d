"""The whole report on the scenario: summary.json, tables, page and plots."""

from __future__ import annotations

import csv
import json

import pytest

from spark_analysis.job import run_report
from spark_analysis.render import fmt_s

from .scenario import SCENARIO

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def report(spark, scenario_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    lines: list[str] = []
    result = run_report(spark, [str(scenario_dir)], out, formats=("html", "json", "csv"),
                        progress=lines.append)
    return result, out, lines


def test_summary_json_headline_numbers(report):
    _, out, _ = report
    s = json.loads((out / "summary.json").read_text())
    assert (s["nodes"], s["events"], s["time_span_s"]) == (4, len(SCENARIO), 80.0)
    assert s["dissemination"]["events"] == 8
    assert s["dissemination"]["t50_s_median"] == 0.5
    assert s["detection"].pop("list")[0]["member"] == "d"
    assert s["detection"] == {
        "crashes": 1, "first_suspect_p50_s": 1.0, "all_dead_p50_s": 7.0,
        "all_dead_p99_s": 7.0, "undetected": 0, "never_suspected": 0,
    }
    assert s["false_positives"] == {
        "count": 1, "list": [{"member": "c", "declared_by": "b", "ts_us": 50_000_000}]
    }
    part = s["partitions"]
    assert (part["count"], part["healed"], part["detection_s_p50"], part["heal_s_max"]) == (1, 1, 2.0, 10.0)
    assert [r["node"] for r in s["per_node_lag"]] == ["d", "c", "a", "b"]
    assert s["handoffs"] == {"count": 3, "by_outcome": {
        "fallback": {"handoffs": 1, "median_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0, "messages": 0},
        "ok": {"handoffs": 2, "median_ms": 12.0, "p99_ms": 30.0, "max_ms": 30.0, "messages": 7},
    }}
    assert s["percentiles"]["events"]["method"] == "exact"
    assert s["percentiles"]["coverage_times"]["interpolation"] == "nearest-rank"
    assert s["input"]["bad_lines"] == 0 and s["sim"] is True


def test_tables_are_written(report):
    _, out, _ = report
    with open(out / "events.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["event_id"] for r in rows] == ["E1", "E2", "S1", "D1", "E3", "D2", "A1", "S2"]
    assert rows[0]["t90_s"] == "2.0" and rows[1]["t90_s"] == ""
    with open(out / "nodes.csv") as f:
        nodes = {r["node"]: r for r in csv.DictReader(f)}
    assert nodes["d"]["end_kind"] == "node_crash" and nodes["d"]["lag_p50_s"] == "2.0"
    for name in ("crashes", "false_positives", "partitions"):
        assert len((out / f"{name}.csv").read_text().splitlines()) == 2  # header + one row
    with open(out / "handoffs.csv") as f:
        moves = list(csv.DictReader(f))
    assert [(r["client_id"], r["from_node"], r["to_node"], r["outcome"]) for r in moves] == [
        ("dev", "a", "b", "ok"), ("dev", "b", "c", "ok"), ("dev2", "d", "b", "fallback")]


def test_html_and_pngs(report):
    result, out, _ = report
    pngs = ["timeline.png", "infection_curve.png", "dissemination_cdf.png", "detection_latency.png",
            "per_node_lag.png"]
    for name in pngs:
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == len(pngs)  # self-contained
    d = result.summary["dissemination"]
    for label, value in [
        ("t50 median", fmt_s(d["t50_s_median"])),
        ("t90 median", fmt_s(d["t90_s_median"])),
        ("dead everywhere p50", fmt_s(7.0)),
        ("full coverage", "62.5 %"),
    ]:
        assert f"<td>{label}</td><td>{value}</td>" in page
    assert "<td>c</td><td>b</td><td>50.000</td>" in page  # the false positive row, seconds from the start
    # each figure links to the rows it was drawn from
    for rows in ("declarations.csv", "events.csv", "crashes.csv", "nodes.csv", "partitions.csv", "handoffs.csv"):
        assert f'<a href="{rows}">' in page and (out / rows).exists()
    # every section of the scenario has something: no note says why one is empty
    assert "class=empty" not in page


def test_progress_line_per_stage(report):
    _, _, lines = report
    stages = [line for line in lines if line.startswith("meshd report: [")]
    assert len(stages) == 9 and stages[-1].startswith("meshd report: [9/9] 100% ")
    assert stages[0].startswith("meshd report: [1/9]  11% load traces")


def test_large_input_path_gives_the_same_report(spark, scenario_dir, report, tmp_path, monkeypatch):
    # Small input keeps frames by local checkpoint, large input caches them
    # (spark_analysis/keep.py): the numbers must not depend on which.
    from spark_analysis import keep

    monkeypatch.setattr(keep, "CHECKPOINT_ROWS", 0)
    cached = run_report(spark, [str(scenario_dir)], tmp_path, formats=("json",), progress=lambda _: None)
    assert cached.summary == report[0].summary
