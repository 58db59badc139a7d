"""Node settings: one declarative table, four sources.

Every setting is a field of `Settings` declared with `_setting(...)`: its default,
its kind (how text and TOML values are parsed and checked) and its help text.
Adding a setting is one line there; the command-line flag, the `MESHD_<NAME>`
environment variable, the TOML key and the help text all follow from it.

Precedence, high to low: command-line flag, environment, TOML file, default.
`load_settings` remembers where each value came from (`Settings.origin(name)`), which
the API and `meshd ctl config list` show; `mesh.config_sync` adds cluster-wide changes.
Unknown TOML keys and unknown `MESHD_*` variables are errors (a typo must not
silently fall back to a default). Every error is a `ConfigError(key, message)`.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import json
import math
import os
import re
import secrets
import socket
import tomllib
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, TypeVar

__all__ = [
    "ConfigError",
    "HostPort",
    "Setting",
    "Settings",
    "SETTINGS",
    "ENV_PREFIX",
    "parse_host_port",
    "load_settings",
    "resolve_node_id",
    "add_setting_arguments",
    "flags_from_namespace",
    "describe_settings",
    "Origin",
]

ENV_PREFIX = "MESHD_"
CONFIG_ENV = "MESHD_CONFIG"
# Variables with the prefix that are not settings: the config file's path, the
# pure-Python switch read at import (mypyc-compiled cores), the report's JVM class
# archive switch, the test runner's worker count (nodes under test inherit the
# runner's environment). Anything else with the prefix must be a setting, so a typo is
# refused rather than ignored.
NON_SETTING_ENV = frozenset({CONFIG_ENV, "MESHD_PURE_PYTHON", "MESHD_REPORT_CLASS_ARCHIVE",
                             "MESHD_TEST_WORKERS"})


class ConfigError(Exception):
    """A bad setting. `str()` is one line naming the key."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(key, message)
        self.key = key
        self.message = message

    def __str__(self) -> str:
        return f"{self.key}: {self.message}"


# -- addresses ---------------------------------------------------------------


@dataclass(frozen=True, order=True)
class HostPort:
    host: str
    port: int

    def __str__(self) -> str:
        if ":" in self.host:
            return f"[{self.host}]:{self.port}"
        return f"{self.host}:{self.port}"


_HOSTNAME_LABEL = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?$")


def _valid_host(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        pass
    if not host or len(host) > 253:
        return False
    labels = host[:-1].split(".") if host.endswith(".") else host.split(".")
    return all(_HOSTNAME_LABEL.match(label) for label in labels)


def parse_host_port(key: str, text: str) -> HostPort:
    """Parse `HOST:PORT` (IPv6 as `[::1]:1883`); port 0 means any free port."""
    if not isinstance(text, str):
        raise ConfigError(key, f"bad address {text!r} (expected HOST:PORT)")
    raw = text.strip()
    if raw.startswith("["):
        end = raw.find("]")
        if end < 0 or raw[end + 1 : end + 2] != ":":
            raise ConfigError(key, f"bad address {text!r} (expected [IPV6]:PORT)")
        host, port_text = raw[1:end], raw[end + 2 :]
        try:
            if ipaddress.ip_address(host).version != 6:
                raise ValueError
        except ValueError:
            raise ConfigError(key, f"bad address {text!r} (brackets hold an IPv6 literal)") from None
    else:
        host, sep, port_text = raw.rpartition(":")
        if not sep:
            raise ConfigError(key, f"bad address {text!r} (expected HOST:PORT)")
        if ":" in host:
            raise ConfigError(key, f"bad address {text!r} (write IPv6 as [ADDR]:PORT)")
    if not host:
        raise ConfigError(key, f"bad address {text!r} (empty host; expected HOST:PORT)")
    if not _valid_host(host):
        raise ConfigError(key, f"bad address {text!r} (host is neither a name nor an IP literal)")
    if not port_text.isdigit():
        raise ConfigError(key, f"bad address {text!r} (port must be a number 0..65535)")
    port = int(port_text)
    if port > 65535:
        raise ConfigError(key, f"bad address {text!r} (port must be a number 0..65535)")
    return HostPort(host, port)


# -- kinds: how one setting's raw value becomes a typed value -----------------


class Kind:
    """Parses a raw value (text from a flag or env, or a TOML value)."""

    metavar = "VALUE"

    @property
    def expected(self) -> str:
        """What a valid raw value looks like, for error messages and --help."""
        return "a value"

    def parse(self, key: str, raw: object) -> object:
        raise NotImplementedError

    def render(self, value: object) -> str:
        return "none" if value is None else str(value)


@dataclass(frozen=True)
class Str(Kind):
    optional: bool = False
    choices: tuple[str, ...] = ()
    pattern: str | None = None
    pattern_help: str = ""
    metavar: str = "TEXT"

    @property
    def expected(self) -> str:
        if self.choices:
            return "one of " + ", ".join(self.choices)
        return self.pattern_help or "text"

    def parse(self, key: str, raw: object) -> object:
        if self.optional and (raw is None or raw == ""):
            return None
        if not isinstance(raw, str):
            raise ConfigError(key, f"bad value {raw!r} (expected {self.expected})")
        if self.choices:
            value = raw.strip().lower()
            if value not in self.choices:
                raise ConfigError(key, f"bad value {raw!r} (expected {self.expected})")
            return value
        if self.pattern is not None and not re.fullmatch(self.pattern, raw):
            raise ConfigError(key, f"bad value {raw!r} (expected {self.expected})")
        return raw


_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


@dataclass(frozen=True)
class Bool(Kind):
    metavar: str = "BOOL"
    expected: str = "true/false, 1/0, yes/no or on/off"

    def parse(self, key: str, raw: object) -> object:
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str):
            text = raw.strip().lower()
            if text in _TRUE:
                return True
            if text in _FALSE:
                return False
        raise ConfigError(key, f"bad value {raw!r} (expected {self.expected})")

    def render(self, value: object) -> str:
        return "true" if value else "false"


