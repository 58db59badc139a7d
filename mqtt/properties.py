"""MQTT 5 properties: the value object, which property each packet may carry, and the
property-section codec.

v3.1/v3.1.1 packets have no properties; for them every packet carries
`EMPTY_PROPERTIES`.
"""

from __future__ import annotations

import operator
from typing import Any
from dataclasses import dataclass

from ._wire import (
    MAX_VARINT,
    Reader,
    decode_utf8,
    decode_utf8_with_nul,
    encode_binary,
    encode_u16,
    encode_u32,
    encode_utf8,
    encode_varint,
)
from .errors import LocalProtocolError, MalformedPacket, ProtocolError

__all__ = [
    "Properties",
    "EMPTY_PROPERTIES",
    "PROPERTY_IDS",
    "ALLOWED_PROPERTIES",
    "encode_properties",
    "decode_properties",
]


@dataclass(frozen=True, slots=True, repr=False)
class Properties:
    """MQTT 5 properties of one packet; None (or ()) means "not present"."""

    payload_format_indicator: int | None = None
    message_expiry_interval: int | None = None
    content_type: str | None = None
    response_topic: str | None = None
    correlation_data: bytes | None = None
    subscription_identifiers: tuple[int, ...] = ()
    session_expiry_interval: int | None = None
    assigned_client_identifier: str | None = None
    server_keep_alive: int | None = None
    authentication_method: str | None = None
    authentication_data: bytes | None = None
    request_problem_information: int | None = None
    will_delay_interval: int | None = None
    request_response_information: int | None = None
    response_information: str | None = None
    server_reference: str | None = None
    reason_string: str | None = None
    receive_maximum: int | None = None
    topic_alias_maximum: int | None = None
    topic_alias: int | None = None
    maximum_qos: int | None = None
    retain_available: int | None = None
    user_properties: tuple[tuple[str, str], ...] = ()
    maximum_packet_size: int | None = None
    wildcard_subscription_available: int | None = None
    subscription_identifier_available: int | None = None
    shared_subscription_available: int | None = None

    def __repr__(self) -> str:
        # Only the properties that are present: 27 Nones drown a log line.
        present = ", ".join(
            f"{name}={getattr(self, name)!r}"
            for name in self.__dataclass_fields__
            if getattr(self, name) not in (None, ())
        )
        return f"Properties({present})"


EMPTY_PROPERTIES = Properties()

# Data types of property values (MQTT 5 section 2.2.2.2).
_BYTE, _U16, _U32, _VARINT, _UTF8, _BINARY, _PAIR = range(7)

# Packet kinds a property may appear in. "WILL" is the will-properties section of CONNECT.
CONNECT, CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP = (
    "CONNECT", "CONNACK", "PUBLISH", "PUBACK", "PUBREC", "PUBREL", "PUBCOMP")
SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, DISCONNECT, AUTH, WILL = (
    "SUBSCRIBE", "SUBACK", "UNSUBSCRIBE", "UNSUBACK", "DISCONNECT", "AUTH", "WILL")
_ALL_KINDS = (CONNECT, CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP, SUBSCRIBE,
              SUBACK, UNSUBSCRIBE, UNSUBACK, DISCONNECT, AUTH, WILL)
_ACKS_WITH_REASON_STRING = (CONNACK, PUBACK, PUBREC, PUBREL, PUBCOMP, SUBACK, UNSUBACK,
                            DISCONNECT, AUTH)

