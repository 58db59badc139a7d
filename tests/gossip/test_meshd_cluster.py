"""Five full ``meshd`` processes on 127.0.0.1 joined by seeds: one view at
``GET /api/v1/members`` and in ``meshd members``; kill -9 one, the others mark it
dead; restart it, it rejoins."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any, Callable

from mesh.http_client import HttpClientError, request_json
from tests.support import free_port, meshd_command, run_cli, subprocess_env

from .test_processes import free_port as free_udp_tcp_port


class Meshd:
    def __init__(self, tmp: Path, name: str, seeds: list[int]) -> None:
        self.name = name
        self.data = tmp / name
        self.http = free_port()
        self.gossip = free_udp_tcp_port()
        self.seeds = seeds
        self.proc: subprocess.Popen[Any] | None = None
        self.log = tmp / f"{name}.log"

    def start(self) -> "Meshd":
        argv = meshd_command() + [
            "--node-id", self.name, "--data-dir", str(self.data), "--mqtt", "127.0.0.1:0", "--ws", "off",
            "--http", f"127.0.0.1:{self.http}", "--gossip", f"127.0.0.1:{self.gossip}", "--no-mdns",
        ]
        for port in self.seeds:
            argv += ["--seed", f"127.0.0.1:{port}"]
        self.proc = subprocess.Popen(argv, stdout=open(self.log, "a"), stderr=subprocess.STDOUT, env=subprocess_env())
        return self

    def members(self) -> dict[str, dict[str, Any]]:
        try:
            status, body = request_json(f"127.0.0.1:{self.http}", "GET", "/api/v1/members", timeout=2.0)
        except HttpClientError:
            return {}
        if status != 200 or not isinstance(body, dict):
            return {}
        return {m["id"]: m for m in body["members"]}

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()


def wait_for(cond: Callable[[], bool], timeout: float, what: str, nodes: list[Meshd]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.2)
    views = {n.name: {k: v["state"] for k, v in n.members().items()} for n in nodes}
    raise AssertionError(f"timed out waiting for {what}: {views}")


def test_five_meshd_nodes_kill9_and_rejoin(tmp_path: Path) -> None:
    first = Meshd(tmp_path, "m0", [])
    nodes = [first]
    nodes += [Meshd(tmp_path, f"m{i}", [first.gossip]) for i in range(1, 5)]
    ids = [n.name for n in nodes]
    try:
        for n in nodes:
            n.start()

        def state(n: Meshd, member: str) -> str | None:
            return n.members().get(member, {}).get("state")

        wait_for(lambda: all(state(n, m) == "alive" for n in nodes for m in ids), 40, "one view", nodes)
        cli = run_cli(["members", "--http", f"127.0.0.1:{nodes[1].http}"])
        assert cli.returncode == 0, cli.stderr
        lines = cli.stdout.splitlines()
        assert lines[0].split()[:3] == ["ID", "ADDRESS", "STATE"]
        assert sorted(line.split()[0] for line in lines[1:6]) == ids
        assert f"127.0.0.1:{nodes[2].gossip}" in cli.stdout and "5 members: 5 alive" in cli.stdout

        victim = nodes[3]
        victim.kill9()
        others = [n for n in nodes if n is not victim]
        wait_for(lambda: all(state(n, "m3") == "dead" for n in others), 60, "m3 dead", nodes)
        dead_inc = others[0].members()["m3"]["incarnation"]

        victim.start()  # same data dir and gossip port: the same member comes back
        wait_for(lambda: all(state(n, "m3") == "alive" for n in others), 40, "m3 alive again", nodes)
        assert others[0].members()["m3"]["incarnation"] > dead_inc
        wait_for(lambda: all(state(victim, m) == "alive" for m in ids), 40, "m3 sees everyone", nodes)
        for n in nodes:
            assert n.proc is not None
            n.proc.terminate()  # graceful: leave, flush traces, exit 0
        for n in nodes:
            assert n.proc is not None and n.proc.wait(timeout=20) == 0
    finally:
        for n in nodes:
            if n.proc is not None and n.proc.poll() is None:
                n.proc.kill()
                n.proc.wait()
    traces = list((tmp_path / "m0" / "traces").glob("m0.jsonl*"))
    assert traces and "member_dead" in traces[0].read_text()
