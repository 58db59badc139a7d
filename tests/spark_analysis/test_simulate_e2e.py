"""End to end: `meshd simulate` writes traces, `meshd report` reads them, and the two
agree on what the simulator knows for certain (broadcast count, crash detection)."""

from __future__ import annotations

import json

import pytest

from simulation.cli import simulate_main
from spark_analysis import cli

pytestmark = pytest.mark.spark


def test_report_on_simulated_cluster_matches_the_simulator(spark, tmp_path, capsys):
    sim_dir, out = tmp_path / "sim", tmp_path / "report"
    argv = ["--nodes", "20", "--seconds", "30", "--crash", "1", "--crash-at", "10",
            "--broadcasts-per-s", "2", "--seed", "3", "--out", str(sim_dir), "--no-progress"]
    assert simulate_main(argv) == 0
    truth = json.loads((sim_dir / "summary.json").read_text())
    assert truth["crashed"] == 1 and truth["crash_dead_coverage"] == 1.0  # premise

    # The simulator's summary.json sits beside the traces and must not be read as one.
    assert cli.main([str(sim_dir), "--out", str(out), "--master", "local[1]"]) == 0
    assert "meshd report: [8/8]" in capsys.readouterr().err
    s = json.loads((out / "summary.json").read_text())

    assert s["sim"] is True and s["nodes"] == 20 and s["input"]["bad_lines"] == 0
    assert s["time_span_s"] <= 30.0
    bcast = s["dissemination"]["by_kind"]["broadcast"]
    assert bcast["events"] == truth["broadcasts"]
    if truth["broadcast_coverage"] == 1.0:
        # Every live node got every broadcast; only a node that crashed before
        # hearing one can make an event fall short of full coverage.
        assert bcast["full_coverage_ratio"] >= 1 - 1 / truth["broadcasts"]
    det = s["detection"]
    assert (det["crashes"], det["undetected"]) == (1, 0)
    # With one crash, "dead at every live node" is the simulator's slowest observer.
    assert det["all_dead_p50_s"] == pytest.approx(truth["crash_to_dead_max_s"], abs=1e-3)
    assert 0 < det["first_suspect_p50_s"] < det["all_dead_p50_s"]
    assert s["false_positives"]["count"] == 0 == truth["false_dead"]
    assert (out / "report.html").stat().st_size > 10_000
