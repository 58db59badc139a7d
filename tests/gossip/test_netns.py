"""Real LAN discovery: gossip nodes in separate network namespaces find each other
by mDNS alone (no seeds), and ignore a node of another cluster name."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("netlab", ROOT / "scripts" / "netlab.py")
assert _spec is not None and _spec.loader is not None
netlab = importlib.util.module_from_spec(_spec)
sys.modules["netlab"] = netlab
_spec.loader.exec_module(netlab)

pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(not netlab.has_net_admin(), reason="needs CAP_NET_ADMIN to build network namespaces"),
]


def _members(path: Path) -> dict[str, str]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {m["id"]: m["state"] for m in data["members"]}


def _start(lab: Any, tmp_path: Path, i: int, *extra: str) -> subprocess.Popen[Any]:
    logf = open(tmp_path / f"g{i}.log", "w")
    return lab.popen(
        i,
        [sys.executable, "-m", "gossip", "--node-id", f"g{i}", "--bind", f"{lab.hosts[i].address}:7946",
         "--preset", "local", "--members-file", str(tmp_path / f"g{i}.json"), *extra],
        cwd=str(ROOT), stdout=logf, stderr=subprocess.STDOUT,
    )


def _wait(cond: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.2)
    return False


def test_a_split_heals_by_mdns_alone(tmp_path: Path) -> None:
    """No seeds and no address retries (--reconnect-dead-for 0): after a split long
    enough for the lost member to be forgotten, only mDNS re-announcements (every 3 s
    on the local preset) can bring the sides together again, and they do."""
    procs: list[subprocess.Popen[Any]] = []
    with netlab.NetLab(hosts=3) as lab:
        try:
            for i in range(3):
                procs.append(_start(lab, tmp_path, i, "--reconnect-dead-for", "0", "--log-level", "info"))
            whole = {"g0": "alive", "g1": "alive", "g2": "alive"}
            assert _wait(lambda: all(_members(tmp_path / f"g{i}.json") == whole for i in range(3)), 40)
            lab.split([2])
            # dead, then reaped (10 s on the local preset): g0 and g1 forget g2 entirely
            assert _wait(lambda: all("g2" not in _members(tmp_path / f"g{i}.json") for i in (0, 1)), 40)
            assert _wait(lambda: all(v != "alive" for k, v in _members(tmp_path / "g2.json").items() if k != "g2"), 60)
            lab.heal()
            healed = _wait(lambda: all(_members(tmp_path / f"g{i}.json") == whole for i in range(3)), 30)
            logs = {i: (tmp_path / f"g{i}.log").read_text() for i in range(3)}
            assert healed, ({i: _members(tmp_path / f"g{i}.json") for i in range(3)}, logs[2][-2000:])
            assert all(p.poll() is None for p in procs)
            # the way back was an mDNS discovery of the other side
            assert "mDNS found g2" in logs[0] + logs[1] or "mDNS found g0" in logs[2] or "mDNS found g1" in logs[2]
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


def test_three_namespaces_join_by_mdns_without_seeds(tmp_path: Path) -> None:
    procs: list[subprocess.Popen[Any]] = []
    with netlab.NetLab(hosts=4) as lab:
        try:
            for i, host in enumerate(lab.hosts):
                cluster = "lab" if i < 3 else "other"
                logf = open(tmp_path / f"g{i}.log", "w")
                procs.append(
                    lab.popen(
                        i,
                        [sys.executable, "-m", "gossip", "--node-id", f"g{i}", "--bind", f"{host.address}:7946",
                         "--cluster", cluster, "--preset", "local", "--members-file", str(tmp_path / f"g{i}.json")],
                        cwd=str(ROOT), stdout=logf, stderr=subprocess.STDOUT,
                    )
                )
            want = {"g0": "alive", "g1": "alive", "g2": "alive"}
            deadline = time.monotonic() + 40
            while time.monotonic() < deadline:
                if all(_members(tmp_path / f"g{i}.json") == want for i in range(3)):
                    break
                assert all(p.poll() is None for p in procs), (tmp_path / "g0.log").read_text()
                time.sleep(0.2)
            views = {i: _members(tmp_path / f"g{i}.json") for i in range(4)}
            assert all(views[i] == want for i in range(3)), (views, (tmp_path / "g0.log").read_text())
            # the node of another cluster saw the announcements and joined nobody
            assert views[3] == {"g3": "alive"}
            # and a cut cable is noticed: g2 goes dead for the other two
            lab.split([2])
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if all(_members(tmp_path / f"g{i}.json").get("g2") == "dead" for i in (0, 1)):
                    break
                time.sleep(0.2)
            assert all(_members(tmp_path / f"g{i}.json").get("g2") == "dead" for i in (0, 1))
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert lab.prefix not in names  # the lab removed itself
