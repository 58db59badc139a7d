"""`meshd passwd FILE USER [--password PASSWORD | prompt] [--delete]` (mesh/passwd.py)."""

from __future__ import annotations

import io
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from mesh import passwd
from mesh.auth import PasswordFile, ScryptParams, hash_password

FAST = ScryptParams(n=2**10, r=8, p=1)


class Run:
    def __init__(self, rc: int, out: str, err: str) -> None:
        self.rc, self.out, self.err = rc, out, err


def run(argv: list[str], stdin: str = "", answers: list[str] | None = None) -> Run:
    out, err = io.StringIO(), io.StringIO()
    prompts = list(answers or [])

    def fake_getpass(prompt: str) -> str:
        if not prompts:
            raise AssertionError(f"unexpected prompt {prompt!r}")
        return prompts.pop(0)

    rc = passwd.main(argv, stdin=io.StringIO(stdin), stdout=out, stderr=err, getpass_fn=fake_getpass, params=FAST)
    return Run(rc, out.getvalue(), err.getvalue())


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_add_creates_file_with_mode_0600(tmp_path: Path) -> None:
    path = tmp_path / "passwd"
    r = run([str(path), "alice", "--password", "s3cret"])
    assert r.rc == 0, r.err
    assert "added user 'alice'" in r.out
    assert mode(path) == 0o600
    pw = PasswordFile.load(str(path))
    assert pw.users() == ["alice"] and pw.issues == []
    assert pw.verify("alice", "s3cret") and not pw.verify("alice", "S3cret")
    assert "s3cret" not in path.read_text()


def test_update_keeps_other_lines_and_order(tmp_path: Path) -> None:
    path = tmp_path / "passwd"
    bob = f"bob:{hash_password('bob-pw', FAST)}"
    path.write_text(f"# our users\n{bob}\nalice:{hash_password('old', FAST)}\nhand edited junk\ncarol:x\n")
    os.chmod(path, 0o644)
    r = run([str(path), "alice", "--password", "new"])
    assert r.rc == 0 and "updated user 'alice'" in r.out
    lines = path.read_text().splitlines()
    assert lines[0] == "# our users" and lines[1] == bob
    assert lines[2].startswith("alice:$scrypt$")
    assert lines[3:] == ["hand edited junk", "carol:x"]
    assert mode(path) == 0o600  # tightened on rewrite
    pw = PasswordFile.load(str(path))
    assert pw.verify("alice", "new") and not pw.verify("alice", "old")
    assert pw.verify("bob", "bob-pw")


def test_update_collapses_duplicates(tmp_path: Path) -> None:
    path = tmp_path / "passwd"
    path.write_text(f"alice:{hash_password('a', FAST)}\nalice:{hash_password('b', FAST)}\n")
    assert run([str(path), "alice", "--password", "c"]).rc == 0
    assert [line.split(":")[0] for line in path.read_text().splitlines()] == ["alice"]


def test_delete(tmp_path: Path) -> None:
    path = tmp_path / "passwd"
    run([str(path), "alice", "--password", "a"])
    run([str(path), "bob", "--password", "b"])
    r = run([str(path), "alice", "--delete"])
    assert r.rc == 0 and "deleted user 'alice'" in r.out
    assert PasswordFile.load(str(path)).users() == ["bob"]
    assert mode(path) == 0o600


def test_delete_unknown_user_or_missing_file_fails(tmp_path: Path) -> None:
    path = tmp_path / "passwd"
    r = run([str(path), "alice", "--delete"])
    assert r.rc == 1 and "no such file" in r.err
    assert not path.exists()
    run([str(path), "bob", "--password", "b"])
    before = path.read_text()
    r = run([str(path), "alice", "--delete"])
    assert r.rc == 1 and "no user 'alice'" in r.err
    assert path.read_text() == before


def test_prompt_twice(tmp_path: Path) -> None:
    path = tmp_path / "passwd"
    r = run([str(path), "alice"], answers=["pw1", "pw1"])
    assert r.rc == 0
    assert PasswordFile.load(str(path)).verify("alice", "pw1")


def test_prompt_mismatch_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "passwd"
    r = run([str(path), "alice"], answers=["pw1", "pw2"])
    assert r.rc == 1 and "do not match" in r.err
    assert not path.exists()


def test_password_from_stdin(tmp_path: Path) -> None:
    path = tmp_path / "passwd"
    r = run([str(path), "alice", "--password-stdin"], stdin="from stdin\nignored\n")
    assert r.rc == 0
    assert PasswordFile.load(str(path)).verify("alice", "from stdin")


def test_empty_password_refused(tmp_path: Path) -> None:
    path = tmp_path / "passwd"
    for r in [
        run([str(path), "alice", "--password", ""]),
        run([str(path), "alice", "--password-stdin"], stdin="\n"),
        run([str(path), "alice"], answers=["", ""]),
    ]:
        assert r.rc == 1 and "empty" in r.err
    assert not path.exists()


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["only-file"],
        ["f", "alice", "--delete", "--password", "x"],
        ["f", "alice", "--password-stdin", "--password", "x"],
        ["f", "alice", "--bogus"],
        ["f", "ali:ce", "--password", "x"],
        ["f", "#alice", "--password", "x"],
        ["f", "al\nice", "--password", "x"],
        ["f", "", "--password", "x"],
    ],
)
def test_bad_usage_exits_2(tmp_path: Path, argv: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    r = run(argv)
    assert r.rc == 2
    assert r.err.strip(), "a clear message"
    assert not (tmp_path / "f").exists()


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert passwd.main(["--help"]) == 0
    assert "--delete" in capsys.readouterr().out


def test_atomic_rewrite_leaves_no_temp_files(tmp_path: Path) -> None:
    path = tmp_path / "passwd"
    for i in range(3):
        run([str(path), f"user{i}", "--password", "x"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["passwd"]


def test_write_failure_is_reported_and_old_file_kept(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        # root ignores directory permissions; use a missing directory instead.
        r = run([str(tmp_path / "no" / "such" / "dir" / "passwd"), "alice", "--password", "x"])
        assert r.rc == 1 and "does not exist" in r.err
        return
    path = tmp_path / "passwd"
    run([str(path), "alice", "--password", "x"])
    before = path.read_text()
    os.chmod(tmp_path, 0o500)
    try:
        r = run([str(path), "bob", "--password", "y"])
    finally:
        os.chmod(tmp_path, 0o700)
    assert r.rc == 1 and "cannot" in r.err
    assert path.read_text() == before


def test_non_utf8_file_is_not_rewritten(tmp_path: Path) -> None:
    path = tmp_path / "passwd"
    path.write_bytes(b"\xff\xfe binary\n")
    r = run([str(path), "alice", "--password", "x"])
    assert r.rc == 1 and "UTF-8" in r.err
    assert path.read_bytes() == b"\xff\xfe binary\n"


def test_meshd_passwd_console_script(tmp_path: Path) -> None:
    """The lead's CLI dispatches `meshd passwd ...` here (default scrypt cost)."""
    path = tmp_path / "passwd"
    proc = subprocess.run(
        [sys.executable, "-m", "mesh.cli", "passwd", str(path), "alice", "--password", "pw"],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    pw = PasswordFile.load(str(path))
    assert pw.verify("alice", "pw")
    assert "$n=16384,r=8,p=1$" in (pw.hash_for("alice") or "")
    proc = subprocess.run([sys.executable, "-m", "mesh.cli", "passwd"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "meshd passwd" in proc.stderr
