"""Records for everything a session store holds, each with a format version.

Pure code. Two formats:

- Format 1, CBOR maps with short keys and `"v": 1`: sessions, subscriptions, wills,
  retained messages, meta values, and the deliveries written before format 2 (still
  read, never written).
- Format 2, deliveries (the hot path: every message queued or sent to a persistent
  session): a fixed binary header, the strings, then the raw payload; about 4x cheaper
  to encode than the CBOR map.  The first byte is the version, 2, which no format-1
  record can start with (a CBOR map starts with 0xA0..0xBF).  Layout (big endian):

      B version=2  B flags  B state  H packet id  q msg id  d expires at
      I topic len  I publisher len  I origin len  H n sub ids  I properties len
      topic  publisher  origin  sub ids (n x I)  properties (CBOR map)  payload

  flags: bits 0-1 delivery QoS, 2 delivery retain, 3-4 message QoS, 5 message retain,
  6 has expiry.  A string length of 0xFFFFFFFF is None.  state: 0 queued, 1 inflight
  (PUBLISH sent), 2 inflight (PUBREL sent).  The delivery's sequence number is the
  record's key, not part of the value.

A record of another version or shape raises `RecordError`, which the store reports
with the key and skips, so one bad value never stops a node.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import struct

import cbor2

from mqtt import EMPTY_PROPERTIES, Properties, Will
from session_store.model import Delivery, Message, SubscriptionOptions

FORMAT_VERSION = 1  # CBOR map records
DELIVERY_VERSION = 2  # binary delivery records

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


def _properties_from_map(m: object) -> Properties:
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


# The v5 properties as a message record holds them (None when there are none); the
# routing layer's batched forward frame carries them the same way.
properties_to_map = _properties_to_map
properties_from_map = _properties_from_map


def _check(m: object) -> dict[str, Any]:
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


def message_from_map(m: object) -> Message:
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


# -- format 2: binary delivery records -----------------------------------------

QUEUED, PUBLISH_SENT, PUBREL_SENT = 0, 1, 2
STATE_CODES = {"publish": PUBLISH_SENT, "pubrel": PUBREL_SENT}
_STATE_NAMES = {PUBLISH_SENT: "publish", PUBREL_SENT: "pubrel"}
_HEAD = struct.Struct(">BBBHqdIIIHI")
_NONE = 0xFFFFFFFF
_V2 = bytes([DELIVERY_VERSION])


def _properties_blob(p: Properties) -> bytes:
    if p is EMPTY_PROPERTIES:
        return b""
    m = _properties_to_map(p)
    return cbor2.dumps(m) if m else b""


def encode_delivery_record(d: Delivery, state: int = QUEUED, packet_id: int = 0) -> bytes:
    """A format-2 delivery record: `state` is QUEUED or an inflight state code."""
    m = d.message
    topic = m.topic.encode("utf-8")
    publisher = m.publisher
    pub = b"" if publisher is None else publisher.encode("utf-8")
    origin = m.origin
    org = b"" if origin is None else origin.encode("utf-8")
    props = _properties_blob(m.properties)
    sids = d.subscription_ids
    expires_at = m.expires_at
    flags = d.qos | d.retain << 2 | m.qos << 3 | m.retain << 5
    if expires_at is not None:
        flags |= 0x40
    head = _HEAD.pack(
        DELIVERY_VERSION, flags, state, packet_id, m.msg_id, expires_at or 0.0, len(topic),
        _NONE if publisher is None else len(pub), _NONE if origin is None else len(org), len(sids), len(props),
    )
    if sids:
        return b"".join((head, topic, pub, org, struct.pack(f">{len(sids)}I", *sids), props, m.payload))
    return b"".join((head, topic, pub, org, props, m.payload))


def is_delivery_record(data: bytes) -> bool:
    """A format-2 delivery record (anything else is read as format 1)."""
    return data[:1] == _V2


def decode_delivery_record(data: bytes, seq: int) -> tuple[Delivery, str | None, int]:
    """(delivery, None if queued else its inflight state, packet id) from a format-2 record."""
    try:
        v, flags, state, pid, msg_id, expires_at, tl, pl, ol, n, prl = _HEAD.unpack_from(data)
    except struct.error as exc:
        raise RecordError(f"bad delivery record: {exc}") from None
    if v != DELIVERY_VERSION:
        raise RecordError(f"unsupported delivery record format {v!r}")
    dq, mq = flags & 3, flags >> 3 & 3
    if dq > 2 or mq > 2:
        raise RecordError("bad QoS in delivery record")
    if state == QUEUED:
        state_name = None
    elif state in _STATE_NAMES:
        state_name = _STATE_NAMES[state]
        if not 1 <= pid <= 65535:
            raise RecordError(f"bad inflight packet id {pid!r}")
    else:
        raise RecordError(f"bad delivery state {state!r}")
    o = _HEAD.size
    try:
        topic = data[o:o + tl].decode("utf-8")
        o += tl
        publisher = None
        if pl != _NONE:
            publisher = data[o:o + pl].decode("utf-8")
            o += pl
        origin = None
        if ol != _NONE:
            origin = data[o:o + ol].decode("utf-8")
            o += ol
        sids = struct.unpack_from(f">{n}I", data, o) if n else ()
        o += 4 * n
        props = EMPTY_PROPERTIES
        if prl:
            props = _properties_from_map(cbor2.loads(data[o:o + prl]))
            o += prl
    except RecordError:
        raise
    except Exception as exc:  # short record, bad UTF-8, bad CBOR, bad property value
        raise RecordError(f"bad delivery record: {exc}") from None
    if o > len(data):
        raise RecordError("delivery record is truncated")
    msg = Message(topic, data[o:], mq, bool(flags & 0x20), props, expires_at if flags & 0x40 else None,
                  publisher, msg_id, origin)
    d = Delivery(msg, dq, bool(flags & 4), sids)
    d.seq = seq
    return d, state_name, pid


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


def encode_value(value: object) -> bytes:
    return cbor2.dumps({"v": FORMAT_VERSION, "x": value})


def decode_value(data: bytes) -> Any:
    return loads(data)["x"]
