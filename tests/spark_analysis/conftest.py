"""One local SparkSession for the whole folder, and the hand-built trace scenario."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="needs the spark extra")

from gossip.trace import TraceWriter  # noqa: E402

from .scenario import SCENARIO  # noqa: E402


@pytest.fixture(scope="session")
def spark():
    import os

    os.environ["PYSPARK_PYTHON"] = sys.executable
    from spark_analysis.session import build_session

    session = build_session(
        "local[1]",
        app_name="meshd-tests",
        conf={
            "spark.sql.shuffle.partitions": "1",
            "spark.default.parallelism": "1",
            "spark.driver.memory": "1g",
            "spark.sql.adaptive.enabled": "false",
            # Tiny data: compiling whole-stage code and C2-optimising the JVM cost
            # more than they save.
            "spark.sql.codegen.wholeStage": "false",
            "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
        },
    )
    yield session
    session.stop()


def write_traces(directory: Path, records: list[dict]) -> Path:
    """Write records with the real TraceWriter, one file per observing node."""
    writers: dict[str, TraceWriter] = {}
    for rec in records:
        w = writers.get(rec["node"])
        if w is None:
            w = writers[rec["node"]] = TraceWriter(directory, rec["node"])
        w.write(rec)
    for w in writers.values():
        w.close()
    return directory


@pytest.fixture(scope="session")
def scenario_dir(tmp_path_factory) -> Path:
    return write_traces(tmp_path_factory.mktemp("scenario"), SCENARIO)
