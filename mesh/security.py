"""The node's security and limits, built from settings: who may connect (password
file, anonymous access, per-IP rates, connection quota, memory guard), what they may
do (ACL), TLS contexts for `mqtts`/`wss`, and the HTTP API token.

One object per node; connections ask it at CONNECT, SUBSCRIBE and PUBLISH. Every
refusal is counted here for `/metrics`. Files are re-read on SIGHUP (`reload`) and when
they change on disk (`watch_files`).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import ssl
from typing import Callable, Mapping

import trio

from clock import Clock
from hooks import HookPoint, Hooks, Registration, Stop
from hooks.points import AuthVerdict, ClientInfo, ConnectInfo
from mesh.acl import Acl, AclError, AclFile, ClientAcl
from mesh.auth import ANONYMOUS, AuthResult, Authenticator, PasswordFileError, anonymous_exposure_warning, api_exposure_warning
from mesh.config import ConfigError, Settings
from mesh.limits import MemoryGuard, PerKeyRateLimiter, rate_limit_key_for_ip
from mesh.tls import TlsConfigError, server_context

log = logging.getLogger("meshd.security")

BUILTIN_PRIORITY = 1000  # the built-in callbacks run first; a plugin may register above them
WATCH_INTERVAL = 2.0
# A CONNECT that finds every max_connections slot taken waits this long for one to
# free before it is refused: a client that disconnects and reconnects at once may be
# read in the other order (two sockets), and its DISCONNECT frees the slot it needs.
SLOT_GRACE = 1.0
LIMITS = ("max_connections", "connection_rate", "memory_limit", "max_subscriptions_per_client",
          "max_topic_levels", "publish_rate", "max_packet_size", "topic_alias_maximum", "receive_maximum")


_ANONYMOUS_VERDICT = AuthVerdict(True, 0, ANONYMOUS.detail, None)

# The setting that lets each operation through on a minority side.
_ALLOW_DURING_NETSPLIT = {op: f"allow_{op}_during_netsplit" for op in ("connect", "subscribe", "publish")}


class Security:
    def __init__(self, settings: Settings, *, clock: Clock, hooks: Hooks,
                 in_minority: Callable[[], bool] = lambda: False) -> None:
        self.settings = settings
        self.clock = clock
        # Is this node on the minority side of a netsplit now (allow_*_during_netsplit)?
        self.in_minority = in_minority
        try:
            self.authn = Authenticator(settings.allow_anonymous, settings.password_file)
        except (PasswordFileError, OSError) as exc:
            raise ConfigError("password_file", str(exc)) from None
        try:
            self.acl_file = AclFile(settings.acl_file)
        except (AclError, OSError) as exc:
            raise ConfigError("acl_file", str(exc)) from None
        self.tls_context: ssl.SSLContext | None = None
        if settings.mqtts is not None or settings.wss is not None:
            if not settings.tls_cert or not settings.tls_key:
                raise ConfigError("tls_cert", "mqtts/wss listeners need tls_cert and tls_key")
            try:
                self.tls_context = server_context(settings.tls_cert, settings.tls_key, settings.tls_ca, settings.tls_require_client_cert)
            except TlsConfigError as exc:
                message = str(exc)
                key = message.split(" ", 1)[0] if message.startswith("tls_") else "tls_cert"
                raise ConfigError(key, message) from None
        if settings.tls_cn_as_username and not settings.tls_require_client_cert:
            raise ConfigError("tls_cn_as_username", "needs tls_require_client_cert (and tls_ca) to verify the certificate")
        self.api_token = self._read_token(settings)
        rate = settings.connection_rate
        self.connection_rate: PerKeyRateLimiter[str] | None = PerKeyRateLimiter(rate, max(1.0, rate)) if rate else None
        self.memory = MemoryGuard(settings.memory_limit or None)
        self.limits_hit = {name: 0 for name in LIMITS}
        self.refused_during_netsplit = {"connect": 0, "subscribe": 0, "publish": 0}
        # Set cluster-wide with `meshd ctl config set acl @FILE`: replaces acl_file.
        self.cluster_acl: Acl | None = None
        self._file_generation = self.acl_file.generation
        self.acl_generation = 0  # bumped whenever the rules in force change
        self.acl_denied = {"publish": 0, "subscribe": 0}
        # Connections admitted and not yet ended: counted at admission, before the
        # handshake's awaits, and given back the moment the connection is known to end
        # (its DISCONNECT, our close, or the socket's end), so never over the limit.
        self.admitted = 0
        self._slot_freed: trio.Event | None = None  # made while a CONNECT waits for a slot
        # The password file and the ACL are the built-in first callbacks of
        # client.authenticate and client.authorize: one path for them and for plugins.
        self._hooks = hooks
        self._acl_hook: Registration | None = None
        self.password_hook = hooks.add(HookPoint.CLIENT_AUTHENTICATE, self._authenticate_hook, BUILTIN_PRIORITY,
                                       "builtin/password_file")
        if settings.acl_file is not None:
            self._add_acl_hook()

    def _authenticate_hook(self, verdict: AuthVerdict, info: ConnectInfo) -> AuthVerdict | Stop:
        """client.authenticate's built-in callback: anonymous access, the password
        file, a certificate's CN. A refusal ends the chain."""
        verdict = self.verdict(info.client.username, info.password, info.peer_ip, info.cert_cn)
        return verdict if verdict.ok else Stop(verdict)

    def verdict(self, username: str | None, password: bytes | None, peer_ip: str, cert_cn: str | None) -> AuthVerdict:
        """The built-in callback's answer, which a CONNECT whose chain holds nothing else
        asks for directly (`Client.authenticate_now`: no ConnectInfo, no chain to run)."""
        result = self.authenticate(username, password, peer_ip, cert_cn)
        if result is ANONYMOUS:
            return _ANONYMOUS_VERDICT  # the common case, made once
        if not result.ok:
            return AuthVerdict(False, result.reason_code, result.detail, result.username)
        return AuthVerdict(True, 0, result.detail, result.username)

    def _add_acl_hook(self) -> None:
        if self._acl_hook is None:
            self._acl_hook = self._hooks.add(HookPoint.CLIENT_AUTHORIZE, _acl_hook, BUILTIN_PRIORITY, "builtin/acl")

    @staticmethod
    def _read_token(settings: Settings) -> str | None:
        if settings.api_token:
            return settings.api_token
        if settings.api_token_file:
            try:
                with open(settings.api_token_file, encoding="utf-8") as f:
                    token = f.read().strip()
            except OSError as exc:
                raise ConfigError("api_token_file", f"cannot read {settings.api_token_file}: {exc.strerror or exc}") from None
            if not token:
                raise ConfigError("api_token_file", f"{settings.api_token_file} is empty")
            return token
        return None

    def startup_warnings(self, listeners: Mapping[str, tuple[str, int]]) -> list[str]:
        warnings = []
        line = anonymous_exposure_warning(self.settings.allow_anonymous, listeners)
        if line:
            warnings.append(line)
        http = self.settings.http
        line = api_exposure_warning(http.host if http is not None else None, self.api_token is not None)
        if line:
            warnings.append(line)
        if self.settings.memory_limit and not self.memory.available:
            warnings.append("memory_limit is set but this system's RSS cannot be read; the guard is off")
        return warnings

    # ---------------------------------------------------------------- connect

    def refuse_during_netsplit(self, operation: str) -> bool:
        """allow_<operation>_during_netsplit is off and this node is on the minority side
        of a partition.  The majority side keeps serving: only one side takes writes,
        so the sides cannot diverge, and a crashed node (a partition of one) does not
        stop the survivors."""
        # Asked on every PUBLISH: the setting first (on by default), and its name made once.
        if getattr(self.settings, _ALLOW_DURING_NETSPLIT[operation]) or not self.in_minority():
            return False
        self.refused_during_netsplit[operation] += 1
        return True

    def at_capacity(self) -> bool:
        """Every max_connections slot is taken (a CONNECT now would wait for one)."""
        return self.admitted >= self.settings.max_connections

    async def wait_for_slot(self, grace: float = SLOT_GRACE) -> None:
        """Return once a slot is free, or after `grace` seconds (then `admit` refuses)."""
        with trio.move_on_after(grace):
            while self.at_capacity():
                if self._slot_freed is None:
                    self._slot_freed = trio.Event()
                await self._slot_freed.wait()

    def release(self) -> None:
        """An admitted connection ended: its slot is free."""
        self.admitted -= 1
        if self._slot_freed is not None:
            self._slot_freed.set()
            self._slot_freed = None

    def admit(self, peer_ip: str, now: float) -> int | None:
        """Before authentication: a v5 reason code to refuse the connection with, or
        None; then the connection holds a slot until `release`."""
        if self.refuse_during_netsplit("connect"):
            log.info("refused a connection from %s: netsplit (allow_connect_during_netsplit is off)", peer_ip)
            return 0x88  # server unavailable
        if self.at_capacity():
            self.limits_hit["max_connections"] += 1
            log.warning("refused a connection from %s: max_connections (%d) reached", peer_ip, self.settings.max_connections)
            return 0x97  # quota exceeded
        if self.connection_rate is not None and not self.connection_rate.take(rate_limit_key_for_ip(peer_ip), now):
            self.limits_hit["connection_rate"] += 1
            log.info("refused a connection from %s: over connection_rate (%g/s)", peer_ip, self.settings.connection_rate)
            return 0x9F  # connection rate exceeded
        if self.memory.over_threshold():
            self.limits_hit["memory_limit"] += 1
            log.warning("refused a connection from %s: %s", peer_ip, self.memory.describe())
            return 0x89  # server busy
        self.admitted += 1
        return None

    def needs_hashing(self, username: str | None) -> bool:
        """Whether `authenticate` costs a KDF run (then call it in a worker thread)."""
        return bool(username) and self.authn.passwords is not None

    def authenticate(self, username: str | None, password: bytes | None, peer_ip: str, cert_cn: str | None) -> AuthResult:
        """Decide a CONNECT's credentials; may run in a worker thread (`needs_hashing`)."""
        if self.settings.tls_cn_as_username and cert_cn is not None:
            return self.authn.accept_certificate(cert_cn, peer_ip)
        return self.authn.check(username, password, peer_ip, self._now())

    def _now(self) -> float:
        # The clock is the Trio run's: a worker thread asks the Trio thread for it.
        if trio.lowlevel.in_trio_run():
            return self.clock.now()
        return trio.from_thread.run_sync(self.clock.now)

    def client_acl(self, username: str | None, client_id: str, peer_ip: str) -> ClientAcl | None:
        """The client's compiled rules, or None when no ACL is configured (allow all)."""
        if self.cluster_acl is not None:
            return self.cluster_acl.for_client(username, client_id, _plain_ip(peer_ip))
        if self.settings.acl_file is None:
            return None
        return self.acl_file.acl.for_client(username, client_id, _plain_ip(peer_ip))

    def set_cluster_acl(self, toml_text: str) -> None:
        self.cluster_acl = Acl.from_toml_text(toml_text, source="cluster acl")
        self._add_acl_hook()
        self.acl_generation += 1
        log.info("cluster-wide ACL in force: %s", self.cluster_acl.describe())

    def denied(self, action: str) -> None:
        self.acl_denied[action] += 1

    # ------------------------------------------------------------- reloading

    def reload(self) -> None:
        """SIGHUP: re-read the password file and the ACL."""
        self.authn.reload()
        self.acl_file.reload()
        self._note_file_generation()

    def _note_file_generation(self) -> None:
        if self.acl_file.generation != self._file_generation:
            self._file_generation = self.acl_file.generation
            self.acl_generation += 1

    async def watch_files(self) -> None:
        if self.settings.password_file is None and self.settings.acl_file is None:
            # Nothing to watch: no thread every WATCH_INTERVAL (under the cluster
            # simulator's MockClock a thread's wall-clock return would break replay).
            return
        while True:
            await trio.sleep(WATCH_INTERVAL)
            await trio.to_thread.run_sync(self._reload_changed)

    def _reload_changed(self) -> None:
        self.authn.reload_if_changed()
        self.acl_file.reload_if_changed()
        self._note_file_generation()

    # ------------------------------------------------------------- HTTP API

    def api_allows(self, method: str, authorization: str | None) -> bool:
        """Mutating endpoints need the bearer token; reads too unless api_open_reads.
        Without a token configured, the API is open (it listens on loopback by default)."""
        if self.api_token is None:
            return True
        if method in ("GET", "HEAD") and self.settings.api_open_reads:
            return True
        return authorization is not None and _constant_time_equal(authorization, f"Bearer {self.api_token}")

    def auth_outcomes(self) -> dict[str, int]:
        """CONNECT authentication decisions so far, by outcome (for `/metrics`)."""
        return dataclasses.asdict(self.authn.stats)


def _acl_hook(allowed: bool, client: ClientInfo, action: str, topic: str) -> Stop | None:
    """client.authorize's built-in callback: what the client's ACL denies ends the
    chain denied; what it allows, later callbacks (plugins) may still deny."""
    acl = client.acl
    if acl is None or (acl.can_publish(topic) if action == "publish" else acl.can_subscribe(topic)):
        return None
    return Stop(False)


def _plain_ip(peer: str) -> str:
    try:
        return str(ipaddress.ip_address(peer))
    except ValueError:
        return "0.0.0.0"


def _constant_time_equal(a: str, b: str) -> bool:
    import hmac

    return hmac.compare_digest(a.encode(), b.encode())
