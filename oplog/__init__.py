"""Operator events: one log line per thing an operator asks about, key=value.

Every package logs its events through `log_event`, so each line has the same shape
and the same event names, whichever layer saw the event:

    2026-11-25T17:02:11.120Z INFO meshd.client: client.connected client_id=c1 address=127.0.0.1:50312 ...

`mesh.logs` prints the same record as one JSON object when the node runs with
`--log-format json` (the record carries the event and its fields as attributes).
The names in `Event` are a contract with whoever reads the log (alerts, log
pipelines): README "Logs" lists them; rename one only as a breaking change.

Only the fields a call names are logged: never a payload, a password or a token.
A leaf package (imports nothing of the project), so every layer can use it.
"""

from __future__ import annotations

import json
import logging
from enum import StrEnum
from typing import Mapping

__all__ = ["Event", "log_event", "format_fields", "EVENT_ATTR", "FIELDS_ATTR"]

# Attributes `log_event` sets on the LogRecord (via `extra`), read by the JSON formatter.
EVENT_ATTR = "meshd_event"
FIELDS_ATTR = "meshd_fields"


class Event(StrEnum):
    """The stable event names (README "Logs")."""

    CLIENT_CONNECTED = "client.connected"
    CLIENT_DISCONNECTED = "client.disconnected"
    CLIENT_REFUSED = "client.refused"
    CLIENT_TAKEN_OVER = "client.taken_over"
    SESSION_EXPIRED = "session.expired"
    MEMBER_JOINED = "member.joined"
    MEMBER_SUSPECT = "member.suspect"
    MEMBER_ALIVE = "member.alive"
    MEMBER_DEAD = "member.dead"
    MEMBER_LEFT = "member.left"
    MEMBER_REJOINED = "member.rejoined"
    PARTITION_OPENED = "partition.opened"
    PARTITION_HEALED = "partition.healed"
    HELD_REPLAYED = "held.replayed"
    CONFIG_APPLIED = "config.applied"
    BRIDGE_CONNECTED = "bridge.connected"
    BRIDGE_DISCONNECTED = "bridge.disconnected"


FieldValue = str | int | float | bool | None | list[str] | tuple[str, ...] | frozenset[str]


def _plain(value: FieldValue) -> str | int | float | bool | None | list[str]:
    """The JSON form of a field: collections as sorted lists of strings."""
    if isinstance(value, (list, tuple, frozenset, set)):
        return sorted(str(v) for v in value)
    return value


def _text(value: FieldValue) -> str:
    """The key=value form: collections comma-joined, quoted when the text would
    split the line (spaces, quotes, '=') or is empty."""
    plain = _plain(value)
    if plain is None:
        return "none"
    if isinstance(plain, bool):
        return "true" if plain else "false"
    if isinstance(plain, list):
        text = ",".join(plain)
    elif isinstance(plain, float):
        text = f"{plain:g}"
    else:
        text = str(plain)
    if not text or any(c in text for c in ' "=\\') or not text.isprintable():
        return json.dumps(text)
    return text


def format_fields(event: str, fields: Mapping[str, FieldValue]) -> str:
    """`event k1=v1 k2=v2` in the order given."""
    return " ".join([event, *(f"{k}={_text(v)}" for k, v in fields.items())])


def log_event(logger: logging.Logger, event: Event, level: int = logging.INFO, /, **fields: FieldValue) -> None:
    """Log one operator event: the text line is `format_fields`, the JSON line has
    the same fields as keys."""
    if not logger.isEnabledFor(level):
        return
    plain = {k: _plain(v) for k, v in fields.items()}
    logger.log(level, "%s", format_fields(event.value, fields), extra={EVENT_ATTR: event.value, FIELDS_ATTR: plain},
               stacklevel=2)
