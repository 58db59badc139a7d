"""A bridge's configuration: one `[[bridges]]` table (or the JSON an operator POSTs to
`/api/v1/bridges`), checked once and turned into a frozen `BridgeConfig`.

Every refusal is a `BridgeConfigError` naming the key (`url`, `queue_max_bytes`, ...),
so the node refuses a bad file at start with that name and the API answers 400 with it.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping
from urllib.parse import urlsplit

from mqtt import TopicFilterInvalid, TopicNameInvalid, validate_topic_filter, validate_topic_name

__all__ = ["BridgeConfig", "BridgeConfigError", "parse_bridge", "BRIDGE_ID_RE"]

BRIDGE_ID_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_DEFAULT_PORTS = {"mqtt": 1883, "mqtts": 8883, "http": 80, "https": 443}
_SCHEMES = {"mqtt": ("mqtt", "mqtts"), "http": ("http", "https")}


class BridgeConfigError(ValueError):
    """A bad bridge setting; `key` is the table's key at fault."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key
        self.message = message


@dataclass(frozen=True)
class BridgeConfig:
    id: str
    type: str  # "mqtt" | "http"
    url: str
    egress: tuple[str, ...] = ()  # local filters whose messages go out
    ingress: tuple[str, ...] = ()  # remote filters whose messages come in (mqtt)
    remote_prefix: str = ""  # egress: put before the local topic on the remote
    local_prefix: str = ""  # ingress: put before the remote topic here
    queue_max_bytes: int = 64 << 20
    queue_max_age_s: float = 24 * 3600.0
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    protocol_version: int = 4  # 4 = MQTT 3.1.1, 5 = MQTT 5.0
    clean_start: bool = False  # False: a persistent session on the remote
    session_expiry_s: int = 3600  # v5, persistent sessions
    client_id: str = ""  # default: meshd-<bridge id>-<node id>
    keepalive_s: int = 30
    inflight: int = 32  # unacknowledged QoS >= 1 publishes on the remote at once
    ingress_shared: bool = True  # one copy per cluster: $share/meshd-<id>/<filter>
    tls_ca: str | None = None  # PEM bundle the remote's certificate must chain to (default: the system's)
    tls_insecure: bool = False  # no certificate or host name check (tests, labs)
    headers: tuple[tuple[str, str], ...] = ()  # http
    timeout_s: float = 10.0  # connect, CONNACK and HTTP answer
    backoff_min_s: float = 0.5
    backoff_max_s: float = 30.0

    @property
    def scheme(self) -> str:
        return urlsplit(self.url).scheme

    @property
    def tls(self) -> bool:
        return self.scheme in ("mqtts", "https")

    @property
    def host(self) -> str:
        return urlsplit(self.url).hostname or ""

    @property
    def port(self) -> int:
        parts = urlsplit(self.url)
        return parts.port or _DEFAULT_PORTS[parts.scheme]

    @property
    def path(self) -> str:
        parts = urlsplit(self.url)
        return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")

    def as_table(self, *, redact: bool = True) -> dict[str, Any]:
        """The config as JSON (what POST takes back); the password and header values masked."""
        out = asdict(self)
        out["egress"] = list(self.egress)
        out["ingress"] = list(self.ingress)
        out["headers"] = dict(self.headers)
        if redact and self.password is not None:
            out["password"] = "***"
        if redact:  # header values often carry a token (Authorization)
            out["headers"] = {name: "***" for name in out["headers"]}
        return out


def _str(table: Mapping[str, Any], key: str, default: str | None = None, *, required: bool = False) -> str | None:
    value = table.get(key, default)
    if value is None:
        if required:
            raise BridgeConfigError(key, "is required")
        return None
    if not isinstance(value, str):
        raise BridgeConfigError(key, f"expected a string, not {value!r}")
    return value


def _int(table: Mapping[str, Any], key: str, default: int, lo: int, hi: int | None = None) -> int:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise BridgeConfigError(key, f"expected an integer, not {value!r}")
    if value < lo or (hi is not None and value > hi):
        raise BridgeConfigError(key, f"expected {lo}..{hi if hi is not None else ''}, not {value}")
    return value


def _float(table: Mapping[str, Any], key: str, default: float, *, positive: bool = True) -> float:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BridgeConfigError(key, f"expected a number of seconds, not {value!r}")
    if positive and not value > 0:
        raise BridgeConfigError(key, f"expected more than 0, not {value}")
    return float(value)


def _bool(table: Mapping[str, Any], key: str, default: bool) -> bool:
    value = table.get(key, default)
    if not isinstance(value, bool):
        raise BridgeConfigError(key, f"expected true or false, not {value!r}")
    return value


