"""Real processes on 127.0.0.1: five gossip-only nodes (``python -m gossip``) join
through a seed, one is killed with SIGKILL, the others mark it dead, it restarts and
rejoins.  (The same scenario against full ``meshd`` nodes belongs with the node's
tests once mesh/node.py starts the gossip service.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

from tests.support import free_port

ROOT = Path(__file__).resolve().parents[2]


def members(path: Path) -> dict[str, dict[str, Any]]:
    try:
        return {m["id"]: m for m in json.loads(path.read_text())["members"]}
    except (OSError, ValueError, KeyError):
        return {}


def wait_for(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_five_processes_kill9_and_rejoin(tmp_path: Path) -> None:
    ids = [f"p{i}" for i in range(5)]
    ports = {i: free_port() for i in ids}
    procs: dict[str, subprocess.Popen[Any]] = {}
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("MESHD_CLUSTER_KEY", None)

    def start(node: str) -> None:
        argv = [sys.executable, "-m", "gossip", "--node-id", node, "--bind", f"127.0.0.1:{ports[node]}",
                "--no-mdns", "--preset", "local", "--members-file", str(tmp_path / f"{node}.json"),
                "--trace-dir", str(tmp_path / "traces")]
        if node != "p0":
            argv += ["--seed", f"127.0.0.1:{ports['p0']}"]
        log = open(tmp_path / f"{node}.log", "a")
        procs[node] = subprocess.Popen(argv, cwd=str(ROOT), env=env, stdout=log, stderr=subprocess.STDOUT)

    def state(observer: str, member: str) -> str | None:
        return members(tmp_path / f"{observer}.json").get(member, {}).get("state")

    try:
        for node in ids:
            start(node)
        wait_for(lambda: all(state(o, m) == "alive" for o in ids for m in ids), 30, "one view of five")

        procs["p3"].send_signal(signal.SIGKILL)
        procs["p3"].wait()
        others = [i for i in ids if i != "p3"]
        wait_for(lambda: all(state(o, "p3") == "dead" for o in others), 30, "p3 dead everywhere")
        dead_inc = members(tmp_path / "p0.json")["p3"]["incarnation"]

        (tmp_path / "p3.json").unlink()
        start("p3")
        wait_for(lambda: all(state(o, "p3") == "alive" for o in others), 30, "p3 back")
        assert members(tmp_path / "p0.json")["p3"]["incarnation"] > dead_inc
        wait_for(lambda: all(state("p3", m) == "alive" for m in ids), 30, "p3 sees everyone")

        # SIGTERM is a graceful leave
        procs["p4"].send_signal(signal.SIGTERM)
        assert procs["p4"].wait(timeout=15) == 0
        wait_for(lambda: all(state(o, "p4") == "left" for o in ids if o != "p4"), 30, "p4 left")
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    traces = [json.loads(line) for f in (tmp_path / "traces").glob("*.jsonl") for line in f.read_text().splitlines()]
    assert any(r["kind"] == "member_dead" and r["subject"] == "p3" for r in traces)
    assert any(r["kind"] == "member_left" and r["subject"] == "p4" for r in traces)
