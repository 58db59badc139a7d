"""Password hashes, the password file and the CONNECT decision (mesh/auth.py)."""

from __future__ import annotations

import logging
import os
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from mesh import auth
from mesh.auth import (
    AuthOutcome,
    Authenticator,
    HashFormatError,
    PasswordFile,
    PasswordFileError,
    ScryptParams,
    hash_password,
    parse_hash,
    verify_password,
)

# Cheap hashes keep the suite fast; the format and code path are the same.
FAST = ScryptParams(n=2**10, r=8, p=1)
SECRET = "correct horse battery staple"


def test_hash_format_encodes_parameters_and_salt() -> None:
    encoded = hash_password(SECRET)
    m = re.fullmatch(r"\$scrypt\$n=16384,r=8,p=1\$([A-Za-z0-9+/]+)\$([A-Za-z0-9+/]+)", encoded)
    assert m, encoded
    params, salt, digest = parse_hash(encoded)
    assert params == auth.DEFAULT_PARAMS
    assert len(salt) == 16 and len(digest) == 32
    assert verify_password(SECRET, encoded)


def test_salt_is_random_per_hash() -> None:
    a, b = hash_password(SECRET, FAST), hash_password(SECRET, FAST)
    assert a != b
    assert parse_hash(a)[1] != parse_hash(b)[1]
    assert verify_password(SECRET, a) and verify_password(SECRET, b)


def test_verify_right_and_wrong() -> None:
    encoded = hash_password(SECRET, FAST)
    assert verify_password(SECRET, encoded)
    assert verify_password(SECRET.encode(), encoded)  # MQTT passwords arrive as bytes
    assert not verify_password(SECRET + " ", encoded)
    assert not verify_password("", encoded)
    assert not verify_password(b"\xff\xfe", encoded)


def test_non_ascii_password() -> None:
    encoded = hash_password("pässwörd🔑", FAST)
    assert verify_password("pässwörd🔑".encode("utf-8"), encoded)
    assert not verify_password("passwörd🔑", encoded)


def test_hash_uses_the_parameters_in_the_string() -> None:
    encoded = hash_password(SECRET, ScryptParams(n=2**11, r=4, p=2))
    assert "$n=2048,r=4,p=2$" in encoded
    assert verify_password(SECRET, encoded)
    tampered = encoded.replace("n=2048", "n=1024")
    assert not verify_password(SECRET, tampered)


def test_verify_compares_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real = auth.hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    assert verify_password(SECRET, hash_password(SECRET, FAST))
    assert len(calls) == 1


@pytest.mark.parametrize(
    "encoded",
    [
        "",
        "plaintext",
        "$argon2id$v=19$m=65536,t=3,p=4$c2FsdA$aGFzaA",
        "$scrypt$n=1024,r=8,p=1$c2FsdHNhbHQ",  # no hash part
        "$scrypt$n=1024,r=8$c2FsdHNhbHQ$" + "A" * 43,  # no p
        "$scrypt$n=1000,r=8,p=1$c2FsdHNhbHQ$" + "A" * 43,  # n not a power of two
        "$scrypt$n=1048576,r=32,p=1$c2FsdHNhbHQ$" + "A" * 43,  # 4 GiB: refused
        "$scrypt$n=99999999,r=8,p=1$c2FsdHNhbHQ$" + "A" * 43,
        "$scrypt$n=1024,r=0,p=1$c2FsdHNhbHQ$" + "A" * 43,
        "$scrypt$n=1024,r=8,p=1$!!!$" + "A" * 43,  # salt not base64
        "$scrypt$n=1024,r=8,p=1$c2FsdA$" + "A" * 43,  # salt too short
        "$scrypt$n=1024,r=8,p=1$c2FsdHNhbHQ$AAAA",  # hash too short
        "$scrypt$n=1024,r=8,p=1$c2FsdHNhbHQ$" + "A" * 43 + "$extra",
    ],
)
def test_malformed_hashes_never_verify(encoded: str) -> None:
    with pytest.raises(HashFormatError):
        parse_hash(encoded)
    assert verify_password(SECRET, encoded) is False


def test_params_validation() -> None:
    for bad in ({"n": 1}, {"n": 3000}, {"r": 0}, {"p": 0}, {"p": 17}, {"n": 2**21}):
        with pytest.raises(ValueError):
            ScryptParams(**bad)