@dataclass(frozen=True)
class Int(Kind):
    lo: int | None = None
    hi: int | None = None
    unit: str = ""
    metavar: str = "N"

    @property
    def expected(self) -> str:
        unit = f" {self.unit}" if self.unit else ""
        if self.lo is not None and self.hi is not None:
            return f"an integer {self.lo}..{self.hi}{unit}"
        if self.lo is not None:
            return f"an integer >= {self.lo}{unit}"
        return f"an integer{unit}"

    def parse(self, key: str, raw: object) -> object:
        value: int
        if isinstance(raw, bool):
            raise ConfigError(key, f"bad value {raw!r} (expected {self.expected})")
        if isinstance(raw, int):
            value = raw
        elif isinstance(raw, str):
            try:
                value = int(raw.strip().replace("_", ""), 10)
            except ValueError:
                raise ConfigError(key, f"bad value {raw!r} (expected {self.expected})") from None
        else:
            raise ConfigError(key, f"bad value {raw!r} (expected {self.expected})")
        if (self.lo is not None and value < self.lo) or (self.hi is not None and value > self.hi):
            raise ConfigError(key, f"{value} out of range (expected {self.expected})")
        return value


@dataclass(frozen=True)
class Float(Kind):
    lo: float = 0.0
    lo_inclusive: bool = True
    unit: str = "seconds"
    metavar: str = "SECONDS"

    @property
    def expected(self) -> str:
        op = ">=" if self.lo_inclusive else ">"
        return f"a number {op} {self.lo:g} ({self.unit})"

    def parse(self, key: str, raw: object) -> object:
        if isinstance(raw, bool):
            raise ConfigError(key, f"bad value {raw!r} (expected {self.expected})")
        if isinstance(raw, (int, float)):
            value = float(raw)
        elif isinstance(raw, str):
            try:
                value = float(raw.strip())
            except ValueError:
                raise ConfigError(key, f"bad value {raw!r} (expected {self.expected})") from None
        else:
            raise ConfigError(key, f"bad value {raw!r} (expected {self.expected})")
        if not math.isfinite(value):
            raise ConfigError(key, f"bad value {raw!r} (expected {self.expected})")
        if value < self.lo or (value == self.lo and not self.lo_inclusive):
            raise ConfigError(key, f"{value:g} out of range (expected {self.expected})")
        return value


