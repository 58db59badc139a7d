"""The benchmark's smoke mode (`scripts/bench/run.py --smoke`) works end to end: meshd
and Mosquitto started side by side, each scenario driven, one JSON line per run and the
table written. That it works, not how fast: no figure is asserted beyond "nothing lost"."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

RUN = Path(__file__).resolve().parents[2] / "scripts" / "bench" / "run.py"


def test_smoke_run_drives_meshd_and_mosquitto_through_every_kind_of_scenario(tmp_path: Path) -> None:
    out = tmp_path / "run.jsonl"
    proc = subprocess.run(
        [sys.executable, str(RUN), "--smoke", "--brokers", "meshd,mosquitto", "--source", "worktree", "--no-pin",
         "--out", str(out)],
        capture_output=True, text=True, timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    header, records = lines[0], lines[1:]
    assert header["kind"] == "header" and header["smoke"] is True
    assert {(r["scenario"], r["broker"]) for r in records} == {
        (s, b) for s in ("fanin-qos1", "latency-qos0", "idle-5000") for b in ("meshd", "mosquitto")}
    for r in records:
        assert "error" not in r, r
        result = r["result"]
        if r["scenario"] == "fanin-qos1":
            assert result["delivered"] == result["expected"] > 0 and result["lost"] == 0, r
            assert result["cpu_us_per_msg"] is not None
        elif r["scenario"] == "latency-qos0":
            assert result["samples"] > 0 and result["lost"] == 0, r
        else:
            assert result["connected"] == 200 and result["rss_after_kb"] > 0, r
    table = out.with_suffix(".md").read_text()
    assert "meshd/mosquitto" in table and "**fanin-qos1**" in table
