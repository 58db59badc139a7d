"""Cluster-wide settings as last-writer-wins registers ordered by hybrid logical clocks.

Pure: no I/O. A change made on any node (`set`) is validated there with the same
parser as the node's own setting (so `meshd ctl config set max_inflight 0` is refused
with the message `meshd --max-inflight 0` would give), stamped with the node's HLC and
spread by gossip; every node merges registers by (HLC, node id) and applies the winner
without a restart.  Merging is idempotent, commutative and associative, so any order
of arrival converges to one value per key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from mesh.config import SETTINGS_BY_NAME, ConfigError
from clock.hlc import HlcTimestamp, HybridLogicalClock

# Settings an operator may change cluster-wide at run time.
CLUSTER_KEYS: tuple[str, ...] = (
    "max_queued_messages",
    "max_inflight",
    "queue_qos0",
    "retain_available",
    "max_keepalive",
    "topic_alias_maximum",
    "log_level",
    "acl",  # the ACL file's TOML text, enforced by every node instead of its acl_file
    "streams",  # the durable streams (canonical JSON of the [[streams]] tables)
    "session_replicas",  # copies of each persistent session (replication/)
    "session_replication",  # sync or async
)


# Keyed families: one register per item, `<family>/<item id>`, whose value is the item's
# JSON text, or "" once it is deleted (a tombstone, so a deletion wins like a change).
# Each family's parser checks the JSON as the node would at start, raising ConfigError.
def _check_bridge(item_id: str, text: str) -> None:
    import json

    from bridges.config import BridgeConfigError, parse_bridge

    try:
        table = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"bridge/{item_id}", f"not JSON: {exc}") from None
    try:
        config = parse_bridge(table)
    except BridgeConfigError as exc:
        raise ConfigError(f"bridge/{item_id}", str(exc)) from None
    if config.id != item_id:
        raise ConfigError(f"bridge/{item_id}", f"the table's id is {config.id!r}")


def _check_rule(item_id: str, text: str) -> None:
    """A rule added through the API: its table's shape (each node compiles it itself:
    the actions it can run are its own)."""
    import json

    from rules.engine import RuleError, RuleSpec

    try:
        spec = RuleSpec.from_table(json.loads(text))
    except (RuleError, ValueError) as exc:
        raise ConfigError(f"rule/{item_id}", str(exc)) from None
    if spec.id != item_id:
        raise ConfigError(f"rule/{item_id}", f"the table names rule {spec.id!r}")


CLUSTER_FAMILIES: dict[str, Callable[[str, str], None]] = {"bridge": _check_bridge, "rule": _check_rule}


def family_of(key: str) -> tuple[str, str] | None:
    """(family, item id) for a keyed family's register key, else None."""
    family, sep, item = key.partition("/")
    if sep and item and family in CLUSTER_FAMILIES:
        return family, item
    return None


# What a cluster setting holds: a parsed number or flag, a log level, the ACL's TOML,
# an item's JSON text (bridges, rules).
ClusterValue = int | bool | str


@dataclass(frozen=True, slots=True)
class Register:
    key: str
    value: ClusterValue
    stamp: HlcTimestamp

    @property
    def origin(self) -> str:
        return self.stamp.node

    def to_wire(self) -> list[object]:
        return [self.key, self.value, self.stamp.to_wire()]

    @classmethod
    def from_wire(cls, data: object) -> "Register":
        """From `[key, value, stamp]`; ValueError/TypeError/ConfigError if malformed."""
        if not isinstance(data, (list, tuple)) or len(data) != 3:
            raise ValueError(f"a config register is [key, value, stamp], not {data!r}")
        key, value, stamp = data
        if not isinstance(key, str) or (key not in CLUSTER_KEYS and family_of(key) is None):
            raise ValueError(f"unknown cluster setting {key!r}")
        # Values from peers go through the same validation as local ones.
        return cls(key, parse_value(key, value), HlcTimestamp.from_wire(stamp))

    def as_dict(self) -> dict[str, object]:
        return {"key": self.key, "value": self.value, "origin": self.origin,
                "hlc": {"wall_ms": self.stamp.wall_ms, "logical": self.stamp.logical}}


def parse_value(key: str, raw: object) -> ClusterValue:
    family = family_of(key)
    if family is not None:
        if not isinstance(raw, str):
            raise ConfigError(key, "expected the item's JSON text, or \"\" to delete it")
        if raw:
            CLUSTER_FAMILIES[family[0]](family[1], raw)
        return raw
    if key not in CLUSTER_KEYS:
        allowed = ", ".join(CLUSTER_KEYS)
        raise ConfigError(key, f"not a cluster setting (cluster settings: {allowed})")
    if key == "acl":
        from mesh.acl import Acl, AclError

        if not isinstance(raw, str):
            raise ConfigError("acl", "expected the ACL file's TOML text")
        try:
            Acl.from_toml_text(raw, source="cluster acl")
        except AclError as exc:
            raise ConfigError("acl", str(exc)) from None
        return raw
    value = SETTINGS_BY_NAME[key].kind.parse(key, raw)
    assert isinstance(value, (int, bool, str)), f"{key} parses to {value!r}"
    return value


class ClusterConfig:
    def __init__(self, node_id: str) -> None:
        self.clock = HybridLogicalClock(node_id)
        self.registers: dict[str, Register] = {}

    def set(self, key: str, raw: object, wall_ms: int) -> Register:
        """A local change: validate, stamp, keep. Raises ConfigError naming the key."""
        value = parse_value(key, raw)
        register = Register(key, value, self.clock.now(wall_ms))
        self.registers[key] = register
        return register

    def merge(self, register: Register, wall_ms: int) -> bool:
        """Take a register from a peer; True if it won (the value changed hands)."""
        self.clock.observe(register.stamp, wall_ms)
        current = self.registers.get(register.key)
        if current is not None and current.stamp >= register.stamp:
            return False
        self.registers[register.key] = register
        return True

    def merge_all(self, registers: Iterable[Register], wall_ms: int) -> list[Register]:
        return [r for r in registers if self.merge(r, wall_ms)]

    def get(self, key: str) -> Register | None:
        return self.registers.get(key)

    def values(self) -> dict[str, ClusterValue]:
        return {k: r.value for k, r in self.registers.items()}
