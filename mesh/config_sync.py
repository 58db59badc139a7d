"""Cluster-wide config changes: set on any node, spread by gossip, applied everywhere.

The driver around `mesh.cluster_config`: registers are kept in the store's meta
family (`config/<key>`), disseminated as `config` broadcasts, reconciled by gossip
push-pull, traced as `config_set`, and applied to the running node without a restart.
"""

from __future__ import annotations

import logging
import time
from dataclasses import fields, replace
from typing import TYPE_CHECKING, Any

from mesh.cluster_config import ClusterConfig, Register
from mesh.config import ConfigError

if TYPE_CHECKING:
    from gossip.service import GossipService
    from gossip.trace import NullTraceWriter, TraceWriter
    from mesh.broker import Broker
    from mesh.security import Security
    from session_store.store import SessionStore

log = logging.getLogger("meshd.config")

META_PREFIX = "config/"


def _wall_ms() -> int:
    return int(time.time() * 1000)


class ConfigSync:
    def __init__(self, *, node_id: str, broker: "Broker", gossip: "GossipService", store: "SessionStore",
                 trace: "TraceWriter | NullTraceWriter", recovered_meta: dict[str, Any], security: "Security") -> None:
        self.node_id = node_id
        self.security = security
        self.broker = broker
        self.store = store
        self.trace = trace
        self.gossip = gossip
        self.config = ClusterConfig(node_id)
        self.malformed = 0
        for name, value in recovered_meta.items():
            if name.startswith(META_PREFIX):
                try:
                    register = Register.from_wire(value)
                except (ConfigError, TypeError, ValueError) as exc:
                    log.error("ignoring stored config %s: %s", name, exc)
                    continue
                if self.config.merge(register, _wall_ms()):
                    self._apply(register)
        gossip.on_broadcast("config", self._on_broadcast)
        gossip.register_push_pull("config", self._local_state, self._merge_state)

    def set(self, key: str, raw: object) -> Register:
        """Change a cluster setting here; raises ConfigError (naming the key) if refused."""
        register = self.config.set(key, raw, _wall_ms())
        self._take(register, hops=0)
        self.gossip.broadcast("config", key, register.to_wire())
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
        if self.config.merge(register, _wall_ms()):
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
            ts_us=int(time.time() * 1_000_000), kind="config_set", subject=register.key, origin=register.origin,
            origin_ts_us=stamp.wall_ms * 1000, event_id=f"{register.origin}:config:{register.key}:{stamp.wall_ms}.{stamp.logical}",
            hops=hops,
        )
        self._apply(register)
        shown = f"{len(register.value)} bytes of TOML" if register.key == "acl" else repr(register.value)
        log.info("cluster setting %s = %s (from %s, HLC %s)", register.key, shown, register.origin, stamp)

    def _apply(self, register: Register) -> None:
        key, value = register.key, register.value
        if key == "acl":
            self.security.set_cluster_acl(value)
        elif key == "log_level":
            logging.getLogger().setLevel(value.upper())
        elif key in {f.name for f in fields(self.broker.limits)}:
            self.broker.limits = replace(self.broker.limits, **{key: value})