@dataclass(frozen=True)
class Addr(Kind):
    """HOST:PORT; with `can_disable`, the value `off` gives None (no listener)."""

    can_disable: bool = False
    metavar: str = "HOST:PORT"

    @property
    def expected(self) -> str:
        return "HOST:PORT or off" if self.can_disable else "HOST:PORT"

    def parse(self, key: str, raw: object) -> object:
        if self.can_disable:
            if raw is None or raw is False:
                return None
            if isinstance(raw, str) and raw.strip().lower() in ("off", "none", "disabled", ""):
                return None
        if isinstance(raw, HostPort):  # already parsed (tests, programmatic callers)
            return parse_host_port(key, str(raw))
        if not isinstance(raw, str):
            raise ConfigError(key, f"bad address {raw!r} (expected {self.expected})")
        return parse_host_port(key, raw)

    def render(self, value: object) -> str:
        return "off" if value is None else str(value)


@dataclass(frozen=True)
class AddrList(Kind):
    """Zero or more HOST:PORT: a comma-separated string, a list, or repeated flags."""

    metavar: str = "HOST:PORT"
    expected: str = "HOST:PORT[,HOST:PORT...]"

    def parse(self, key: str, raw: object) -> object:
        items: list[object]
        if isinstance(raw, str):
            items = [raw]
        elif isinstance(raw, (list, tuple)):
            items = list(raw)
        else:
            raise ConfigError(key, f"bad value {raw!r} (expected {self.expected})")
        out: list[HostPort] = []
        for item in items:
            if isinstance(item, HostPort):
                out.append(item)
                continue
            if not isinstance(item, str):
                raise ConfigError(key, f"bad address {item!r} (expected HOST:PORT)")
            for part in item.split(","):
                part = part.strip()
                if part:
                    hp = parse_host_port(key, part)
                    if hp not in out:
                        out.append(hp)
        return tuple(out)

    def render(self, value: object) -> str:
        assert isinstance(value, tuple)
        return ",".join(str(v) for v in value) if value else "none"


@dataclass(frozen=True)
class Tables(Kind):
    """An array of TOML tables (`[[bridges]]`), or the same as JSON text in a flag or
    environment variable. Each table is checked by the part that owns it (at build
    time, naming `<setting>[<index>].<key>`); here only its shape."""

    metavar: str = "JSON"
    expected: str = "an array of tables ([[name]] in TOML, a JSON list of objects elsewhere)"
    secret_keys: tuple[str, ...] = ("password",)

    def parse(self, key: str, raw: object) -> object:
        if isinstance(raw, str):
            try:
                raw = json.loads(raw) if raw.strip() else []
            except ValueError as exc:
                raise ConfigError(key, f"not JSON: {exc} (expected {self.expected})") from None
        if not isinstance(raw, (list, tuple)) or not all(isinstance(t, Mapping) for t in raw):
            raise ConfigError(key, f"bad value {raw!r} (expected {self.expected})")
        return tuple(dict(t) for t in raw)

    def plain(self, value: object, *, redact: bool = True) -> list[dict[str, object]]:
        assert isinstance(value, tuple)
        return [{k: ("***" if redact and k in self.secret_keys and v is not None else v) for k, v in t.items()}
                for t in value]

    def render(self, value: object) -> str:
        return json.dumps(self.plain(value)) if value else "none"


@dataclass(frozen=True)
class Names(Kind):
    """Zero or more names: a comma-separated string or a list (plugins to enable)."""

    metavar: str = "NAME"
    expected: str = "NAME[,NAME...]"

    def parse(self, key: str, raw: object) -> object:
        items = raw.split(",") if isinstance(raw, str) else raw
        if not isinstance(items, (list, tuple)) or not all(isinstance(i, str) for i in items):
            raise ConfigError(key, f"bad value {raw!r} (expected {self.expected})")
        return tuple(dict.fromkeys(i.strip() for i in items if i.strip()))

    def render(self, value: object) -> str:
        assert isinstance(value, tuple)
        return ",".join(value) if value else "none"


@dataclass(frozen=True)
class StreamList(Tables):
    """`[[streams]]` tables in TOML, or their JSON list as text (a flag, the
    environment, `PUT /api/v1/config/streams`); kept as its canonical JSON text, which
    is also what the cluster-wide register holds."""

    expected: str = 'a list of streams, e.g. [{"filter": "plant/#", "max_age_s": 86400}]'

    def parse(self, key: str, raw: object) -> object:
        from streams.spec import SpecError, canonical_json, parse_specs

        try:
            return canonical_json(parse_specs(raw))
        except SpecError as exc:
            raise ConfigError(key, str(exc)) from None

    def plain(self, value: object, *, redact: bool = True) -> list[dict[str, object]]:
        assert isinstance(value, str)
        tables: list[dict[str, object]] = json.loads(value)
        return tables

    def render(self, value: object) -> str:
        return str(value)


