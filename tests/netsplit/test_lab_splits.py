"""Real splits: five `meshd` processes in network namespaces, cables moved between
bridges by scripts/netlab.py.  Runs with the fast (`local`) gossip preset, like the
other cluster tests; the three scenarios share one cluster, each leaving it whole.

Nodes join through n0 as a seed; n0 itself has no seed and mDNS is off, so when n0
is the one cut off (4|1) only the reconnect to lost members can bring it back.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from mesh.http_client import HttpClientError, request_json
from tests.support import subprocess_env, wait_ready

ROOT = Path(__file__).resolve().parents[2]
if "netlab" not in sys.modules:
    _spec = importlib.util.spec_from_file_location("netlab", ROOT / "scripts" / "netlab.py")
    assert _spec is not None and _spec.loader is not None
    _mod = importlib.util.module_from_spec(_spec)
    sys.modules["netlab"] = _mod
    _spec.loader.exec_module(_mod)
netlab = sys.modules["netlab"]

pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(not netlab.has_net_admin(), reason="needs CAP_NET_ADMIN to build network namespaces"),
]

N = 5
HTTP = "127.0.0.1:18083"  # each host's own loopback, reached through in_host
NAMES = [f"n{i}" for i in range(N)]
FIGURES: dict[str, Any] = {}


class LabCluster:
    def __init__(self, lab: Any, base: Path, extra: tuple[str, ...] = ()) -> None:
        self.lab = lab
        self.base = base
        self.extra = extra  # more meshd flags for every node
        self.procs: list[subprocess.Popen[Any]] = []

    def start(self) -> None:
        seed = f"{self.lab.hosts[0].address}:7946"
        for i, host in enumerate(self.lab.hosts):
            log = open(self.base / f"n{i}.log", "w")
            argv = [
                sys.executable, "-m", "mesh.cli", "--node-id", f"n{i}", "--data-dir", str(self.base / f"n{i}"),
                "--mqtt", f"{host.address}:1883", "--ws", "off", "--http", HTTP, "--gossip", f"{host.address}:7946",
                "--gossip-preset", "local", "--no-mdns", "--sys-interval", "0", "--log-level", "info",
                "--ready-file", self.ready_file(i),
            ] + (["--seed", seed] if i else []) + list(self.extra)
            self.procs.append(self.lab.popen(i, argv, cwd=str(ROOT), stdout=log, stderr=subprocess.STDOUT, env=subprocess_env()))
        for i, p in enumerate(self.procs):  # every listener bound before anyone asks
            wait_ready(p, self.ready_file(i), lambda i=i: (self.base / f"n{i}.log").read_text()[-3000:])

    def ready_file(self, i: int) -> str:
        return str(self.base / f"n{i}.ready.json")

    def stop(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def cluster(self, i: int) -> dict[str, Any]:
        status, body = self.lab.in_host(i, request_json, HTTP, "GET", "/api/v1/cluster")
        assert status == 200
        return body

    def view(self, i: int) -> dict[str, str]:
        try:
            return {m["id"]: m["state"] for m in self.cluster(i)["members"]}
        except (OSError, HttpClientError):
            return {}  # not listening yet

    def one_view(self, hosts: list[int] | None = None) -> bool:
        want = dict.fromkeys(NAMES, "alive")
        return all(self.view(i) == want for i in (hosts if hosts is not None else range(N)))

    def sees_dead(self, i: int, others: list[int]) -> bool:
        v = self.view(i)
        return all(v.get(f"n{j}") in ("dead", None) for j in others) and all(
            v.get(f"n{j}") == "alive" for j in range(N) if j not in others and j != i
        )

    def traces(self, i: int, kind: str) -> list[dict]:
        path = self.base / f"n{i}" / "traces" / f"n{i}.jsonl"
        out = []
        for line in path.read_text().splitlines() if path.exists() else []:
            rec = json.loads(line)
            if rec["kind"] == kind:
                out.append(rec)
        return out

    def assert_running(self) -> None:
        for i, p in enumerate(self.procs):
            assert p.poll() is None, (self.base / f"n{i}.log").read_text()[-3000:]


def wait_for(cond: Callable[[], bool], timeout: float, what: str, during: Callable[[], None] | None = None) -> float:
    """Seconds until ``cond()`` held (``during`` runs every poll, to assert invariants)."""
    t0 = time.monotonic()
    while True:
        if during is not None:
            during()
        if cond():
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def lab_cluster(tmp_path_factory):
    base = tmp_path_factory.mktemp("labsplit")
    with netlab.NetLab(hosts=N) as lab:
        c = LabCluster(lab, base)
        try:
            c.start()
            wait_for(lambda: (c.assert_running(), c.one_view())[1], 30, "five nodes in one view")
            yield c
        finally:
            c.stop()
            (base / "figures.json").write_text(json.dumps(FIGURES, indent=2))
            print("\nlab figures:", json.dumps(FIGURES), "\ntraces under", base)


@pytest.fixture
def whole_cluster(lab_cluster):
    """The module's cluster, healed and in one view again after the test, pass or fail:
    the scenarios share it, and a failure left split would fail the next one too."""
    yield lab_cluster
    lab_cluster.lab.heal()
    wait_for(lab_cluster.one_view, 30, "one view again after the test")


def test_three_two_split_each_side_marks_the_other_dead_and_heals(whole_cluster):
    c = whole_cluster
    c.lab.split([3, 4])
    t0, done = time.monotonic(), {}

    def both_sides() -> bool:
        for side, cond in (("a", lambda: all(c.sees_dead(i, [3, 4]) for i in (0, 1, 2))),
                           ("b", lambda: all(c.sees_dead(i, [0, 1, 2]) for i in (3, 4)))):
            if side not in done and cond():
                done[side] = time.monotonic() - t0
        return len(done) == 2

    wait_for(both_sides, 20, "each side holds the other dead")
    t_a, t_b = done["a"], done["b"]
    # GET /api/v1/cluster on both sides shows the partition, each from its own side
    for i, remote, majority in ((0, ["n3", "n4"], True), (3, ["n0", "n1", "n2"], False)):
        body: dict = {}

        def shown() -> bool:
            nonlocal body
            body = c.cluster(i)
            return body["partitioned"] and sorted(body["partitions"][0]["remote"]) == remote

        wait_for(shown, 10, f"n{i} shows the partition")
        (p,) = body["partitions"]
        assert p["majority"] is majority and sorted(p["local"]) == sorted(set(NAMES) - set(remote))
        assert sorted(body["unreachable"]) == remote
    c.lab.heal()
    heal = wait_for(c.one_view, 10, "one view within 10 s of the link returning")
    wait_for(lambda: not any(c.cluster(i)["partitioned"] for i in range(N)), 10, "no partition left")
    # partition_healed traced on both sides (traces reach the disk about a second late)
    wait_for(lambda: all(c.traces(i, "partition_healed") for i in range(N)), 5, "partition_healed traced")
    det = c.traces(4, "partition_detected")[-1]
    assert det["peers"] == "n0,n1,n2" and det["majority"] is False
    FIGURES["3|2"] = {"side_3_marked_dead_s": round(t_a, 2), "side_2_marked_dead_s": round(t_b, 2), "one_view_after_heal_s": round(heal, 2)}


def test_isolated_node_does_not_evict_the_four(whole_cluster):
    c = whole_cluster
    four = [1, 2, 3, 4]
    suspicions: set[tuple[int, str]] = set()

    def four_stay_whole() -> None:
        # Eviction is a member of the four declared dead (or reaped) by another of the
        # four.  A passing suspicion is not: with the local preset's 0.1 s probe timeout a
        # loaded machine delays an ack now and then, and SWIM's suspicion, refuted by the
        # suspect, is exactly what keeps that from evicting it.  Suspicions are counted.
        for i in four:
            v = c.view(i)
            if not v:
                continue  # the HTTP answer did not come: no view, nothing to judge
            gone = {f"n{j}": v.get(f"n{j}", "missing") for j in four if j != i and v.get(f"n{j}") not in ("alive", "suspect")}
            assert not gone, f"n{i} evicted {gone} during a 4|1 split (its view: {v})"
            suspicions.update((i, m) for m, s in v.items() if m != "n0" and s == "suspect")

    c.lab.split([0])  # n0 has no seed: nothing but reconnect brings it back
    t4 = wait_for(lambda: all(c.sees_dead(i, [0]) for i in four), 20, "the four hold n0 dead", four_stay_whole)
    # Lifeguard holds the isolated node back, but it does learn it is alone
    t1 = wait_for(lambda: c.sees_dead(0, four), 40, "n0 holds the four dead", four_stay_whole)
    body = c.cluster(0)
    assert body["partitioned"] and body["partitions"][0]["majority"] is False
    four_stay_whole()
    c.lab.heal()
    heal = wait_for(c.one_view, 10, "one view within 10 s of the link returning")
    FIGURES["4|1"] = {"four_marked_dead_s": round(t4, 2), "isolated_marked_dead_s": round(t1, 2), "one_view_after_heal_s": round(heal, 2),
                      "suspicions_among_the_four": sorted(f"n{i}->{m}" for i, m in suspicions)}


def test_split_longer_than_suspicion_and_reap_heals(whole_cluster):
    c = whole_cluster
    c.lab.split([2, 3])
    wait_for(lambda: all(c.sees_dead(i, [2, 3]) for i in (0, 1, 4)), 20, "n0,n1,n4 hold n2,n3 dead")
    # local preset: dead members are forgotten (reaped) 10 s after they died
    wait_for(lambda: all("n2" not in c.view(i) for i in (0, 1, 4)), 20, "n2 reaped by the others")
    c.assert_running()
    c.lab.heal()
    heal = wait_for(c.one_view, 10, "one view within 10 s of the link returning")
    FIGURES["long 3|2"] = {"one_view_after_heal_s": round(heal, 2)}
