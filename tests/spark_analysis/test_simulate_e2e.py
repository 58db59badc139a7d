"""End to end: `meshd simulate` writes traces and its ground truth (truth.json),
`meshd report` reads them, sets its figures next to the truth's and fails loudly
when they differ."""

from __future__ import annotations

import json

import pytest

from simulation.cli import simulate_main
from spark_analysis import cli

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    # a crash, its restart and a partition healed, in one run
    sim_dir = tmp_path_factory.mktemp("sim")
    argv = ["--nodes", "12", "--seconds", "50", "--crash", "1", "--crash-at", "5", "--restart-after", "10",
            "--partition", "0-6|7-11", "--partition-at", "22", "--heal-at", "34",
            "--broadcasts-per-s", "2", "--seed", "3", "--out", str(sim_dir), "--no-progress"]
    assert simulate_main(argv) == 0
    return sim_dir


@pytest.fixture(scope="module")
def reported(spark, simulated, tmp_path_factory):
    """`meshd report` on the run, once for the module: (out dir, stderr, exit status)."""
    import contextlib
    import io

    out = tmp_path_factory.mktemp("report")
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        # The simulator's summary.json and truth.json sit beside the traces: not read as traces.
        status = cli.main([str(simulated), "--out", str(out), "--master", "local[1]"])
    return out, err.getvalue(), status


def test_report_agrees_with_the_simulators_truth(simulated, reported):
    out, err, status = reported
    truth = json.loads((simulated / "truth.json").read_text())
    (crash,) = truth["crashes"]
    assert crash["restart_s"] == 15.0 and truth["declarations"]["by_class"]["partition"] > 0  # premise
    sim_summary = json.loads((simulated / "summary.json").read_text())
    assert status == 0, err
    assert "meshd report: [9/9] 100%" in err and f"open {out.resolve() / 'report.html'}" in err
    assert "against the simulator's truth" in err and "DIFFERS" not in err
    s = json.loads((out / "summary.json").read_text())
    assert s["truth_check"]["ok"] and s["sim"] is True and s["nodes"] == 12
    assert s["dissemination"]["by_kind"]["broadcast"]["events"] == sim_summary["broadcasts"]
    by_class = s["declarations"]["by_class"]
    assert by_class == truth["declarations"]["by_class"]
    assert by_class["restart"] > 0 and by_class["partition"] > 0 and s["false_positives"]["count"] == 0
    (det,) = s["detection"]["list"]
    assert det["all_dead_s"] == pytest.approx(crash["all_dead_s"], abs=1e-3)
    assert det["restart_ts_us"] is not None and s["detection"]["undetected"] == 0
    page = (out / "report.html").read_text()
    assert "agrees with the simulator" in page and (out / "timeline.png").stat().st_size > 5000


def test_a_report_that_disagrees_with_the_truth_fails_loudly(simulated, tmp_path, capsys):
    # the truth as if the report had missed two false positives (no Spark needed: the
    # comparison reads the summary)
    from spark_analysis.job import ReportResult
    from spark_analysis.truth_check import check

    sim_dir = tmp_path / "sim"
    sim_dir.mkdir()
    truth = json.loads((simulated / "truth.json").read_text())
    truth["declarations"]["by_class"]["false_positive"] = 2
    (sim_dir / "truth.json").write_text(json.dumps(truth))
    summary = {
        "detection": {"crashes": 1, "list": [{"member": c["node"], "crash_ts_us": round(c["crash_s"] * 1e6),
                                              "restart_ts_us": 1, "all_dead_s": c["all_dead_s"]}
                                             for c in truth["crashes"]]},
        "declarations": {"by_class": {**truth["declarations"]["by_class"], "false_positive": 0}},
        "false_positives": {"count": 0},
    }
    checked = check(summary, [str(sim_dir)])
    assert checked is not None and not checked["ok"]
    summary["truth_check"] = checked
    assert cli.report_outcome(ReportResult(summary, tmp_path, [])) == cli.TRUTH_MISMATCH
    err = capsys.readouterr().err
    assert "meshd report: error: the report disagrees with the simulator's truth" in err
    assert "false positives: report 0, truth 2" in err and "declarations: false positive" in err
    assert "crash of" in err and err.count("DIFFERS") == 2  # the crash times agree


def test_every_percentile_series_is_monotone(reported):
    s = json.loads((reported[0] / "summary.json").read_text())

    def ordered(*values):
        got = [v for v in values if v is not None]
        assert got == sorted(got), values

    d = s["dissemination"]
    for series in [d, *d["by_kind"].values()]:
        ordered(series["t50_s_median"], series["t90_s_median"], series["t99_s_median"])
        ordered(*(series["t100_s"][k] for k in ("p50", "p90", "p99", "max")))
        ordered(series["hops"]["p50"], series["hops"]["p99"])
    assert d["by_kind"]["broadcast"]["t99_s_median"] is not None  # there are series to compare
    for lag in s["per_node_lag"]:
        ordered(lag["lag_p50_s"], lag["lag_p99_s"], lag["lag_max_s"])
    det = s["detection"]
    ordered(det["all_dead_p50_s"], det["all_dead_p99_s"])
    for part in [s["partitions"], *s["partitions"]["by_side"].values()]:
        ordered(part["detection_s_p50"], part["detection_s_p99"], part["detection_s_max"])
        ordered(part["heal_s_p50"], part["heal_s_p99"], part["heal_s_max"])


def test_the_infection_curve_never_says_no_events_when_there_are_some():
    from spark_analysis.render import curve_note

    never = [{"fraction": f / 10, "p01_s": None, "p50_s": None, "p99_s": None} for f in range(1, 11)]
    assert "no dissemination events" in curve_note(never, 0)
    note = curve_note(never, 24484)
    assert note.startswith("24484 dissemination events") and "no dissemination events" not in note
    assert curve_note([{"fraction": 0.1, "p01_s": 0.1, "p50_s": None, "p99_s": None}], 5) is None
