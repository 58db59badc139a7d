"""Building the SparkSession: local by default, any master Spark accepts otherwise."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[*]"
LOG4J_CONFIG = Path(__file__).with_name("log4j2.properties")


def build_session(
    master: str = DEFAULT_MASTER,
    *,
    app_name: str = "meshd-report",
    conf: dict[str, str] | None = None,
) -> SparkSession:
    """Start a SparkSession with quiet logs and UTC session time (or return the active one).

    ``master`` is passed to Spark unchanged: ``local[*]``, ``local[2]``,
    ``spark://host:7077``, ``yarn``, ``k8s://https://...``.
    """
    active = SparkSession.getActiveSession()
    if active is not None:
        # Already inside a Spark application (tests, notebooks): run in it.
        return active
    # Executors must run the same interpreter as the driver (local mode included).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # Without the file (a wheel built without package data) Spark's defaults apply.
    java_opts = f"-Dlog4j.configurationFile=file:{LOG4J_CONFIG}" if LOG4J_CONFIG.exists() else ""
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.extraJavaOptions", java_opts)
        .config("spark.executor.extraJavaOptions", java_opts)
    )
    if master.startswith("local"):
        # One machine: a few shuffle partitions beat the default 200 tiny tasks.
        builder = builder.config("spark.sql.shuffle.partitions", "8")
    for key, value in (conf or {}).items():
        if key in ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"):
            value = f"{java_opts} {value}".strip()  # keep the quiet-logging option
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
