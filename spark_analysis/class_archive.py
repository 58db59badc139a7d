"""A class-data-sharing archive of the Spark driver's classes, so later reports start faster.

A cold Spark driver spends about a fifth of a small report's CPU loading classes:
searching the 280 jars for each one, parsing and verifying it. Java 17 writes the
classes a run loaded into an archive when it exits (``-XX:ArchiveClassesAtExit``)
and maps that archive at the next start (``-XX:SharedArchiveFile``). So the first
report on a machine writes the archive (recording and writing it cost that run
about 20 CPU-seconds more, mostly after its outputs are written) and later ones map
it.

The archive (about 180 MB) sits in ``$XDG_CACHE_HOME/meshd`` (``~/.cache/meshd``)
under a name made from the Java and Spark installation it was made with; another
Java or pyspark gets its own. Java crashes on a truncated archive, so the JVM writes
it under a temporary name, renamed only once that JVM has exited cleanly; an archive
Java refuses (another class path) is ignored without a word.
``MESHD_REPORT_CLASS_ARCHIVE=0`` turns all of this off.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from clock import Clock, SystemClock

ENV_SWITCH = "MESHD_REPORT_CLASS_ARCHIVE"
STALE_TEMP_S = 3600  # a temporary archive this old belongs to a JVM that died mid-write
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"  # a refused archive is not worth a warning


@dataclass(frozen=True)
class ArchivePlan:
    """What the next driver JVM does with the archive."""

    java_options: str
    final: Path
    writing: Path | None  # the temporary file this JVM writes at exit, or None: it maps ``final``


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "meshd"


def _installation_key() -> str:
    """Names the Java and Spark jars the archive is made from."""
    import pyspark

    spark_home = os.environ.get("SPARK_HOME") or os.path.dirname(pyspark.__file__)
    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java") or "java"
    h = hashlib.sha256(f"{pyspark.__version__}\0{os.path.realpath(java)}\0".encode())
    for path in [os.path.realpath(java)] + sorted(
        e.path for e in os.scandir(os.path.join(spark_home, "jars")) if e.is_file()
    ):
        st = os.stat(path)
        h.update(f"{path}\0{st.st_size}\0{int(st.st_mtime)}\0".encode())
    return h.hexdigest()[:16]


def plan(root: Path | None = None, clock: Clock | None = None) -> ArchivePlan | None:
    """Map the archive when there is one, else have this JVM write it; None when off
    or when the cache folder cannot be written. ``clock`` (the system's by default)
    tells a stale temporary archive by its age."""
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return None
    root = root or cache_root()
    try:
        key = _installation_key()
        root.mkdir(parents=True, exist_ok=True)
        final = root / f"spark-classes-{key}.jsa"
        if final.is_file():
            return ArchivePlan(f"-XX:SharedArchiveFile={final} {QUIET}", final, None)
        now = (clock or SystemClock()).wall()
        for old in root.glob("spark-classes-*.tmp"):
            if now - old.stat().st_mtime > STALE_TEMP_S:
                old.unlink(missing_ok=True)
        writing = root / f"spark-classes-{key}.{os.getpid()}.tmp"
        return ArchivePlan(f"-XX:ArchiveClassesAtExit={writing} {QUIET}", final, writing)
    except OSError:
        return None


def finish_writing(archive: ArchivePlan, jvm: subprocess.Popen[bytes] | None, timeout_s: float = 120.0) -> bool:
    """After the JVM that writes the archive was told to exit: wait for it and, when it
    exited cleanly, move the archive to its final name (atomic: readers never see a
    partial file). True when the archive was kept."""
    if archive.writing is None:
        return False
    ok = False
    try:
        if jvm is not None:
            ok = jvm.wait(timeout_s) == 0
        if ok and archive.writing.is_file():
            os.replace(archive.writing, archive.final)
            return True
    except (OSError, subprocess.TimeoutExpired):
        pass  # a JVM still running (removed below) or a rename refused (left to age out as stale)
    if not ok:
        archive.writing.unlink(missing_ok=True)
    return False


def discard(archive: ArchivePlan) -> None:
    """The JVM would not start with this archive: remove it (the next run writes a new one)."""
    archive.final.unlink(missing_ok=True)
