"""The driver's class archive (spark_analysis/class_archive.py): written once under a
temporary name, kept only when the JVM that wrote it exited cleanly, mapped after."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from clock import ManualClock
from spark_analysis import class_archive

pytestmark = pytest.mark.spark


def _jvm(archive: class_archive.ArchivePlan, status: int) -> subprocess.Popen[bytes]:
    """A stand-in for the JVM: writes the archive where it was told, exits with ``status``."""
    assert archive.writing is not None
    code = f"open({str(archive.writing)!r}, 'wb').write(b'classes'); raise SystemExit({status})"
    return subprocess.Popen([sys.executable, "-c", code])


def test_first_run_writes_under_a_temporary_name_then_later_runs_map_it(tmp_path):
    first = class_archive.plan(tmp_path)
    assert first is not None and first.writing is not None and not first.final.exists()
    assert f"-XX:ArchiveClassesAtExit={first.writing}" in first.java_options
    assert class_archive.finish_writing(first, _jvm(first, 0))
    assert first.final.read_bytes() == b"classes" and not first.writing.exists()
    again = class_archive.plan(tmp_path)
    assert again is not None and again.writing is None
    assert f"-XX:SharedArchiveFile={first.final}" in again.java_options


def test_an_archive_from_a_jvm_that_failed_is_not_kept(tmp_path):
    archive = class_archive.plan(tmp_path)
    assert archive is not None and archive.writing is not None
    assert not class_archive.finish_writing(archive, _jvm(archive, 1))
    assert not archive.final.exists() and not archive.writing.exists()


def test_stale_temporary_archives_are_removed_and_the_switch_turns_it_off(tmp_path, monkeypatch):
    clock = ManualClock(wall_epoch=1_800_000_000.0)
    stale = tmp_path / "spark-classes-0000.99999.tmp"
    fresh = tmp_path / "spark-classes-0000.99998.tmp"  # another report writing right now
    for path, age in ((stale, class_archive.STALE_TEMP_S + 10), (fresh, 60)):
        path.write_bytes(b"half")
        os.utime(path, (clock.wall() - age, clock.wall() - age))
    assert class_archive.plan(tmp_path, clock) is not None
    assert not stale.exists() and fresh.exists()
    monkeypatch.setenv(class_archive.ENV_SWITCH, "0")
    assert class_archive.plan(tmp_path) is None


def test_another_installation_gets_its_own_archive(tmp_path, monkeypatch):
    a = class_archive.plan(tmp_path)
    monkeypatch.setattr(class_archive, "_installation_key", lambda: "another-java")
    b = class_archive.plan(tmp_path)
    assert a is not None and b is not None and a.final != b.final
