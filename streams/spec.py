"""Which streams exist: `[[streams]]` tables in the config file, or the same list set
cluster-wide (`PUT /api/v1/config/streams`, a cluster config register).

A stream is named by its topic filter and keeps, per node, the messages published
through that node to topics the filter matches: all of them (`keep = "all"`, the
default) or only those an MQTT 5 publisher marked with the user property
`persist` = `1` (`keep = "opt-in"`). Retention (each optional, any that bites cuts):
`max_age_s`, `max_bytes` and `max_messages` per node.

Pure. Errors are `SpecError` with a one-line message; `mesh.config` turns them into a
`ConfigError` naming the key.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Iterable

from mqtt.errors import RemoteProtocolError
from mqtt.topics import filter_covers, topic_matches, validate_topic_filter

KEYS = ("filter", "max_age_s", "max_bytes", "max_messages", "keep")
KEEP_MODES = ("all", "opt-in")
PERSIST_PROPERTY = "persist"  # MQTT 5 user property: `persist` = `1` keeps the message


class SpecError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class StreamSpec:
    filter: str
    max_age_s: float | None = None
    max_bytes: int | None = None
    max_messages: int | None = None
    keep: str = "all"

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"filter": self.filter}
        for key in ("max_age_s", "max_bytes", "max_messages"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        if self.keep != "all":
            out["keep"] = self.keep
        return out

    def keeps(self, user_properties: Iterable[tuple[str, str]]) -> bool:
        """Whether a message with these user properties belongs to the stream (its
        topic already matched)."""
        if self.keep == "all":
            return True
        return any(name == PERSIST_PROPERTY and value == "1" for name, value in user_properties)


def _number(entry: dict[str, object], key: str, where: str, *, integer: bool) -> float | int | None:
    value = entry.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
        raise SpecError(f"{where}: {key} must be a positive {'integer' if integer else 'number'}, not {value!r}")
    if value <= 0:
        raise SpecError(f"{where}: {key} must be positive, not {value!r}")
    return value


def parse_spec(entry: object, where: str = "stream") -> StreamSpec:
    if not isinstance(entry, dict):
        raise SpecError(f"{where}: expected a table with filter = \"...\", not {entry!r}")
    unknown = sorted(set(entry) - set(KEYS))
    if unknown:
        raise SpecError(f"{where}: unknown key {unknown[0]!r} (keys: {', '.join(KEYS)})")
    topic_filter = entry.get("filter")
    if not isinstance(topic_filter, str) or not topic_filter:
        raise SpecError(f"{where}: filter is required (a topic filter)")
    if topic_filter.startswith(("$share/", "$replay/", "$SYS")):
        raise SpecError(f"{where}: filter {topic_filter!r} cannot be a stream")
    try:
        validate_topic_filter(topic_filter)
    except RemoteProtocolError as exc:
        raise SpecError(f"{where}: filter {topic_filter!r}: {exc}") from None
    keep = entry.get("keep", "all")
    if keep not in KEEP_MODES:
        raise SpecError(f"{where}: keep must be one of {', '.join(KEEP_MODES)}, not {keep!r}")
    age = _number(entry, "max_age_s", where, integer=False)
    return StreamSpec(
        filter=topic_filter,
        max_age_s=float(age) if age is not None else None,
        max_bytes=_as_int(_number(entry, "max_bytes", where, integer=True)),
        max_messages=_as_int(_number(entry, "max_messages", where, integer=True)),
        keep=str(keep),
    )


def _as_int(value: float | int | None) -> int | None:
    return None if value is None else int(value)


def parse_specs(raw: object) -> tuple[StreamSpec, ...]:
    """A list of tables (TOML, JSON) or its JSON text; raises SpecError."""
    if isinstance(raw, str):
        if not raw.strip():
            return ()
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise SpecError(f"not a JSON list of streams: {exc}") from None
    if not isinstance(raw, (list, tuple)):
        raise SpecError(f"expected a list of stream tables, not {type(raw).__name__}")
    specs: list[StreamSpec] = []
    seen: set[str] = set()
    for i, entry in enumerate(raw):
        spec = parse_spec(entry, f"streams[{i}]")
        if spec.filter in seen:
            raise SpecError(f"streams[{i}]: filter {spec.filter!r} is configured twice")
        seen.add(spec.filter)
        specs.append(spec)
    return tuple(specs)


def canonical_json(specs: Iterable[StreamSpec]) -> str:
    """The one text of a list of streams (what the config register holds)."""
    return json.dumps([s.as_dict() for s in specs], separators=(",", ":"), sort_keys=True)


def covers(stream_filter: str, sub_filter: str) -> bool:
    """Whether every topic `sub_filter` matches is matched by `stream_filter`, so the
    stream holds everything the subscription can ask for."""
    return filter_covers(stream_filter, sub_filter)


def stream_for(specs: Iterable[StreamSpec], sub_filter: str) -> StreamSpec | None:
    """The stream a replay of `sub_filter` reads: the one with exactly that filter,
    else the first (in configured order) whose filter covers it."""
    candidates = [s for s in specs if covers(s.filter, sub_filter)]
    for s in candidates:
        if s.filter == sub_filter:
            return s
    return candidates[0] if candidates else None


def matching(specs: Iterable[StreamSpec], topic: str) -> list[StreamSpec]:
    return [s for s in specs if topic_matches(s.filter, topic)]