def _filters(table: Mapping[str, Any], key: str) -> tuple[str, ...]:
    value = table.get(key, [])
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BridgeConfigError(key, f"expected a list of topic filters, not {value!r}")
    for f in value:
        try:
            validate_topic_filter(f)
        except TopicFilterInvalid as exc:
            raise BridgeConfigError(key, f"{f!r} is not a topic filter: {exc}") from None
    return tuple(value)


def _prefix(table: Mapping[str, Any], key: str) -> str:
    value = _str(table, key, "") or ""
    if any(c in value for c in "+#\x00"):
        raise BridgeConfigError(key, f"a topic prefix has no wildcards: {value!r}")
    return value


def _protocol(table: Mapping[str, Any]) -> int:
    value = table.get("protocol_version", 4)
    named = {"3.1.1": 4, "311": 4, "4": 4, "5": 5, "5.0": 5, 4: 4, 5: 5}
    if isinstance(value, bool) or value not in named:
        raise BridgeConfigError("protocol_version", f'expected "3.1.1" (or 4) or "5" (or 5), not {value!r}')
    return named[value]


def _headers(table: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    value = table.get("headers", {})
    if not isinstance(value, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise BridgeConfigError("headers", f"expected a table of header = \"value\" strings, not {value!r}")
    for name, v in value.items():
        if not re.fullmatch(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+", name) or "\r" in v or "\n" in v:
            raise BridgeConfigError("headers", f"not a valid HTTP header: {name!r}")
    return tuple(sorted(value.items()))


KNOWN_KEYS = frozenset(BridgeConfig.__dataclass_fields__)


def parse_bridge(table: Mapping[str, Any]) -> BridgeConfig:
    """A `BridgeConfig` from a `[[bridges]]` table; BridgeConfigError naming the key."""
    if not isinstance(table, Mapping):
        raise BridgeConfigError("bridges", f"expected a table, not {table!r}")
    for key in table:
        if key not in KNOWN_KEYS:
            raise BridgeConfigError(str(key), "unknown bridge setting")
    bridge_id = _str(table, "id", required=True)
    assert bridge_id is not None
    if not BRIDGE_ID_RE.fullmatch(bridge_id):
        raise BridgeConfigError("id", f"1..64 of [A-Za-z0-9_.-], not {bridge_id!r}")
    kind = _str(table, "type", required=True)
    if kind not in _SCHEMES:
        raise BridgeConfigError("type", f'expected "mqtt" or "http", not {kind!r}')
    url = _str(table, "url", required=True)
    assert url is not None
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError as exc:
        raise BridgeConfigError("url", f"{url!r}: {exc}") from None
    if parts.scheme not in _SCHEMES[kind]:
        allowed = " or ".join(f"{s}://" for s in _SCHEMES[kind])
        raise BridgeConfigError("url", f"a {kind} bridge's url starts with {allowed}, not {url!r}")
    if not parts.hostname:
        raise BridgeConfigError("url", f"no host in {url!r}")
    egress = _filters(table, "egress")
    ingress = _filters(table, "ingress")
    if kind == "http" and ingress:
        raise BridgeConfigError("ingress", "an http bridge only sends (egress)")
    config = BridgeConfig(
        id=bridge_id, type=kind, url=url, egress=egress, ingress=ingress,
        remote_prefix=_prefix(table, "remote_prefix"), local_prefix=_prefix(table, "local_prefix"),
        queue_max_bytes=_int(table, "queue_max_bytes", 64 << 20, 1024),
        queue_max_age_s=_float(table, "queue_max_age_s", 24 * 3600.0),
        username=_str(table, "username"), password=_str(table, "password"),
        protocol_version=_protocol(table),
        clean_start=_bool(table, "clean_start", False),
        session_expiry_s=_int(table, "session_expiry_s", 3600, 0, 0xFFFFFFFF),
        client_id=_str(table, "client_id", "") or "",
        keepalive_s=_int(table, "keepalive_s", 30, 0, 65535),
        inflight=_int(table, "inflight", 32, 1, 65535),
        ingress_shared=_bool(table, "ingress_shared", True),
        tls_ca=_str(table, "tls_ca"), tls_insecure=_bool(table, "tls_insecure", False),
        headers=_headers(table), timeout_s=_float(table, "timeout_s", 10.0),
        backoff_min_s=_float(table, "backoff_min_s", 0.5), backoff_max_s=_float(table, "backoff_max_s", 30.0),
    )
    if config.backoff_max_s < config.backoff_min_s:
        raise BridgeConfigError("backoff_max_s", "must be at least backoff_min_s")
    for key in ("remote_prefix", "local_prefix"):
        prefix = getattr(config, key)
        try:
            if prefix:
                validate_topic_name(prefix + "x")
        except TopicNameInvalid as exc:
            raise BridgeConfigError(key, str(exc)) from None
    return config