T = TypeVar("T")


# -- the table ---------------------------------------------------------------


def _setting(default: T, kind: Kind, help: str, *, secret: bool = False) -> T:
    # repr=False on secrets keeps them out of every log line that prints Settings.
    return field(
        default=default,
        repr=not secret,
        metadata={"kind": kind, "help": help, "secret": secret},
    )


_NODE_ID_RE = r"[A-Za-z0-9_.-]{1,128}"


@dataclass(frozen=True)
class Origin:
    """Where a setting's value came from: `source` is default, file, env or flag (or
    program, for settings built in code); `detail` names the file, variable or flag."""

    source: str
    detail: str = ""

    def as_dict(self) -> dict[str, str]:
        return {"source": self.source, **({"source_detail": self.detail} if self.detail else {})}


@dataclass(frozen=True)
class Settings:
    """Everything a node is configured with. Build it with `load_settings`."""

    node_id: str | None = _setting(
        None,
        Str(optional=True, pattern=_NODE_ID_RE, pattern_help="1..128 of [A-Za-z0-9_.-]", metavar="ID"),
        "node id; unset: the id stored in DATA_DIR/node_id, else derived from the hostname",
    )
    data_dir: str = _setting("./meshd-data", Str(metavar="DIR"), "directory for RocksDB, traces and the node id")
    mqtt: HostPort | None = _setting(HostPort("0.0.0.0", 1883), Addr(can_disable=True), "MQTT over TCP listener, or off")
    ws: HostPort | None = _setting(HostPort("0.0.0.0", 8083), Addr(can_disable=True), "MQTT over WebSocket listener, or off")
    ws_path: str = _setting("/mqtt", Str(pattern=r"/\S*", pattern_help="a path starting with /", metavar="PATH"), "WebSocket URL path")
    http: HostPort | None = _setting(HostPort("127.0.0.1", 18083), Addr(can_disable=True), "HTTP API and /metrics listener, or off")
    gossip: HostPort = _setting(HostPort("0.0.0.0", 7946), Addr(), "gossip (UDP) and mesh link (TCP) address")
    seed: tuple[HostPort, ...] = _setting((), AddrList(), "gossip address of a node to join (repeatable; env/TOML: comma-separated)")
    mdns: bool = _setting(True, Bool(), "find other nodes on the LAN by mDNS")
    mdns_port: int = _setting(5353, Int(1, 65535), "UDP port mDNS discovery uses (5353 is the standard one; another keeps two clusters on one host, or a test, apart)")
    cluster_name: str = _setting("meshd", Str(pattern=r"[A-Za-z0-9_.-]{1,64}", pattern_help="1..64 of [A-Za-z0-9_.-]", metavar="NAME"), "only nodes with the same cluster name join")
    cluster_key: str | None = _setting(None, Str(optional=True, metavar="SECRET"), "shared secret: authenticates and encrypts node-to-node traffic", secret=True)
    gossip_preset: str = _setting("lan", Str(choices=("lan", "wan", "local"), metavar="PRESET"), "gossip timing: lan (memberlist LAN defaults), wan (slower links), local (loopback and tests, 10x faster)")
    gossip_advertise: str | None = _setting(None, Str(optional=True, metavar="HOST"), "address other nodes reach this node's gossip port at; unset: the bound address, or for 0.0.0.0 the LAN interface")
    reconnect_dead_for: float = _setting(3 * 24 * 3600.0, Float(0.0, lo_inclusive=False), "how long the address of a lost (dead, not left) member keeps being tried, with backoff, so a netsplit heals without an operator (default 3 days)")
    netsplit_hold: float = _setting(24 * 3600.0, Float(0.0, lo_inclusive=False), "seconds the routes of an unreachable (dead, not left) member are held: QoS >= 1 messages for them are kept on disk and replayed when it is back")
    held_max_messages: int = _setting(10000, Int(0), "messages held per unreachable member; past it the oldest are dropped (counted and logged)")
    held_max_age: float = _setting(3600.0, Float(0.0, lo_inclusive=False), "seconds a held message is kept for an unreachable member")
    allow_connect_during_netsplit: bool = _setting(True, Bool(), "accept CONNECTs while this node is on the minority side of a partition (off: CONNACK 0x88 server unavailable)")
    allow_subscribe_during_netsplit: bool = _setting(True, Bool(), "accept SUBSCRIBEs while this node is on the minority side of a partition (off: SUBACK 0x83)")
    allow_publish_during_netsplit: bool = _setting(True, Bool(), "accept PUBLISHes while this node is on the minority side of a partition (off: PUBACK/PUBREC 0x83 on v5, dropped on v3)")
    trace: bool = _setting(True, Bool(), "write convergence traces to DATA_DIR/traces")
    log_level: str = _setting("info", Str(choices=("debug", "info", "warning", "error"), metavar="LEVEL"), "log level")
    log_format: str = _setting("text", Str(choices=("text", "json"), metavar="FORMAT"), "log lines as text (time level logger: message) or as one JSON object per line (README \"Logs\")")
    ready_file: str | None = _setting(None, Str(optional=True, metavar="FILE"), "once every listener is bound, write FILE (JSON: node id, pid, bound ports); removed on a clean stop")
    max_keepalive: int = _setting(65535, Int(0, 65535, "seconds", metavar="SECONDS"), "largest keep alive granted; v5 clients asking for more (or 0) get it as Server Keep Alive; MQTT 3.1/3.1.1 clients asking for more (or 0) are refused with CONNACK return code 2, as 3.1.1 cannot carry it (65535: no maximum)")
    max_packet_size: int = _setting(1048576, Int(16, 268435460, "bytes", metavar="BYTES"), "largest MQTT packet accepted")
    receive_maximum: int = _setting(1024, Int(1, 65535), "inbound QoS 1/2 window per client")
    max_inflight: int = _setting(32, Int(1, 65535), "outbound QoS 1/2 window per client (min with the client's receive maximum)")
    max_queued_messages: int = _setting(1000, Int(0), "messages queued per session before dropping")
    queue_qos0: bool = _setting(False, Bool(), "queue QoS 0 messages for offline persistent sessions")
    topic_alias_maximum: int = _setting(64, Int(0, 65535), "topic aliases accepted per v5 client")
    retain_available: bool = _setting(True, Bool(), "support retained messages")
    connect_timeout: float = _setting(10.0, Float(0.0, lo_inclusive=False), "seconds a new connection has to send CONNECT")
    sys_interval: float = _setting(10.0, Float(0.0), "seconds between $SYS publishes; 0 disables $SYS")
    shutdown_timeout: float = _setting(5.0, Float(0.0), "seconds to drain connections on shutdown")
    durability: str = _setting("sync", Str(choices=("sync", "batch", "off"), metavar="MODE"), "session store writes: sync (fsync before ack), batch (group commit), off")
    durability_batch_ms: int = _setting(50, Int(1, None, "ms", metavar="MS"), "batch/off: every change is written within this many ms (the loss window of a crash)")
    session_replicas: int = _setting(2, Int(1, 7, metavar="N"), "copies of each persistent session, its owner's included, on members chosen by rendezvous hashing of the client id (1: on its owner only; README \"Session replication\")")
    session_replication: str = _setting("sync", Str(choices=("sync", "async"), metavar="MODE"), "sync: a QoS >= 1 message for a persistent session is acknowledged once every live replica has it durable; async: by the owner alone, replicas follow")
    replication_bandwidth: int = _setting(8_000_000, Int(0, None, "bytes per second", metavar="BYTES_PER_SECOND"), "bytes per second of snapshots a node sends to start new copies of its sessions (re-replication after a member died, left or joined); 0: no bound")
    # -- security and limits (README "Security") --
    allow_anonymous: bool = _setting(True, Bool(), "accept clients without credentials (a warning is logged when listening beyond loopback)")
    password_file: str | None = _setting(None, Str(optional=True, metavar="FILE"), "user:scrypt-hash lines (meshd passwd); re-read on SIGHUP and when it changes")
    acl_file: str | None = _setting(None, Str(optional=True, metavar="FILE"), "TOML ACL rules ([[rule]] tables); re-read on SIGHUP and when it changes")
    mqtts: HostPort | None = _setting(None, Addr(can_disable=True), "MQTT over TLS listener (conventionally 0.0.0.0:8883), or off")
    wss: HostPort | None = _setting(None, Addr(can_disable=True), "MQTT over secure WebSocket listener (conventionally 0.0.0.0:8084), or off")
    tls_cert: str | None = _setting(None, Str(optional=True, metavar="FILE"), "PEM certificate chain for mqtts/wss")
    tls_key: str | None = _setting(None, Str(optional=True, metavar="FILE"), "PEM private key for mqtts/wss")
    tls_ca: str | None = _setting(None, Str(optional=True, metavar="FILE"), "PEM CA bundle that client certificates must chain to")
    tls_require_client_cert: bool = _setting(False, Bool(), "refuse TLS clients without a certificate signed by tls_ca")
    tls_cn_as_username: bool = _setting(False, Bool(), "use the client certificate's CN as the user name (for ACLs)")
    cluster_tls_cert: str | None = _setting(None, Str(optional=True, metavar="FILE"), "PEM certificate chain this node presents on node-to-node streams (mesh links, push-pull); with cluster_tls_key and cluster_tls_ca, all three or none. UDP gossip stays sealed by cluster_key only")
    cluster_tls_key: str | None = _setting(None, Str(optional=True, metavar="FILE"), "PEM private key of cluster_tls_cert")
    cluster_tls_ca: str | None = _setting(None, Str(optional=True, metavar="FILE"), "PEM CA bundle that every other node's cluster_tls_cert must chain to (both sides verify: nodes are peers)")
    api_token: str | None = _setting(None, Str(optional=True, metavar="TOKEN"), "bearer token the HTTP API requires (mutating endpoints always, reads unless api_open_reads)", secret=True)
    api_token_file: str | None = _setting(None, Str(optional=True, metavar="FILE"), "file holding the API token (instead of api_token)")
    api_open_reads: bool = _setting(False, Bool(), "serve read-only API endpoints and /metrics without the token")
    max_connections: int = _setting(100_000, Int(1), "client connections per node; more get CONNACK 0x97 (quota exceeded)")
    max_subscriptions_per_client: int = _setting(10_000, Int(1), "subscriptions per session; more get SUBACK 0x97")
    max_topic_levels: int = _setting(64, Int(1, 1024), "topic levels in a topic name or filter; deeper ones are refused")
    publish_rate: float = _setting(0.0, Float(0.0, unit="per second", metavar="PER_SECOND"), "PUBLISH packets per second per client, 0 = unlimited; over it the client is slowed (back-pressure)")
    connection_rate: float = _setting(0.0, Float(0.0, unit="per second", metavar="PER_SECOND"), "new connections per second per IP address, 0 = unlimited; more get CONNACK 0x9F")
    delayed_max_delay: int = _setting(4294967, Int(0, 2**32 - 1, "seconds", metavar="SECONDS"), "longest delay a $delayed/<seconds>/<topic> PUBLISH may ask for; longer ones are refused (v5: 0x83)")
    memory_limit: int = _setting(0, Int(0, None, "bytes", metavar="BYTES"), "refuse new connections (CONNACK 0x89) while the node's RSS is above this, 0 = off")
    # -- bridges (README "Bridges") --
    bridges: tuple[Mapping[str, object], ...] = _setting((), Tables(), "bridges to other MQTT brokers and HTTP services ([[bridges]] tables: id, type, url, egress, ingress, queue_max_bytes, ...; README \"Bridges\")")
    # -- extensions (README "Hooks and plugins", "Rules") --
    plugins: tuple[str, ...] = _setting((), Names(), "plugins to enable on this node: names of the meshd.plugins entry point group, or module paths (package.module or package.module:attr)")
    rules: tuple[Mapping[str, Any], ...] = _setting((), Tables(), "rules of this node ([[rules]] tables: id, sql, [[rules.actions]]); rules added through the API apply cluster-wide")
    streams: str = _setting("[]", StreamList(), "durable streams ([[streams]] tables: filter, max_age_s, max_bytes, max_messages, keep): messages on these topic filters are kept in RocksDB for replay (README \"Streams\")")

    # Where each value came from (`load_settings` fills it in); not a setting itself.
    origins: Mapping[str, Origin] = field(default_factory=dict, compare=False, repr=False)

    def origin(self, name: str) -> Origin:
        """Where the value of setting `name` came from."""
        known = self.origins.get(name)
        if known is not None:
            return known
        default = SETTINGS_BY_NAME[name].default
        return Origin("default") if getattr(self, name) == default else Origin("program")

    def as_dict(self, *, redact: bool = True) -> dict[str, object]:
        """Plain JSON-able values (addresses as text); secrets masked unless redact=False."""
        out: dict[str, object] = {}
        for s in SETTINGS:
            value = getattr(self, s.name)
            if s.secret and redact:
                out[s.name] = None if value is None else "***"
            elif isinstance(s.kind, Tables):
                out[s.name] = s.kind.plain(value, redact=redact)
            elif isinstance(value, HostPort):
                out[s.name] = str(value)
            elif isinstance(value, tuple):
                out[s.name] = [str(v) for v in value]
            else:
                out[s.name] = value
        return out