# (identifier, field, data type, packets it may appear in) — MQTT 5 table 2-4.
_SPEC: tuple[tuple[int, str, int, tuple[str, ...]], ...] = (
    (0x01, "payload_format_indicator", _BYTE, (PUBLISH, WILL)),
    (0x02, "message_expiry_interval", _U32, (PUBLISH, WILL)),
    (0x03, "content_type", _UTF8, (PUBLISH, WILL)),
    (0x08, "response_topic", _UTF8, (PUBLISH, WILL)),
    (0x09, "correlation_data", _BINARY, (PUBLISH, WILL)),
    (0x0B, "subscription_identifiers", _VARINT, (PUBLISH, SUBSCRIBE)),
    (0x11, "session_expiry_interval", _U32, (CONNECT, CONNACK, DISCONNECT)),
    (0x12, "assigned_client_identifier", _UTF8, (CONNACK,)),
    (0x13, "server_keep_alive", _U16, (CONNACK,)),
    (0x15, "authentication_method", _UTF8, (CONNECT, CONNACK, AUTH)),
    (0x16, "authentication_data", _BINARY, (CONNECT, CONNACK, AUTH)),
    (0x17, "request_problem_information", _BYTE, (CONNECT,)),
    (0x18, "will_delay_interval", _U32, (WILL,)),
    (0x19, "request_response_information", _BYTE, (CONNECT,)),
    (0x1A, "response_information", _UTF8, (CONNACK,)),
    (0x1C, "server_reference", _UTF8, (CONNACK, DISCONNECT)),
    (0x1F, "reason_string", _UTF8, _ACKS_WITH_REASON_STRING),
    (0x21, "receive_maximum", _U16, (CONNECT, CONNACK)),
    (0x22, "topic_alias_maximum", _U16, (CONNECT, CONNACK)),
    (0x23, "topic_alias", _U16, (PUBLISH,)),
    (0x24, "maximum_qos", _BYTE, (CONNACK,)),
    (0x25, "retain_available", _BYTE, (CONNACK,)),
    (0x26, "user_properties", _PAIR, _ALL_KINDS),
    (0x27, "maximum_packet_size", _U32, (CONNECT, CONNACK)),
    (0x28, "wildcard_subscription_available", _BYTE, (CONNACK,)),
    (0x29, "subscription_identifier_available", _BYTE, (CONNACK,)),
    (0x2A, "shared_subscription_available", _BYTE, (CONNACK,)),
)

PROPERTY_IDS: dict[str, int] = {name: pid for pid, name, _, _ in _SPEC}
_BY_ID: dict[int, tuple[str, int]] = {pid: (name, typ) for pid, name, typ, _ in _SPEC}

# The table the decoder enforces: packet kind -> property identifiers allowed in it.
ALLOWED_PROPERTIES: dict[str, frozenset[int]] = {
    kind: frozenset(pid for pid, _, _, kinds in _SPEC if kind in kinds) for kind in _ALL_KINDS
}

# Properties whose value must be 0 or 1, and ones where 0 is a protocol error.
_BOOLEAN = frozenset({0x01, 0x17, 0x19, 0x24, 0x25, 0x28, 0x29, 0x2A})
_NONZERO = frozenset({0x0B, 0x21, 0x23, 0x27})
_SUBSCRIPTION_IDENTIFIER = 0x0B
_USER_PROPERTY = 0x26


def decode_properties(r: Reader, kind: str) -> Properties:
    """Read a property section (length + properties) for a packet of `kind`."""
    length = r.varint()
    if length == 0:
        return EMPTY_PROPERTIES
    end = r.pos + length
    if end > r.end:
        raise MalformedPacket("property length runs past the end of the packet")
    allowed = ALLOWED_PROPERTIES[kind]
    outer_end = r.end
    r.end = end  # no property may read past the section
    # name -> value, each read by its identifier's type (_BY_ID), so Properties(**values)
    # gets what its fields say; mypy cannot follow that table, hence Any here.
    values: dict[str, Any] = {}
    user: list[bytes] = []  # raw names and values of the user properties, in order
    add_user = user.append
    sub_ids: list[int] = []
    data = r.data
    while r.pos < end:
        pid = data[r.pos]
        r.pos += 1
        if pid == _USER_PROPERTY and pid in allowed:
            # A client may send thousands, one after another: slice them in this tight
            # loop, decode all of them at once below.
            pos = r.pos
            while True:
                if pos + 2 > end:
                    raise MalformedPacket("packet ends early (user property name expected)")
                value_at = pos + 2 + ((data[pos] << 8) | data[pos + 1])
                if value_at + 2 > end:
                    raise MalformedPacket("packet ends early (user property value expected)")
                stop = value_at + 2 + ((data[value_at] << 8) | data[value_at + 1])
                if stop > end:
                    raise MalformedPacket("packet ends early (data shorter than its length says)")
                add_user(data[pos + 2 : value_at])
                add_user(data[value_at + 2 : stop])
                if stop < end and data[stop] == _USER_PROPERTY:
                    pos = stop + 1
                    continue
                break
            r.pos = stop
            continue
        spec = _BY_ID.get(pid)
        if spec is None:
            # Identifiers are varints, but every defined one fits one byte.
            raise MalformedPacket(f"unknown property identifier 0x{pid:02X}")
        name, typ = spec
        if pid not in allowed:
            # 2.2.2.2: an identifier not valid for its packet type makes a Malformed Packet.
            raise MalformedPacket(f"property {name} is not allowed in {kind}")
        if typ == _VARINT:
            value: object = r.varint()
        elif typ == _BYTE:
            value = r.u8()
        elif typ == _U16:
            value = r.u16()
        elif typ == _U32:
            value = r.u32()
        elif typ == _UTF8:
            value = decode_utf8(r.binary())
        else:
            value = r.binary()
        if pid in _BOOLEAN and value not in (0, 1):
            raise ProtocolError(f"property {name} must be 0 or 1, got {value}")
        if pid in _NONZERO and value == 0:
            raise ProtocolError(f"property {name} must not be 0")
        if pid == _SUBSCRIPTION_IDENTIFIER:
            if sub_ids and kind == SUBSCRIBE:
                raise ProtocolError("subscription identifier given twice in SUBSCRIBE")
            assert isinstance(value, int)  # a varint
            sub_ids.append(value)
            continue
        if name in values:
            raise ProtocolError(f"property {name} appears twice")
        values[name] = value
    r.end = outer_end
    if user:
        values["user_properties"] = _decode_user_properties(user)
    if sub_ids:
        values["subscription_identifiers"] = tuple(sub_ids)
    return Properties(**values)