# --- PasswordFile -----------------------------------------------------------------


def _write(path: Path, lines: list[str]) -> None:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


@pytest.fixture
def alice_bob(tmp_path: Path) -> Path:
    path = tmp_path / "passwd"
    _write(path, [
        "# meshd users",
        "",
        f"alice:{hash_password('alice-pw', FAST)}",
        f"bob:{hash_password('bob-pw', FAST)}",
    ])
    return path


def test_password_file_load_and_verify(alice_bob: Path) -> None:
    pw = PasswordFile.load(str(alice_bob))
    assert pw.users() == ["alice", "bob"]
    assert pw.issues == []
    assert pw.verify("alice", "alice-pw")
    assert pw.verify("bob", b"bob-pw")
    assert not pw.verify("alice", "bob-pw")
    assert not pw.verify("carol", "alice-pw")
    assert "alice" in pw and "carol" not in pw and len(pw) == 2


def test_malformed_lines_are_reported_with_line_numbers_and_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "passwd"
    good = hash_password("pw", FAST)
    _write(path, [
        f"alice:{good}",  # 1
        "no colon here",  # 2
        "carol:$scrypt$garbage",  # 3
        f":{good}",  # 4 empty user
        "dave:",  # 5
        f"alice:{hash_password('other', FAST)}",  # 6 duplicate
        "   # indented comment",  # 7
        f"erin:{good}",  # 8
    ])
    caplog.set_level(logging.WARNING, logger="mesh.auth")
    pw = PasswordFile.load(str(path))
    assert pw.users() == ["alice", "erin"]
    assert [issue.line for issue in pw.issues] == [2, 3, 4, 5, 6]
    assert all(issue.path == str(path) for issue in pw.issues)
    assert "no ':'" in pw.issues[0].message
    assert "carol" in pw.issues[1].message
    assert "appears again" in pw.issues[4].message
    assert pw.verify("alice", "pw")  # the first line for a user wins
    assert not pw.verify("alice", "other")
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert f"{path}:2:" in logged and f"{path}:6:" in logged


def test_malformed_file_contents_never_crash() -> None:
    for text in ["\x00\x01:\x02", ":::::", "a:b:c:d", "\ufeffuser:x", "x" * 10000, "\n\n\r\n:"]:
        entries, issues = PasswordFile.parse(text)
        assert entries == {}
        assert issues


def test_missing_or_unreadable_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(PasswordFileError, match="no such file"):
        PasswordFile.load(str(tmp_path / "missing"))
    binary = tmp_path / "binary"
    binary.write_bytes(b"alice:\xff\xfe\n")
    with pytest.raises(PasswordFileError, match="not UTF-8"):
        PasswordFile.load(str(binary))


def test_reload_if_changed(alice_bob: Path) -> None:
    pw = PasswordFile.load(str(alice_bob))
    assert pw.reload_if_changed() is False  # nothing changed
    _write(alice_bob, [f"carol:{hash_password('carol-pw', FAST)}"])
    assert pw.reload_if_changed() is True
    assert pw.users() == ["carol"]
    assert pw.verify("carol", "carol-pw") and not pw.verify("alice", "alice-pw")
    assert pw.reload_if_changed() is False


def test_reload_notices_same_size_rewrite(alice_bob: Path) -> None:
    pw = PasswordFile.load(str(alice_bob))
    text = alice_bob.read_text()
    new_text = text.replace("bob:", "bib:")
    tmp = alice_bob.with_suffix(".new")
    tmp.write_text(new_text)
    os.replace(tmp, alice_bob)  # same size, new inode: what an atomic rewrite does
    assert pw.reload_if_changed() is True
    assert pw.users() == ["alice", "bib"]


def test_failed_reload_keeps_old_entries(alice_bob: Path, caplog: pytest.LogCaptureFixture) -> None:
    pw = PasswordFile.load(str(alice_bob))
    alice_bob.unlink()
    caplog.set_level(logging.ERROR, logger="mesh.auth")
    assert pw.reload_if_changed() is False
    assert pw.users() == ["alice", "bob"]
    assert pw.verify("alice", "alice-pw")
    assert "keeping the 2 entries" in caplog.text
    assert pw.reload_if_changed() is False  # logged once, not on every poll