@dataclass(frozen=True)
class Setting:
    """One row of the table, derived from a `Settings` field."""

    name: str
    kind: Kind
    default: object
    help: str
    secret: bool = False

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def type(self) -> Kind:
        return self.kind


SETTINGS: tuple[Setting, ...] = tuple(
    Setting(f.name, f.metadata["kind"], f.default, f.metadata["help"], f.metadata["secret"])
    for f in dataclasses.fields(Settings)
    if "kind" in f.metadata
)
SETTINGS_BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}


# -- loading -----------------------------------------------------------------


def _read_toml(path: str) -> dict[str, object]:
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError("config", f"file not found: {path}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError("config", f"{path}: not valid TOML: {e}") from None
    except OSError as e:
        raise ConfigError("config", f"{path}: cannot read: {e.strerror or e}") from None
    return data


def _toml_values(path: str) -> dict[str, object]:
    out: dict[str, object] = {}
    for raw_key, value in _read_toml(path).items():
        name = raw_key.replace("-", "_")
        if name not in SETTINGS_BY_NAME:
            raise ConfigError(raw_key, f"unknown setting in {path}")
        if isinstance(value, dict) or (isinstance(value, list) and value and isinstance(value[0], dict)
                                       and not isinstance(SETTINGS_BY_NAME[name].kind, Tables)):
            raise ConfigError(raw_key, f"expected a flat key = value in {path}, not a table")
        out[name] = value
    return out


def _env_values(env: Mapping[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for var, value in env.items():
        if not var.startswith(ENV_PREFIX) or var in NON_SETTING_ENV:
            continue
        name = var[len(ENV_PREFIX) :].lower()
        if name not in SETTINGS_BY_NAME:
            raise ConfigError(var, "unknown MESHD_* environment variable")
        out[name] = value
    return out


def load_settings(flags: Mapping[str, object], env: Mapping[str, str] | None = None) -> Settings:
    """Build `Settings` from flags > env (`MESHD_*`) > TOML (`config`) > defaults.

    `flags` holds only what was given on the command line (see
    `flags_from_namespace`); its `config` entry, else `MESHD_CONFIG`, names the
    TOML file.
    """
    if env is None:
        env = os.environ
    for name in flags:
        if name != "config" and name not in SETTINGS_BY_NAME:
            raise ConfigError(name, "unknown setting")
    env_values = _env_values(env)
    config_path = flags.get("config")
    if config_path is None:
        config_path = env.get(CONFIG_ENV) or None
    toml_values = _toml_values(str(config_path)) if config_path is not None else {}

    values: dict[str, Any] = {}  # each parsed by its field's Kind, so of that field's type
    origins: dict[str, Origin] = {}
    for s in SETTINGS:
        if s.name in flags:
            values[s.name] = s.kind.parse(s.name, flags[s.name])
            origins[s.name] = Origin("flag", s.flag)
        elif s.name in env_values:
            values[s.name] = _parse_from(s, env_values[s.name], f"environment variable {s.env}")
            origins[s.name] = Origin("env", s.env)
        elif s.name in toml_values:
            values[s.name] = _parse_from(s, toml_values[s.name], f"config file {config_path}")
            origins[s.name] = Origin("file", str(config_path))
        else:
            origins[s.name] = Origin("default")
    return Settings(**values, origins=origins)


def _parse_from(s: Setting, raw: object, source: str) -> object:
    try:
        return s.kind.parse(s.name, raw)
    except ConfigError as e:
        raise ConfigError(e.key, f"{e.message}; from {source}") from None


# -- node id -----------------------------------------------------------------

NODE_ID_FILE = "node_id"


def _sanitise(name: str) -> str:
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-.")
    return cleaned[:48] or "node"


def resolve_node_id(settings: Settings) -> str:
    """The node's id: `--node-id`, else `<data_dir>/node_id`, else a new one stored there.

    A new id is the sanitised hostname plus a short random suffix, so two nodes
    on one host (two data dirs) differ; it is stored so restarts keep it.
    """
    if settings.node_id:
        return settings.node_id
    path = os.path.join(settings.data_dir, NODE_ID_FILE)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raw = None
    except OSError as e:
        raise ConfigError("data_dir", f"cannot read {path}: {e.strerror or e}") from None
    if raw is not None:
        # meshd writes this file atomically: anything else in it was put there by hand
        # or by damage, and guessing a new id would make this node someone else.
        fix = "fix or delete the file, or pass --node-id"
        try:
            stored = raw.decode("utf-8").strip()
        except UnicodeDecodeError:
            raise ConfigError("node_id", f"{path} is not UTF-8 text; {fix}") from None
        if not re.fullmatch(_NODE_ID_RE, stored):
            shown = repr(stored[:40]) + ("..." if len(stored) > 40 else "") if stored else "nothing"
            raise ConfigError("node_id", f"{path} holds {shown}, not a node id (1..128 of [A-Za-z0-9_.-]); {fix}")
        return stored
    node_id = f"{_sanitise(socket.gethostname())}-{secrets.token_hex(3)}"
    try:
        os.makedirs(settings.data_dir, exist_ok=True)
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(node_id + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)  # atomic: a crash never leaves a half-written id
    except OSError as e:
        raise ConfigError("data_dir", f"cannot store node id in {path}: {e.strerror or e}") from None
    return node_id


# -- command line ------------------------------------------------------------


def _help_text(s: Setting) -> str:
    default = "none" if s.secret and s.default is None else s.kind.render(s.default)
    # argparse %-formats help strings.
    return f"{s.help} [env {s.env}; default {default}]".replace("%", "%%")


def add_setting_arguments(parser: argparse.ArgumentParser) -> None:
    """Add `--config` and one flag per setting; absent flags stay absent (precedence)."""
    group = parser.add_argument_group(
        "settings",
        "Each setting also reads env MESHD_<NAME> and the TOML key <name> "
        "(precedence: flag > env > TOML file > default).",
    )
    group.add_argument(
        "--config",
        metavar="FILE",
        default=argparse.SUPPRESS,
        help="TOML file with flat keys named like the settings [env MESHD_CONFIG]",
    )
    for s in SETTINGS:
        if isinstance(s.kind, Bool):
            negative = "--no-" + s.flag[2:]
            group.add_argument(
                s.flag,
                dest=s.name,
                action="store_const",
                const=True,
                default=argparse.SUPPRESS,
                help=_help_text(s),
            )
            group.add_argument(
                negative,
                dest=s.name,
                action="store_const",
                const=False,
                default=argparse.SUPPRESS,
                help=f"turn {s.name} off",
            )
        elif isinstance(s.kind, AddrList):
            group.add_argument(
                s.flag,
                dest=s.name,
                action="append",
                metavar=s.kind.metavar,
                default=argparse.SUPPRESS,
                help=_help_text(s),
            )
        else:
            group.add_argument(
                s.flag,
                dest=s.name,
                metavar=s.kind.metavar,
                default=argparse.SUPPRESS,
                help=_help_text(s),
            )


def flags_from_namespace(ns: argparse.Namespace) -> dict[str, object]:
    """The settings (and `config`) actually given on the command line."""
    given = vars(ns)
    names: Iterable[str] = ["config", *SETTINGS_BY_NAME]
    return {name: given[name] for name in names if name in given}


def describe_settings(settings: Settings) -> list[str]:
    """`name = value` lines for a startup log (secrets masked)."""
    lines: list[str] = []
    for s in SETTINGS:
        value = getattr(settings, s.name)
        shown = ("***" if value is not None else "none") if s.secret else s.kind.render(value)
        lines.append(f"{s.name} = {shown}")
    return lines
