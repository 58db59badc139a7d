"""CBOR records for everything a session store holds, each with a format version.

Pure code. Values are CBOR maps with short keys and `"v": FORMAT_VERSION`; a record
of another version or shape raises `RecordError`, which the store reports with the key
and skips, so one bad value never stops a node.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import cbor2

from mesh.mqtt import EMPTY_PROPERTIES, Properties, Will
from session_store.model import Delivery, Message, SubscriptionOptions

FORMAT_VERSION = 1

_PROPERTY_FIELDS = tuple(f.name for f in fields(Properties))


class RecordError(ValueError):
    """A stored value that cannot be read back."""


def _properties_to_map(p: Properties) -> dict[str, Any] | None:
    if p is EMPTY_PROPERTIES:
        return None
    out: dict[str, Any] = {}
    for name in _PROPERTY_FIELDS:
        value = getattr(p, name)
        if value is None or value == ():
            continue
        out[name] = [list(pair) for pair in value] if name == "user_properties" else value
    return out or None


def _properties_from_map(m: Any) -> Properties:
    if not m:
        return EMPTY_PROPERTIES
    if not isinstance(m, dict):
        raise RecordError("properties are not a map")
    kwargs: dict[str, Any] = {}
    for name, value in m.items():
        if name not in _PROPERTY_FIELDS:
            raise RecordError(f"unknown property {name!r}")
        if name == "user_properties":
            value = tuple((str(k), str(v)) for k, v in value)
        elif name == "subscription_identifiers":
            value = tuple(value)
        kwargs[name] = value
    return Properties(**kwargs)


def _check(m: Any) -> dict[str, Any]:
    if not isinstance(m, dict):
        raise RecordError("record is not a map")
    if m.get("v") != FORMAT_VERSION:
        raise RecordError(f"unsupported record format {m.get('v')!r}")
    return m


def loads(data: bytes) -> dict[str, Any]:
    try:
        return _check(cbor2.loads(data))
    except RecordError:
        raise
    except Exception as exc:  # cbor2 raises several types on garbage
        raise RecordError(f"not CBOR: {exc}") from None


# -- messages and deliveries ----------------------------------------------------


def message_map(msg: Message) -> dict[str, Any]:
    return {
        "t": msg.topic,
        "p": msg.payload,
        "q": msg.qos,
        "r": msg.retain,
        "x": msg.expires_at,
        "f": msg.publisher,
        "i": msg.msg_id,
        "o": msg.origin,
        "pr": _properties_to_map(msg.properties),
    }


def message_from_map(m: dict[str, Any]) -> Message:
    if not isinstance(m, dict):
        raise RecordError("message record is not a map")
    try:
        return Message(
            str(m["t"]), bytes(m["p"]), int(m["q"]), bool(m["r"]), _properties_from_map(m.get("pr")),
            m.get("x"), m.get("f"), int(m.get("i") or 0), m.get("o"),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise RecordError(f"bad message record: {exc}") from None


def encode_message(msg: Message) -> bytes:
    return cbor2.dumps({"v": FORMAT_VERSION, "m": message_map(msg)})


def decode_message(data: bytes) -> Message:
    return message_from_map(loads(data)["m"])


def encode_delivery(d: Delivery, *, state: str | None = None, packet_id: int | None = None) -> bytes:
    record: dict[str, Any] = {
        "v": FORMAT_VERSION, "m": message_map(d.message), "q": d.qos, "r": d.retain,
        "s": list(d.subscription_ids), "n": d.seq,
    }
    if state is not None:
        record["st"] = state
    if packet_id is not None:
        record["pid"] = packet_id
    return cbor2.dumps(record)


def decode_inflight(data: bytes) -> tuple[Delivery, str, int]:
    """An inflight record: the delivery, its state and the packet id it was sent with."""
    d, state = decode_delivery(data)
    pid = loads(data).get("pid")
    if not isinstance(pid, int) or not 1 <= pid <= 65535:
        raise RecordError(f"bad inflight packet id {pid!r}")
    return d, state or "publish", pid


def decode_delivery(data: bytes) -> tuple[Delivery, str | None]:
    m = loads(data)
    try:
        d = Delivery(message_from_map(m["m"]), int(m["q"]), bool(m["r"]), tuple(int(i) for i in m["s"]))
        d.seq = int(m["n"])
        state = m.get("st")
    except (KeyError, TypeError, ValueError) as exc:
        raise RecordError(f"bad delivery record: {exc}") from None
    if state not in (None, "publish", "pubrel"):
        raise RecordError(f"bad inflight state {state!r}")
    return d, state


# -- sessions, subscriptions, wills ---------------------------------------------


def encode_session(expiry_interval: int, protocol_level: int, disconnected_at: float | None, next_seq: int) -> bytes:
    return cbor2.dumps({"v": FORMAT_VERSION, "e": expiry_interval, "l": protocol_level, "d": disconnected_at, "n": next_seq})


def decode_session(data: bytes) -> dict[str, Any]:
    m = loads(data)
    try:
        return {"expiry_interval": int(m["e"]), "protocol_level": int(m["l"]), "disconnected_at": m.get("d"), "next_seq": int(m.get("n") or 0)}
    except (KeyError, TypeError, ValueError) as exc:
        raise RecordError(f"bad session record: {exc}") from None


def encode_subscription(o: SubscriptionOptions) -> bytes:
    return cbor2.dumps({"v": FORMAT_VERSION, "q": o.qos, "nl": o.no_local, "rap": o.retain_as_published, "rh": o.retain_handling, "id": o.subscription_id})


def decode_subscription(data: bytes) -> SubscriptionOptions:
    m = loads(data)
    try:
        return SubscriptionOptions(int(m["q"]), bool(m["nl"]), bool(m["rap"]), int(m["rh"]), m.get("id"))
    except (KeyError, TypeError, ValueError) as exc:
        raise RecordError(f"bad subscription record: {exc}") from None


def encode_will(will: Will, due_at: float | None) -> bytes:
    return cbor2.dumps({
        "v": FORMAT_VERSION, "t": will.topic, "p": will.payload, "q": will.qos, "r": will.retain,
        "pr": _properties_to_map(will.properties), "due": due_at,
    })


def decode_will(data: bytes) -> tuple[Will, float | None]:
    m = loads(data)
    try:
        will = Will(str(m["t"]), bytes(m["p"]), int(m["q"]), bool(m["r"]), _properties_from_map(m.get("pr")))
        return will, m.get("due")
    except (KeyError, TypeError, ValueError) as exc:
        raise RecordError(f"bad will record: {exc}") from None
    except Exception as exc:  # the packet class validates too
        raise RecordError(f"bad will record: {exc}") from None


def encode_value(value: Any) -> bytes:
    return cbor2.dumps({"v": FORMAT_VERSION, "x": value})


def decode_value(data: bytes) -> Any:
    return loads(data)["x"]