def test_unknown_user_still_costs_a_hash(alice_bob: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pw = PasswordFile.load(str(alice_bob))
    seen: list[str] = []
    real = auth.verify_password

    def spy(password: str | bytes, encoded: str) -> bool:
        seen.append(encoded)
        return real(password, encoded)

    monkeypatch.setattr(auth, "verify_password", spy)
    assert not pw.verify("nobody", "x")
    assert len(seen) == 1
    # ... at the cost the file's own entries use, so timing does not tell.
    assert parse_hash(seen[0])[0] == FAST


# --- Authenticator ----------------------------------------------------------------


@pytest.fixture
def authn(alice_bob: Path) -> Authenticator:
    return Authenticator(allow_anonymous=False, password_file=str(alice_bob), fail_rate=1, fail_burst=3)


def test_good_password(authn: Authenticator) -> None:
    result = authn.check("alice", b"alice-pw", "10.0.0.1", 0.0)
    assert result.ok and result.outcome is AuthOutcome.OK
    assert result.username == "alice"
    assert result.reason_code == 0x00 and result.v3_return_code == 0


@pytest.mark.parametrize(
    ("username", "password"),
    [("alice", b"wrong"), ("alice", None), ("nobody", b"alice-pw"), (None, b"alice-pw"), ("alice", b"")],
)
def test_bad_credentials(authn: Authenticator, username: str | None, password: bytes | None) -> None:
    result = authn.check(username, password, "10.0.0.1", 0.0)
    assert result.outcome is AuthOutcome.BAD_CREDENTIALS
    assert result.reason_code == 0x86 and result.v3_return_code == 4


def test_anonymous_refused_when_off(authn: Authenticator) -> None:
    result = authn.check(None, None, "10.0.0.1", 0.0)
    assert result.outcome is AuthOutcome.NOT_AUTHORIZED
    assert result.reason_code == 0x87 and result.v3_return_code == 5


def test_anonymous_allowed_when_on(alice_bob: Path) -> None:
    authn = Authenticator(allow_anonymous=True, password_file=str(alice_bob))
    result = authn.check(None, None, "10.0.0.1", 0.0)
    assert result.ok and result.username is None
    # A user name given must still be right when there is a password file.
    assert authn.check("alice", b"wrong", "10.0.0.1", 0.0).outcome is AuthOutcome.BAD_CREDENTIALS
    assert authn.check("alice", b"alice-pw", "10.0.0.1", 0.0).ok


def test_no_password_file() -> None:
    open_node = Authenticator(allow_anonymous=True, password_file=None)
    result = open_node.check("anyone", b"whatever", "10.0.0.1", 0.0)
    assert result.ok and result.username == "anyone"  # for ACLs, as Mosquitto does
    closed = Authenticator(allow_anonymous=False, password_file=None)
    assert closed.check("anyone", b"whatever", "10.0.0.1", 0.0).outcome is AuthOutcome.NOT_AUTHORIZED
    assert closed.check(None, None, "10.0.0.1", 0.0).outcome is AuthOutcome.NOT_AUTHORIZED


def test_missing_password_file_fails_at_start(tmp_path: Path) -> None:
    with pytest.raises(PasswordFileError, match="password_file"):
        Authenticator(allow_anonymous=False, password_file=str(tmp_path / "nope"))


def test_failures_are_rate_limited_per_address(authn: Authenticator, monkeypatch: pytest.MonkeyPatch) -> None:
    for _ in range(3):
        assert authn.check("alice", b"guess", "10.0.0.1", 0.0).outcome is AuthOutcome.BAD_CREDENTIALS
    hashed: list[str] = []
    real = auth.verify_password
    monkeypatch.setattr(auth, "verify_password", lambda p, e: hashed.append(e) or real(p, e))
    limited = authn.check("alice", b"alice-pw", "10.0.0.1", 0.5)
    assert limited.outcome is AuthOutcome.RATE_LIMITED
    assert limited.reason_code == 0x9F and limited.v3_return_code == 3
    assert limited.retry_after == pytest.approx(0.5)
    assert hashed == []  # refused before any hashing
    # Another address is not affected.
    assert authn.check("alice", b"alice-pw", "10.0.0.2", 0.5).ok
    # After the bucket refills one token the address may try again.
    assert authn.check("alice", b"alice-pw", "10.0.0.1", 1.0).ok
    assert authn.stats.rate_limited == 1 and authn.stats.bad_credentials == 3 and authn.stats.ok == 2


def test_successes_do_not_spend_the_failure_budget(authn: Authenticator) -> None:
    for _ in range(10):
        assert authn.check("alice", b"alice-pw", "10.0.0.1", 0.0).ok


def test_ipv6_addresses_in_one_64_share_a_budget(authn: Authenticator) -> None:
    for i in range(3):
        authn.check("alice", b"guess", f"2001:db8::{i + 1}", 0.0)
    assert authn.check("alice", b"alice-pw", "2001:db8::ffff", 0.0).outcome is AuthOutcome.RATE_LIMITED
    assert authn.check("alice", b"alice-pw", "2001:db8:0:1::1", 0.0).ok


def test_password_is_never_logged(authn: Authenticator, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    secret = "zz-very-secret-zz"
    for now in (0.0, 0.0, 0.0, 0.0, 0.0):
        result = authn.check("alice", secret.encode(), "10.0.0.1", now)
        assert secret not in repr(result)
    authn.check("alice", b"alice-pw", "10.0.0.9", 0.0)
    assert caplog.records, "failures are logged"
    assert "alice" in caplog.text and "10.0.0.1" in caplog.text
    assert secret not in caplog.text and "alice-pw" not in caplog.text
    # One line per failure.
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and r.name == "mesh.auth"]
    assert len(warnings) == 3


def test_reload_through_the_authenticator(authn: Authenticator, alice_bob: Path) -> None:
    assert authn.reload_if_changed() is False
    _write(alice_bob, [f"alice:{hash_password('new-pw', FAST)}"])
    assert authn.reload_if_changed() is True
    assert authn.check("alice", b"new-pw", "10.0.0.1", 0.0).ok
    assert not authn.check("bob", b"bob-pw", "10.0.0.1", 0.0).ok
    assert authn.reload() is True  # SIGHUP: read again regardless
    assert Authenticator(True, None).reload() is False


def test_certificate_identity(authn: Authenticator) -> None:
    result = authn.accept_certificate("device-7", "10.0.0.1")
    assert result.ok and result.username == "device-7"
    assert authn.accept_certificate(None, "10.0.0.1").outcome is AuthOutcome.NOT_AUTHORIZED


def test_check_is_thread_safe(authn: Authenticator) -> None:
    """The connection layer runs check() in worker threads; counts must add up."""
    barrier = threading.Barrier(4)

    def attempt(i: int) -> AuthOutcome:
        if i < 4:
            barrier.wait()
        if i % 2 == 0:
            return authn.check("alice", b"alice-pw", "10.9.9.9", 0.0).outcome
        return authn.check("alice", b"bad", f"10.1.{i % 7}.1", 0.0).outcome

    with ThreadPoolExecutor(max_workers=4) as pool:
        outcomes = list(pool.map(attempt, range(40)))
    assert outcomes.count(AuthOutcome.OK) == 20
    stats = authn.stats
    assert stats.ok + stats.bad_credentials + stats.rate_limited + stats.not_authorized == 40
    assert stats.bad_credentials + stats.rate_limited == 20


@pytest.mark.parametrize(
    ("allow", "hosts", "warns"),
    [
        (True, ["127.0.0.1", "::1", "localhost", "[::1]"], False),
        (True, ["127.0.0.1", "0.0.0.0"], True),
        (True, [""], True),
        (True, ["::"], True),
        (True, ["10.0.0.5"], True),
        (True, ["broker.example.org"], True),
        (False, ["0.0.0.0"], False),
        (True, [], False),
    ],
)
def test_anonymous_exposure_warning(allow: bool, hosts: list[str], warns: bool) -> None:
    message = auth.anonymous_exposure_warning(allow, {f"l{i}": (h, 1883 + i) for i, h in enumerate(hosts)})
    assert (message is not None) is warns
    if message:
        assert "allow_anonymous" in message and "password_file" in message


def test_anonymous_exposure_warning_names_the_open_listener_not_the_loopback_one() -> None:
    message = auth.anonymous_exposure_warning(True, {"mqtt": ("127.0.0.1", 1883), "ws": ("0.0.0.0", 8083), "wss": ("", 8084), "mqtts": ("::", 8883)})
    assert message is not None
    assert "ws 0.0.0.0:8083" in message and "wss *:8084" in message and "mqtts [::]:8883" in message
    assert "mqtt 127.0.0.1" not in message