def _decode_user_properties(raw: list[bytes]) -> tuple[tuple[str, str], ...]:
    """Names and values (alternating) as UTF-8 strings [MQTT-1.5.4], in one decode: the
    pieces joined by NUL, which no multi-byte sequence can span, decode as a whole
    exactly when each piece does; a NUL too many means a piece held U+0000. Linear in
    the section's size, with a per-property cost of a few slices (issue 21, item 8)."""
    text = decode_utf8_with_nul(b"\x00".join(raw))
    if text.count("\x00") != len(raw) - 1:
        raise MalformedPacket("string contains U+0000")
    strings = iter(text.split("\x00"))
    return tuple(zip(strings, strings))


_EMPTY_SECTION = b"\x00"
# All property values in _SPEC order, in one C-level call.
_ALL_VALUES = operator.attrgetter(*(name for _, name, _, _ in _SPEC))


def encode_properties(props: Properties, kind: str) -> bytes:
    """The property section (length + properties) of a packet of `kind`."""
    if props is EMPTY_PROPERTIES:
        return _EMPTY_SECTION
    allowed = ALLOWED_PROPERTIES[kind]
    out = bytearray()
    for (pid, name, typ, _), value in zip(_SPEC, _ALL_VALUES(props)):
        if value is None or value == ():
            continue
        if pid not in allowed:
            raise LocalProtocolError(f"property {name} is not allowed in {kind}")
        if typ == _PAIR:
            for pair in value:
                try:
                    key, val = pair
                except (TypeError, ValueError):
                    raise LocalProtocolError("user property must be a (name, value) pair") from None
                out.append(pid)
                out += encode_utf8(key)
                out += encode_utf8(val)
        elif typ == _VARINT:
            if isinstance(value, int):
                raise LocalProtocolError("subscription_identifiers must be a tuple of ints")
            if kind == SUBSCRIBE and len(value) > 1:
                raise LocalProtocolError("SUBSCRIBE carries at most one subscription identifier")
            for sub_id in value:
                if type(sub_id) is not int or not 1 <= sub_id <= MAX_VARINT:
                    raise LocalProtocolError(f"subscription identifier {sub_id!r} out of range")
                out.append(pid)
                out += encode_varint(sub_id)
        else:
            if pid in _BOOLEAN and value not in (0, 1):
                raise LocalProtocolError(f"property {name} must be 0 or 1")
            if pid in _NONZERO and value == 0:
                raise LocalProtocolError(f"property {name} must not be 0")
            out.append(pid)
            if typ == _BYTE:
                if type(value) is not int and type(value) is not bool:
                    raise LocalProtocolError(f"property {name} must be an int")
                out.append(int(value))
            elif typ == _U16:
                out += encode_u16(value, name)
            elif typ == _U32:
                out += encode_u32(value, name)
            elif typ == _UTF8:
                out += encode_utf8(value)
            else:
                out += encode_binary(value)
    return encode_varint(len(out)) + bytes(out)
