"""One pending delayed message, its key in the index and its stored value.

Key (16 bytes): the due time in wall-clock milliseconds, then the message id, both
unsigned 64-bit big-endian. Keys sort by due time, so the next due message is the
first key of a range scan, and the id is unique on the node (the broker's message
ids never repeat, across restarts too). The public id, `<due ms>-<message id>`,
names the key itself: inspecting or cancelling one needs no second index.

Value: CBOR `{"v": 1, "m": message, "at": received at}` (the message as the session
store keeps retained ones: topic, payload, QoS, retain, properties, expiry counted
from the original publish, publisher, id, origin node).
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any

import cbor2

from session_store.model import Message
from session_store.records import FORMAT_VERSION, RecordError, loads, message_from_map, message_map

_KEY = struct.Struct(">QQ")
KEY_SIZE = _KEY.size


@dataclass(slots=True)
class DelayedEntry:
    key: bytes
    received_at: float  # wall seconds, when the node accepted it
    message: Message  # to publish at `due`, as it was published
    epoch: int = 0  # the store's write epoch when it was recorded (0: read from disk)

    @property
    def due(self) -> float:
        """Wall seconds: never before `received_at + delay`."""
        due_ms: int = _KEY.unpack(self.key)[0]
        return due_ms / 1000

    @property
    def id(self) -> str:
        return key_to_id(self.key)


def make_key(due: float, msg_id: int) -> bytes:
    """Rounded up to the millisecond: a message is never due before its time."""
    return _KEY.pack(math.ceil(round(due * 1000, 6)), msg_id)


def key_to_id(key: bytes) -> str:
    due_ms, msg_id = _KEY.unpack(key)
    return f"{due_ms}-{msg_id}"


def id_to_key(ident: str) -> bytes | None:
    """The key an id names; None for text that is no id."""
    due, sep, msg = ident.partition("-")
    if not sep or not due.isdigit() or not msg.isdigit() or not due.isascii() or not msg.isascii():
        return None
    due_ms, msg_id = int(due), int(msg)
    if due_ms >= 1 << 64 or msg_id >= 1 << 64:
        return None
    return _KEY.pack(due_ms, msg_id)


def encode_entry(received_at: float, message: Message) -> bytes:
    return cbor2.dumps({"v": FORMAT_VERSION, "m": message_map(message), "at": received_at})


def decode_entry(key: bytes, value: bytes) -> DelayedEntry:
    """Raises RecordError for a key or value that cannot be read."""
    if len(key) != KEY_SIZE:
        raise RecordError(f"bad delayed key {key!r}")
    record: dict[str, Any] = loads(value)
    at = record.get("at")
    if not isinstance(at, (int, float)):
        raise RecordError("delayed record without its receipt time")
    return DelayedEntry(key, float(at), message_from_map(record.get("m")))
