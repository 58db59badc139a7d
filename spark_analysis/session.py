"""Building the SparkSession: local by default, any master Spark accepts otherwise."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pyspark import SparkContext
from pyspark.sql import SparkSession

from . import class_archive

DEFAULT_MASTER = "local[*]"
LOG4J_CONFIG = Path(__file__).with_name("log4j2.properties")


def build_session(
    master: str = DEFAULT_MASTER,
    *,
    app_name: str = "meshd-report",
    conf: dict[str, str] | None = None,
    class_archive_root: Path | None = None,
    use_class_archive: bool = False,
) -> SparkSession:
    """Start a SparkSession with quiet logs and UTC session time (or return the active one).

    ``master`` is passed to Spark unchanged: ``local[*]``, ``local[2]``,
    ``spark://host:7077``, ``yarn``, ``k8s://https://...``. With
    ``use_class_archive`` the driver JVM maps (or, the first time, writes) the class
    archive of ``class_archive``; call ``finish_session`` when done with Spark.
    """
    active = SparkSession.getActiveSession()
    if active is not None:
        # Already inside a Spark application (tests, notebooks): run in it.
        return active
    # Executors must run the same interpreter as the driver (local mode included).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # Without the file (a wheel built without package data) Spark's defaults apply.
    java_opts = f"-Dlog4j.configurationFile=file:{LOG4J_CONFIG}" if LOG4J_CONFIG.exists() else ""
    archive = class_archive.plan(class_archive_root) if use_class_archive else None
    try:
        return _start(master, app_name, conf or {}, java_opts, archive)
    except Exception:
        if archive is None or archive.writing is not None:
            raise
        # A JVM that will not start with the archive (damaged on disk): start without it.
        class_archive.discard(archive)
        return _start(master, app_name, conf or {}, java_opts, None)


_writing_archive: class_archive.ArchivePlan | None = None


def _start(
    master: str, app_name: str, conf: dict[str, str], java_opts: str,
    archive: class_archive.ArchivePlan | None,
) -> SparkSession:
    global _writing_archive
    driver_opts = f"{java_opts} {archive.java_options}".strip() if archive else java_opts
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.extraJavaOptions", driver_opts)
        .config("spark.executor.extraJavaOptions", java_opts)
    )
    if master.startswith("local"):
        # One machine: a few shuffle partitions beat the default 200 tiny tasks.
        builder = builder.config("spark.sql.shuffle.partitions", "8")
    for key, value in conf.items():
        if key == "spark.driver.extraJavaOptions":
            value = f"{driver_opts} {value}".strip()  # keep the quiet logging and the archive
        elif key == "spark.executor.extraJavaOptions":
            value = f"{java_opts} {value}".strip()
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    _writing_archive = archive if archive is not None and archive.writing is not None else None
    return spark


def finish_session(spark: SparkSession) -> None:
    """Done with Spark in this process. When the driver JVM is to write the class
    archive, stop it now and wait for it (the first report on a machine: it
    writes about 180 MB), so the archive is complete before it gets its final name; otherwise
    nothing (the JVM goes when this process does)."""
    global _writing_archive
    archive, _writing_archive = _writing_archive, None
    if archive is None:
        return
    spark.stop()
    gateway = SparkContext._gateway
    jvm = getattr(gateway, "proc", None)
    if jvm is not None and jvm.stdin is not None:
        jvm.stdin.close()  # the gateway server exits on end of input: System.exit(0)
    class_archive.finish_writing(archive, jvm)
