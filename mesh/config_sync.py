"""Cluster-wide config changes: set on any node, spread by gossip, applied everywhere.

The driver around `mesh.cluster_config`: registers are kept in the store's meta
family (`config/<key>`), disseminated as `config` broadcasts, reconciled by gossip
push-pull, traced as `config_set`, and applied to the running node without a restart.

`settings_in_effect` is what `/api/v1/config` shows: every setting's value in effect
and its source, a cluster-wide change (source `cluster`, with its origin node and HLC)
winning over the node's own flag, environment, file or default.
"""

from __future__ import annotations

import json
import logging
from dataclasses import fields, replace
from typing import Any, Callable, Iterable, Mapping, Protocol

from clock import Clock
from mesh.broker import BrokerLimits
from mesh.cluster_config import ClusterConfig, Register, family_of
from mesh.config import SETTINGS, SETTINGS_BY_NAME, ConfigError, Settings
from oplog import Event, log_event

log = logging.getLogger("meshd.config")

META_PREFIX = "config/"
_LIMIT_NAMES = frozenset(f.name for f in fields(BrokerLimits))


def register_entry(register: Register) -> dict[str, object]:
    """A cluster-wide value as `/api/v1/config` shows it (a bridge's password masked)."""
    entry = {**register.as_dict(), "source": "cluster"}
    family = family_of(register.key)
    if family is not None and family[0] == "bridge" and isinstance(register.value, str) and register.value:
        try:
            table = json.loads(register.value)
        except ValueError:
            return entry
        if isinstance(table, dict) and table.get("password") is not None:
            table["password"] = "***"
            entry["value"] = json.dumps(table, sort_keys=True)
    return entry


def settings_in_effect(settings: Settings, registers: Iterable[Register]) -> list[dict[str, object]]:
    """Every setting (secrets masked) with its value in effect and where it came from,
    then the cluster-wide values that are no setting of their own (`acl`), by key."""
    by_key = {r.key: r for r in registers}
    values = settings.as_dict()
    entries: list[dict[str, object]] = []
    for s in SETTINGS:
        register = by_key.pop(s.name, None)
        if register is not None:
            entries.append(register_entry(register))
        else:
            entries.append({"key": s.name, "value": values[s.name], **settings.origin(s.name).as_dict()})
    entries.extend(register_entry(r) for _, r in sorted(by_key.items()))
    return entries


def setting_in_effect(settings: Settings, registers: Iterable[Register], key: str) -> dict[str, object] | None:
    """One entry of `settings_in_effect`; None for a key that is neither a setting nor
    set cluster-wide."""
    for register in registers:
        if register.key == key:
            return register_entry(register)
    if key not in SETTINGS_BY_NAME:
        return None
    return {"key": key, "value": settings.as_dict()[key], **settings.origin(key).as_dict()}


class ConfigGossip(Protocol):
    def broadcast(self, kind: str, key: str, payload: object) -> None: ...
    def on_broadcast(self, kind: str, handler: Callable[[str, object], None]) -> None: ...
    def register_push_pull(self, name: str, get_local: Callable[[], object],
                           merge_remote: Callable[[object], None]) -> None: ...


class MetaStore(Protocol):
    def put_meta(self, key: str, value: object) -> None: ...


class Tracer(Protocol):
    def emit(self, **fields: object) -> None: ...


class LimitsHolder(Protocol):
    """The broker, as far as cluster settings change it."""

    @property
    def limits(self) -> BrokerLimits: ...
    def set_limits(self, limits: BrokerLimits) -> None: ...


class AclHolder(Protocol):
    def set_cluster_acl(self, toml_text: str) -> None: ...


class StreamsHolder(Protocol):
    def set_specs(self, raw: object) -> None: ...


class ReplicationHolder(Protocol):
    def set_setting(self, key: str, value: object) -> None: ...


