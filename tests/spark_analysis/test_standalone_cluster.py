"""`meshd report --master spark://...` on a real standalone Spark cluster: a master and
two workers on 127.0.0.1 started from the installed pyspark (`spark-class`), the report
run as the command a user types, and its summary equal to local mode's, number for
number.  On a simulated 200-node run with a crash and a netsplit (and its truth file:
the cluster run checks itself against the simulator too), and on the recorded real
5-node run (data/real5: a kill -9, a restart, graceful stops).

The master and workers start while the 200-node run is simulated, each cluster report
runs beside local mode's in this process, and all are stopped by PID.  Slow (five JVMs
and a simulation), but part of the suite."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from mesh.http_client import request_json
from simulation.cli import simulate_main
from spark_analysis.job import run_report
from tests.support import free_port, subprocess_env, wait_for

pytestmark = pytest.mark.spark
REAL5 = Path(__file__).resolve().parent / "data" / "real5"
MASTER_AT = re.compile(rb"Starting Spark master at spark://[\d.]+:(\d+)")
MASTER_UI_AT = re.compile(rb"MasterWebUI to [\d.]+, and started at http://[\w.]+:(\d+)")
SIM_ARGV = ["--nodes", "200", "--seconds", "25", "--crash", "1", "--crash-at", "2", "--partition", "0-119|120-199",
            "--partition-at", "4", "--heal-at", "16", "--broadcasts-per-s", "1", "--seed", "2", "--no-progress"]


def spark_class() -> str:
    import pyspark

    return str(Path(pyspark.__file__).parent / "bin" / "spark-class")


class Standalone:
    """A master and its workers, each a `spark-class` child process."""

    def __init__(self, base: Path, workers: int = 2) -> None:
        self.base = base
        self.port, self.ui = free_port(), free_port()
        self.workers = workers
        self.procs: list[subprocess.Popen[bytes]] = []
        self.env = {**subprocess_env(), "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_LOG_DIR": str(base),
                    "SPARK_WORKER_DIR": str(base / "work"), "PYSPARK_PYTHON": sys.executable,
                    "XDG_CACHE_HOME": str(base / "cache")}  # the driver's class archive (class_archive.py)

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _spawn(self, name: str, *argv: str) -> None:
        log = open(self.base / f"{name}.log", "wb")
        self.procs.append(subprocess.Popen([spark_class(), *argv], stdout=log, stderr=subprocess.STDOUT,
                                           env=self.env, cwd=self.base))

    def alive_workers(self) -> int:
        try:
            status, body = request_json(f"127.0.0.1:{self.ui}", "GET", "/json/")
        except OSError:
            return 0
        return int(body.get("aliveworkers", 0)) if status == 200 else 0

    def _spawn_workers(self) -> None:
        for i in range(self.workers):
            self._spawn(f"worker{i}", "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                        "--webui-port", str(free_port()), "--cores", "1", "--memory", "1g", self.url)

    def _master_ports(self) -> tuple[int, int] | None:
        log = (self.base / "master.log").read_bytes()
        rpc, ui = MASTER_AT.search(log), MASTER_UI_AT.search(log)
        return (int(rpc.group(1)), int(ui.group(1))) if rpc and ui else None

    def launch(self) -> "Standalone":
        """Start the master and the workers without waiting for them (``ready`` waits)."""
        self._spawn("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                    "--port", str(self.port), "--webui-port", str(self.ui))
        self._spawn_workers()
        return self

    def ready(self) -> "Standalone":
        # Another process can take a free_port() before the master binds it; Spark then
        # takes the next port, and the workers, told the first one, must be told again.
        ports = wait_for(self._master_ports, timeout=120, what="the master's ports in master.log")
        if ports != (self.port, self.ui):
            self.port, self.ui = ports
            self._stop(self.procs[1:])
            del self.procs[1:]
            self._spawn_workers()
        wait_for(lambda: self.alive_workers() == self.workers, timeout=120, what="master with two workers")
        return self

    def stop(self) -> None:
        self._stop(self.procs)

    @staticmethod
    def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
        for p in procs:  # by PID, each one we started
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Standalone]:
    if shutil.which("java") is None:
        raise RuntimeError("the standalone cluster needs Java 17 (scripts/test installs what the suite needs)")
    c = Standalone(tmp_path_factory.mktemp("standalone"))
    try:
        # the JVMs start while the 200-node run is simulated; the test waits for them
        yield c.launch()
    finally:
        c.stop()


@pytest.fixture(scope="module")
def sim200(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sim200")
    assert simulate_main(SIM_ARGV + ["--out", str(out)]) == 0
    return out


@contextmanager
def generated_code(spark, on: bool) -> Iterator[None]:
    """Whole-stage code generation on in the shared session for one report (the tests'
    session runs tiny inputs without it)."""
    key = "spark.sql.codegen.wholeStage"
    before = spark.conf.get(key)
    spark.conf.set(key, str(on).lower())
    try:
        yield
    finally:
        spark.conf.set(key, before)


def start_report_on_cluster(cluster: Standalone, traces: Path, out: Path) -> subprocess.Popen[str]:
    """`meshd report --master spark://...` as a user types it, started in the background."""
    return subprocess.Popen(
        [sys.executable, "-m", "mesh.cli", "report", str(traces), "--out", str(out), "--master", cluster.url,
         "--conf", "spark.executor.memory=1g", "--conf", "spark.cores.max=2"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=cluster.env,
    )


@pytest.mark.parametrize("which", ["sim200", "real5"])
def test_standalone_cluster_summary_equals_local_mode(spark, cluster, sim200, tmp_path, which):
    traces = sim200 if which == "sim200" else REAL5
    # the cluster's report runs while local mode's runs in this process (two cores)
    proc = start_report_on_cluster(cluster.ready(), traces, tmp_path / "cluster")
    try:
        with generated_code(spark, which == "sim200"):  # as `meshd report` sets it for this input's size
            local = run_report(spark, [str(traces)], tmp_path / "local", formats=("json",),
                               progress=lambda _: None).summary
        _, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-4000:]
    remote = json.loads((tmp_path / "cluster" / "summary.json").read_text())
    assert remote == local
    # it did run on the cluster: the master lists the application as finished
    _, body = request_json(f"127.0.0.1:{cluster.ui}", "GET", "/json/")
    assert any(app["name"] == "meshd-report" for app in body.get("completedapps", []))
    assert "meshd report: [9/9] 100%" in err and f"open {(tmp_path / 'cluster' / 'report.html').resolve()}" in err
    if which == "sim200":
        assert remote["truth_check"]["ok"] and remote["partitions"]["count"] > 0 and remote["nodes"] == 200
    else:
        # the real run: n3 was killed and started again; every death declaration of it was right
        assert remote["declarations"]["by_class"]["restart"] == remote["declarations"]["count"] > 0
        assert remote["false_positives"]["count"] == 0 and remote["detection"]["crashes"] == 1
    # the driver left its classes for the next report, complete under the final name
    cache = Path(cluster.env["XDG_CACHE_HOME"]) / "meshd"
    assert len(list(cache.glob("spark-classes-*.jsa"))) == 1 and not list(cache.glob("*.tmp"))
