"""Client authentication: scrypt password hashes, the password file, the CONNECT check.

Password file format (what `meshd passwd` writes), one entry a line:

    # comments and blank lines are ignored
    alice:$scrypt$n=16384,r=8,p=1$<salt, base64>$<hash, base64>

The user name is everything before the first ':' (so a user name cannot contain one);
the hash is self-describing, so raising the cost later needs no format change. A bad
line is reported with its line number and skipped: one typo never locks everyone out
or crashes the node.

`Authenticator.check` answers a CONNECT with an `AuthResult` carrying the MQTT 5
reason code and the v3.1.1 return code. It costs one scrypt (about 0.1 s of CPU at the
default cost) when a password is checked, so the connection layer should run it with
`trio.to_thread.run_sync`; it is thread-safe. It never logs a password.
"""

from __future__ import annotations

import base64
import binascii
import enum
import hashlib
import hmac
import ipaddress
import logging
import os
import re
import secrets
import threading
from dataclasses import dataclass
from typing import Mapping

from mesh.limits import PerKeyRateLimiter, rate_limit_key_for_ip
from mqtt.reason_codes import ReasonCode, connack_v3_return_code

__all__ = [
    "hash_password",
    "verify_password",
    "parse_hash",
    "ScryptParams",
    "DEFAULT_PARAMS",
    "HashFormatError",
    "PasswordFile",
    "PasswordFileError",
    "PasswordFileIssue",
    "Authenticator",
    "AuthResult",
    "AuthOutcome",
    "validate_username",
    "anonymous_exposure_warning",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ScryptParams:
    """scrypt cost: memory is 128 * n * r bytes per hash, CPU grows with n * r * p."""

    n: int = 16384
    r: int = 8
    p: int = 1

    def __post_init__(self) -> None:
        if self.n < 2 or self.n & (self.n - 1):
            raise ValueError(f"scrypt n must be a power of two >= 2, got {self.n}")
        if not 1 <= self.r <= _MAX_R or not 1 <= self.p <= _MAX_P:
            raise ValueError(f"scrypt r must be 1..{_MAX_R} and p 1..{_MAX_P}, got r={self.r} p={self.p}")
        if self.n > _MAX_N or self.memory_bytes > _MAX_MEMORY:
            # Bounds on what a hash may ask for: a hostile or mistyped file must not
            # make every CONNECT allocate gigabytes.
            raise ValueError(f"scrypt n={self.n} r={self.r} needs more memory than the {_MAX_MEMORY >> 20} MiB allowed")

    @property
    def memory_bytes(self) -> int:
        return 128 * self.n * self.r

    def encode(self) -> str:
        return f"n={self.n},r={self.r},p={self.p}"


# RFC 7914's interactive-login cost (16 MiB, ~0.1 s here); the upper bounds keep a
# verify under about 256 MiB whatever the file says.
_MAX_N = 2**20
_MAX_R = 32
_MAX_P = 16
_MAX_MEMORY = 256 * 2**20
DEFAULT_PARAMS = ScryptParams()
_SALT_BYTES = 16
_HASH_BYTES = 32
_MIN_HASH_BYTES = 16
_PREFIX = "$scrypt$"
_PARAMS_RE = re.compile(r"^n=(\d{1,8}),r=(\d{1,3}),p=(\d{1,3})$")


class HashFormatError(ValueError):
    """An encoded password hash that cannot be parsed."""


def _b64encode(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii").rstrip("=")


def _b64decode(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise HashFormatError(f"{what} is not valid base64") from None


def _to_bytes(password: str | bytes) -> bytes:
    return password.encode("utf-8") if isinstance(password, str) else bytes(password)


def _scrypt(password: bytes, salt: bytes, params: ScryptParams, dklen: int) -> bytes:
    return hashlib.scrypt(
        password, salt=salt, n=params.n, r=params.r, p=params.p, dklen=dklen,
        maxmem=params.memory_bytes * params.p + 2**20,
    )


def hash_password(password: str | bytes, params: ScryptParams = DEFAULT_PARAMS) -> str:
    """`$scrypt$n=16384,r=8,p=1$<salt b64>$<hash b64>` with a fresh random salt."""
    salt = secrets.token_bytes(_SALT_BYTES)
    digest = _scrypt(_to_bytes(password), salt, params, _HASH_BYTES)
    return f"{_PREFIX}{params.encode()}${_b64encode(salt)}${_b64encode(digest)}"


def parse_hash(encoded: str) -> tuple[ScryptParams, bytes, bytes]:
    """Split an encoded hash into (params, salt, hash); HashFormatError if malformed."""
    if not encoded.startswith(_PREFIX):
        raise HashFormatError("hash does not start with '$scrypt$'")
    parts = encoded[len(_PREFIX):].split("$")
    if len(parts) != 3:
        raise HashFormatError("hash must be $scrypt$<params>$<salt>$<hash>")
    params_text, salt_text, hash_text = parts
    m = _PARAMS_RE.match(params_text)
    if m is None:
        raise HashFormatError(f"scrypt parameters {params_text!r} are not 'n=N,r=R,p=P'")
    try:
        params = ScryptParams(int(m[1]), int(m[2]), int(m[3]))
    except ValueError as e:
        raise HashFormatError(str(e)) from None
    salt = _b64decode(salt_text, "salt")
    digest = _b64decode(hash_text, "hash")
    if len(salt) < 8:
        raise HashFormatError("salt is shorter than 8 bytes")
    if not _MIN_HASH_BYTES <= len(digest) <= 64:
        raise HashFormatError(f"hash is {len(digest)} bytes (expected {_MIN_HASH_BYTES}..64)")
    return params, salt, digest


def verify_password(password: str | bytes, encoded: str) -> bool:
    """Does `password` match `encoded`? Constant-time compare; False if `encoded` is malformed."""
    try:
        params, salt, expected = parse_hash(encoded)
    except HashFormatError:
        return False
    try:
        actual = _scrypt(_to_bytes(password), salt, params, len(expected))
    except (ValueError, MemoryError) as e:
        # OpenSSL refused the cost (memory limits): a node problem, not the client's.
        log.error("scrypt %s failed: %s", params.encode(), e)
        return False
    return hmac.compare_digest(actual, expected)


def validate_username(user: str) -> None:
    """Raise ValueError unless `user` can be stored in a password file line."""
    if not user:
        raise ValueError("user name is empty")
    if ":" in user:
        raise ValueError("user name must not contain ':'")
    if user[0] == "#" or user != user.strip():
        raise ValueError("user name must not start with '#' or start/end with white space")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in user):
        raise ValueError("user name must not contain control characters")
    if len(user.encode("utf-8", "surrogatepass")) > 0xFFFF:
        raise ValueError("user name is longer than 65535 bytes")


# ---------------------------------------------------------------------------------
# The password file


class PasswordFileError(Exception):
    """The password file cannot be read at all (missing, unreadable, not UTF-8)."""


@dataclass(frozen=True)
class PasswordFileIssue:
    """A line that was skipped, and why."""

    path: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


def file_signature(path: str) -> tuple[int, int, int, int] | None:
    """What tells a re-read file from the one read before (mtime, size, inode, device)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino, st.st_dev)


class PasswordFile:
    """The entries of one password file, re-read when it changes.

    `PasswordFile.load(path)` raises PasswordFileError if the file cannot be read; bad
    lines are skipped, listed in `issues` and logged as warnings. A later reload that
    fails keeps the entries already loaded (and logs why): a half-written or deleted
    file must not lock everyone out or let everyone in.
    """

    def __init__(self, path: str, entries: dict[str, str], issues: list[PasswordFileIssue],
                 signature: tuple[int, int, int, int] | None) -> None:
        self.path = path
        self._entries = entries
        self.issues = issues
        self._signature = signature

    @classmethod
    def load(cls, path: str) -> "PasswordFile":
        signature = file_signature(path)
        entries, issues = cls._read(path)
        for issue in issues:
            log.warning("password file %s", issue)
        return cls(path, entries, issues, signature)

    @classmethod
    def from_text(cls, text: str, path: str = "<text>") -> "PasswordFile":
        entries, issues = cls.parse(text, path)
        return cls(path, entries, issues, None)

    @staticmethod
    def _read(path: str) -> tuple[dict[str, str], list[PasswordFileIssue]]:
        try:
            with open(path, "r", encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            raise PasswordFileError(f"password_file {path}: no such file") from None
        except UnicodeDecodeError as e:
            raise PasswordFileError(f"password_file {path}: not UTF-8 ({e.reason} at byte {e.start})") from None
        except OSError as e:
            raise PasswordFileError(f"password_file {path}: {e.strerror or e}") from None
        return PasswordFile.parse(text, path)

    @staticmethod
    def parse(text: str, path: str = "<text>") -> tuple[dict[str, str], list[PasswordFileIssue]]:
        """Parse file contents into {user: encoded hash} and the skipped lines."""
        entries: dict[str, str] = {}
        issues: list[PasswordFileIssue] = []
        for number, raw in enumerate(text.splitlines(), start=1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            user, sep, encoded = line.partition(":")
            if not sep:
                issues.append(PasswordFileIssue(path, number, "expected 'user:hash', found no ':'"))
                continue
            try:
                validate_username(user)
            except ValueError as e:
                issues.append(PasswordFileIssue(path, number, str(e)))
                continue
            try:
                parse_hash(encoded)
            except HashFormatError as e:
                issues.append(PasswordFileIssue(path, number, f"user {user!r}: {e}"))
                continue
            if user in entries:
                # The first entry stays: the passwd tool never writes duplicates, so a
                # second line is a hand edit, and ignoring it is the safe reading.
                issues.append(PasswordFileIssue(path, number, f"user {user!r} appears again; the earlier line wins"))
                continue
            entries[user] = encoded
        return entries, issues

    def users(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, user: object) -> bool:
        return user in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def hash_for(self, user: str) -> str | None:
        return self._entries.get(user)

    def verify(self, user: str, password: str | bytes) -> bool:
        """True if `user` is in the file and `password` matches.

        An unknown user still costs one hash (against a dummy of the same cost), so
        response time does not tell which user names exist.
        """
        encoded = self._entries.get(user)
        if encoded is None:
            verify_password(password, _dummy_hash(self._dummy_params()))
            return False
        return verify_password(password, encoded)

    def _dummy_params(self) -> ScryptParams:
        # The cost of a real entry, so an unknown user takes as long as a known one.
        for encoded in self._entries.values():
            return parse_hash(encoded)[0]
        return DEFAULT_PARAMS

    def reload(self) -> bool:
        """Re-read the file now (SIGHUP). True if it was read; on failure keep the old entries."""
        signature = file_signature(self.path)
        try:
            entries, issues = self._read(self.path)
        except PasswordFileError as e:
            log.error("%s; keeping the %d entries loaded before", e, len(self._entries))
            self._signature = signature
            return False
        for issue in issues:
            log.warning("password file %s", issue)
        # One assignment each: a check running in a worker thread sees old or new.
        self._entries = entries
        self.issues = issues
        self._signature = signature
        log.info("password file %s loaded: %d users", self.path, len(entries))
        return True

    def reload_if_changed(self) -> bool:
        """Re-read if mtime, size or inode changed since the last read; True if reloaded."""
        signature = file_signature(self.path)
        if signature == self._signature:
            return False
        return self.reload()


_DUMMY: dict[ScryptParams, str] = {}


def _dummy_hash(params: ScryptParams = DEFAULT_PARAMS) -> str:
    encoded = _DUMMY.get(params)
    if encoded is None:
        encoded = _DUMMY.setdefault(params, hash_password(secrets.token_hex(16), params))
    return encoded


# ---------------------------------------------------------------------------------
# The CONNECT check


class AuthOutcome(enum.Enum):
    OK = "ok"
    BAD_CREDENTIALS = "bad_credentials"
    NOT_AUTHORIZED = "not_authorized"
    RATE_LIMITED = "rate_limited"


_REASONS = {
    AuthOutcome.OK: ReasonCode.SUCCESS,
    AuthOutcome.BAD_CREDENTIALS: ReasonCode.BAD_USER_NAME_OR_PASSWORD,  # v3: 4
    AuthOutcome.NOT_AUTHORIZED: ReasonCode.NOT_AUTHORIZED,  # v3: 5
    # Too many failures from this address: v5 "connection rate exceeded"; v3 has no
    # such code and gets 3 (server unavailable), as the reason-code table maps it.
    AuthOutcome.RATE_LIMITED: ReasonCode.CONNECTION_RATE_EXCEEDED,
}


@dataclass(frozen=True)
class AuthResult:
    """The answer to a CONNECT: what to put in the CONNACK and who the client is."""

    outcome: AuthOutcome
    username: str | None = None
    # Why, for the log line (never contains the password).
    detail: str = ""
    # For RATE_LIMITED: seconds until this address may try again.
    retry_after: float = 0.0

    @property
    def ok(self) -> bool:
        return self.outcome is AuthOutcome.OK

    @property
    def reason_code(self) -> int:
        """The MQTT 5 CONNACK reason code."""
        return int(_REASONS[self.outcome])

    @property
    def v3_return_code(self) -> int:
        """The MQTT 3.1.1 CONNACK return code (0, 4, 5 or 3)."""
        return connack_v3_return_code(self.reason_code)


# The answer to an anonymous CONNECT where anonymous access is on: made once (frozen).
ANONYMOUS = AuthResult(AuthOutcome.OK, None, "anonymous")


@dataclass
class AuthStats:
    """Counts by outcome, for `/metrics` (the lead may read these or count AuthResults)."""

    ok: int = 0
    bad_credentials: int = 0
    not_authorized: int = 0
    rate_limited: int = 0

    def add(self, outcome: AuthOutcome) -> None:
        name = outcome._value_  # not `.value`: a descriptor call (asked per CONNECT)
        setattr(self, name, getattr(self, name) + 1)


class Authenticator:
    """Decides CONNECTs: anonymous access, the password file, failures per address.

    Rules (Mosquitto's, plus a failure budget):
    - An address that has spent its failure budget (`fail_burst` failures, refilled at
      `fail_rate` per second) is refused with RATE_LIMITED before any hashing, so a
      password guesser burns neither our CPU nor many guesses.
    - No user name and no password: OK if `allow_anonymous`, else NOT_AUTHORIZED.
    - A password without a user name: BAD_CREDENTIALS.
    - A user name with no password file: OK (the name is taken on trust, for ACLs) if
      `allow_anonymous`, else NOT_AUTHORIZED.
    - A user name with a password file: the user must be in it and the password match,
      else BAD_CREDENTIALS.
    Every failure takes a token from the address's bucket.
    """

    def __init__(
        self,
        allow_anonymous: bool,
        password_file: str | None,
        *,
        fail_rate: float = 0.2,
        fail_burst: float = 10,
        max_tracked_addresses: int = 10_000,
    ) -> None:
        self.allow_anonymous = allow_anonymous
        self.passwords: PasswordFile | None = PasswordFile.load(password_file) if password_file else None
        self._failures: PerKeyRateLimiter[str] = PerKeyRateLimiter(fail_rate, fail_burst, max_tracked_addresses)
        self._lock = threading.Lock()
        self.stats = AuthStats()

    def reload(self) -> bool:
        """Re-read the password file (SIGHUP); False if there is none or it failed."""
        return self.passwords.reload() if self.passwords else False

    def reload_if_changed(self) -> bool:
        return self.passwords.reload_if_changed() if self.passwords else False

    def check(self, username: str | None, password: bytes | None, peer_ip: str, now: float) -> AuthResult:
        """Decide a CONNECT from `peer_ip` at `now` (seconds, any monotonic clock)."""
        # The key (an address parse) only when some address failed lately: a CONNECT
        # on a node without failures pays nothing for the rate limit.
        key = rate_limit_key_for_ip(peer_ip) if len(self._failures) or self._failures.burst < 1 else None
        wait = 0.0
        if key is not None:
            with self._lock:
                wait = self._failures.delay_until_available(key, now)
        if wait > 0:
            result = AuthResult(AuthOutcome.RATE_LIMITED, username, "too many failed attempts from this address", wait)
            log.debug("auth refused for user %r from %s: %s", username, peer_ip, result.detail)
            return self._count(result)
        result = self._decide(username or None, password, peer_ip)
        if not result.ok:
            with self._lock:
                self._failures.take(key or rate_limit_key_for_ip(peer_ip), now)
            log.warning("auth failed for user %r from %s: %s", username, peer_ip, result.detail)
        return self._count(result)

    def accept_certificate(self, common_name: str | None, peer_ip: str) -> AuthResult:
        """`tls_cn_as_username`: a verified client certificate's CN is the user name.

        The TLS layer already verified the certificate against `tls_ca`; a certificate
        without a CN is NOT_AUTHORIZED.
        """
        if not common_name:
            result = AuthResult(AuthOutcome.NOT_AUTHORIZED, None, "client certificate has no common name")
            log.warning("auth failed from %s: %s", peer_ip, result.detail)
            return self._count(result)
        return self._count(AuthResult(AuthOutcome.OK, common_name, "client certificate"))

    def _count(self, result: AuthResult) -> AuthResult:
        with self._lock:
            self.stats.add(result.outcome)
        return result

    def _decide(self, username: str | None, password: bytes | None, peer_ip: str) -> AuthResult:
        if username is None:
            if password is not None:
                return AuthResult(AuthOutcome.BAD_CREDENTIALS, None, "password without a user name")
            if self.allow_anonymous:
                return ANONYMOUS
            return AuthResult(AuthOutcome.NOT_AUTHORIZED, None, "anonymous access is off and no credentials were given")
        passwords = self.passwords
        if passwords is None:
            if self.allow_anonymous:
                return AuthResult(AuthOutcome.OK, username, "no password file; user name taken as given")
            return AuthResult(AuthOutcome.NOT_AUTHORIZED, username, "anonymous access is off and there is no password file")
        if password is None:
            passwords.verify(username, b"")  # same cost as a wrong password
            return AuthResult(AuthOutcome.BAD_CREDENTIALS, username, "no password given")
        if passwords.verify(username, password):
            return AuthResult(AuthOutcome.OK, username, "password")
        return AuthResult(AuthOutcome.BAD_CREDENTIALS, username, "bad user name or password")


def _is_loopback(host: str) -> bool:
    if host.lower() in ("localhost", "localhost.", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]").split("%", 1)[0]).is_loopback
    except ValueError:
        return False  # a host name or a wildcard ("", "0.0.0.0" parses; "*" does not)


def anonymous_exposure_warning(allow_anonymous: bool, listeners: Mapping[str, tuple[str, int]]) -> str | None:
    """The warning to log at start when anonymous clients can connect from the network.

    `listeners` maps each MQTT listener's name (mqtt, ws, mqtts, wss) to its bind host
    and port; the warning names the ones beyond loopback, so an operator who bound
    MQTT to loopback sees which other listener is open.  None when anonymous access is
    off or every listener is on loopback.
    """
    if not allow_anonymous:
        return None
    exposed = [f"{name} {_show(host, port)}" for name, (host, port) in listeners.items() if not _is_loopback(host)]
    if not exposed:
        return None
    return (f"anonymous access is on (allow_anonymous) and MQTT listens beyond loopback "
            f"({', '.join(exposed)}): anyone who can reach the node can publish and subscribe; "
            "set password_file and allow_anonymous = false")


def _show(host: str, port: int) -> str:
    if not host:
        return f"*:{port}"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def api_exposure_warning(http_host: str | None, has_token: bool) -> str | None:
    """The warning to log at start when the HTTP API (which changes cluster settings
    and kicks clients) listens beyond loopback without an admin token. None otherwise."""
    if http_host is None or has_token or _is_loopback(http_host):
        return None
    return (f"the HTTP API listens beyond loopback ({http_host or '*'}) without an admin token: anyone who "
            "can reach it can change cluster settings and kick clients; set one with --api-token-file FILE "
            "(env MESHD_API_TOKEN_FILE, TOML api_token_file), or listen on 127.0.0.1")