class ConfigSync:
    def __init__(self, *, node_id: str, clock: Clock, broker: LimitsHolder, gossip: ConfigGossip, store: MetaStore,
                 trace: Tracer, recovered_meta: Mapping[str, object], security: AclHolder,
                 families: Mapping[str, Callable[[str, str], None]] | None = None,
                 streams: StreamsHolder | None = None, replication: ReplicationHolder | None = None) -> None:
        self.node_id = node_id
        self.streams = streams
        self.replication = replication
        self.clock = clock
        self.security = security
        self.broker = broker
        self.store = store
        self.trace = trace
        self.gossip = gossip
        # Who applies a keyed family's registers (`bridge/<id>` -> the bridges): (item id, JSON or "").
        self.families = dict(families or {})
        self.config = ClusterConfig(node_id)
        self.malformed = 0
        for name, value in recovered_meta.items():
            if name.startswith(META_PREFIX):
                try:
                    register = Register.from_wire(value)
                except (ConfigError, TypeError, ValueError) as exc:
                    log.error("ignoring stored config %s: %s", name, exc)
                    continue
                if self.config.merge(register, self._wall_ms()):
                    self._apply(register)
        gossip.on_broadcast("config", self._on_broadcast)
        gossip.register_push_pull("config", self._local_state, self._merge_state)

    def _wall_ms(self) -> int:
        return int(self.clock.wall() * 1000)

    def set(self, key: str, raw: object) -> Register:
        """Change a cluster setting here; raises ConfigError (naming the key) if refused."""
        register = self.config.set(key, raw, self._wall_ms())
        self._take(register, hops=0)
        # Keyed by setting *and* this node: gossip replaces a broadcast of the same key
        # by send time, not by the registers' HLC, so one key for every node let a
        # losing change sent a little later stop the winning one from spreading.
        self.gossip.broadcast("config", f"{key}/{self.node_id}", register.to_wire())
        return register

    def get(self, key: str) -> Register | None:
        return self.config.get(key)

    def registers(self) -> list[Register]:
        return sorted(self.config.registers.values(), key=lambda r: r.key)

    def _on_broadcast(self, origin: str, payload: object) -> None:
        try:
            register = Register.from_wire(payload)
        except (ConfigError, TypeError, ValueError) as exc:
            self.malformed += 1
            log.warning("dropping a config change from %s: %s", origin, exc)
            return
        if self.config.merge(register, self._wall_ms()):
            self._take(register, hops=1)

    def _local_state(self) -> object:
        return [r.to_wire() for r in self.config.registers.values()]

    def _merge_state(self, state: object) -> None:
        if not isinstance(state, list):
            self.malformed += 1
            return
        for item in state:
            self._on_broadcast("push-pull", item)

    def _take(self, register: Register, *, hops: int) -> None:
        self.store.put_meta(META_PREFIX + register.key, register.to_wire())
        stamp = register.stamp
        self.trace.emit(
            ts_us=int(self.clock.wall() * 1_000_000), kind="config_set", subject=register.key, origin=register.origin,
            origin_ts_us=stamp.wall_ms * 1000, event_id=f"{register.origin}:config:{register.key}:{stamp.wall_ms}.{stamp.logical}",
            hops=hops,
        )
        self._apply(register)
        value = register.value
        shown = f"{len(value)} bytes of TOML" if register.key == "acl" and isinstance(value, str) else value
        if family_of(register.key) is not None and isinstance(value, str):
            shown = f"{len(value)} bytes of JSON" if value else "deleted"
        log_event(log, Event.CONFIG_APPLIED, key=register.key, value=shown if isinstance(shown, (str, int, float, bool)) else repr(shown),
                  origin=register.origin, hlc=str(stamp))

    def _apply(self, register: Register) -> None:
        key, value = register.key, register.value
        family = family_of(key)
        if family is not None:
            apply = self.families.get(family[0])
            if apply is not None:
                apply(family[1], str(value))
        elif key == "acl":
            assert isinstance(value, str)  # parse_value checked it
            self.security.set_cluster_acl(value)
        elif key == "streams":
            if self.streams is not None:
                self.streams.set_specs(value)
        elif key in ("session_replicas", "session_replication"):
            if self.replication is not None:
                self.replication.set_setting(key, value)
        elif key == "log_level":
            logging.getLogger().setLevel(str(value).upper())
        elif key in _LIMIT_NAMES:
            changes: dict[str, Any] = {key: value}  # a BrokerLimits field, its value parsed for it
            self.broker.set_limits(replace(self.broker.limits, **changes))
