"""The mesh scale benchmarks' smoke modes work end to end (issue 27): the route table
at a small size (built, looked up, pulled whole by a new node in bounded frames) and
the gossip simulator at a small size. That they work, not how fast."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "scripts" / "bench"


def run(script: str, *args: str) -> list[dict]:
    proc = subprocess.run([sys.executable, str(BENCH / script), *args, "--smoke"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def test_route_scale_builds_looks_up_and_hands_a_new_node_the_whole_table() -> None:
    (res,) = run("route_scale.py", "--routes", "20000")
    assert res["routes"] == 20000 and res["bytes_per_route"] > 0
    assert res["big_lookup_us"] > 0 and res["small_lookup_us"] > 0
    assert res["big_routes_matched_per_topic"] >= 1 and res["small_routes_matched_per_topic"] >= 1
    assert res["pull_frames"] >= 1 and res["pull_bytes"] > 0


def test_gossip_scale_runs_the_simulator_and_reads_its_summary() -> None:
    (res,) = run("gossip_scale.py", "--nodes", "30", "--seconds", "8")
    assert res["nodes"] == 30 and res["cpu_speed_x"] > 0 and res["max_rss_mb"] > 0
    assert res["broadcasts"] > 0 and res["broadcast_coverage"] == 1.0 and res["broadcast_p99_s"] is not None
