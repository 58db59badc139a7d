"""Packets in, bytes out.

`encode(packet, protocol_level)` returns the complete wire bytes of one packet for MQTT
3.1 (level 3), 3.1.1 (4) or 5.0 (5). On 3/4, properties and reason codes that have no
v3 form are left out (CONNACK and SUBACK codes are mapped to their v3 equivalents).

`patch_publish` rewrites the packet id / DUP flag of already-encoded PUBLISH bytes, so
the broker encodes a message once and fans the same bytes out to every subscriber.
"""

from __future__ import annotations

from typing import Callable

from ._wire import encode_binary, encode_u16, encode_utf8, encode_varint
from .errors import LocalProtocolError, RemoteProtocolError
from .packets import (
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
    Pingreq,
    Pingresp,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Unsuback,
    Unsubscribe,
)
from .properties import EMPTY_PROPERTIES, Properties, encode_properties
from .reason_codes import (
    AUTH_REASONS,
    CONNACK_REASONS,
    DISCONNECT_REASONS,
    PUBACK_REASONS,
    PUBREL_REASONS,
    SUBACK_REASONS,
    UNSUBACK_REASONS,
    connack_v3_return_code,
    suback_v3_return_code,
)
from .topics import validate_topic_filter

__all__ = ["encode", "encode_plain_publish", "patch_publish", "split_publish"]

_LEVELS = (3, 4, 5)
_PINGREQ = b"\xc0\x00"
_PINGRESP = b"\xd0\x00"
_DISCONNECT_BARE = b"\xe0\x00"
_AUTH_BARE = b"\xf0\x00"


def _packet(first_byte: int, body: bytes) -> bytes:
    return bytes((first_byte,)) + encode_varint(len(body)) + body


def _props(props: Properties, kind: str) -> bytes:
    if props is EMPTY_PROPERTIES:
        return b"\x00"
    if not isinstance(props, Properties):
        raise LocalProtocolError(f"properties must be a Properties, not {type(props).__name__}")
    return encode_properties(props, kind)


def _no_props(props: Properties) -> bool:
    # A fresh Properties() means the same as the shared EMPTY_PROPERTIES.
    return props is EMPTY_PROPERTIES or props == EMPTY_PROPERTIES


def _check_reason(code: int, allowed: frozenset[int], kind: str) -> None:
    if code not in allowed:
        raise LocalProtocolError(f"reason code {code!r} is not valid in {kind}", code)


# --- PUBLISH: the hot path -------------------------------------------------------------

def _encode_publish(p: Publish, level: int) -> bytes:
    topic = p.topic
    try:
        raw_topic = topic.encode("utf-8")
    except (UnicodeEncodeError, AttributeError):
        raise LocalProtocolError(f"PUBLISH topic {topic!r} is not an encodable string") from None
    tlen = len(raw_topic)
    if "+" in topic or "#" in topic or "\x00" in topic or tlen > 0xFFFF:
        raise LocalProtocolError(f"PUBLISH topic {topic!r} is not a valid topic name")
    qos = p.qos
    first = 0x30 | (qos << 1)
    if p.retain:
        first |= 0x01
    if p.dup:
        if not qos:
            raise LocalProtocolError("DUP must be 0 on a QoS 0 PUBLISH [MQTT-3.3.1-2]")
        first |= 0x08
    if qos:
        pid = p.packet_id
        if type(pid) is not int or not 0 < pid <= 0xFFFF:
            raise LocalProtocolError(f"QoS {qos} PUBLISH needs a packet id 1..65535, not {pid!r}")
        header = tlen.to_bytes(2, "big") + raw_topic + pid.to_bytes(2, "big")
    else:
        header = tlen.to_bytes(2, "big") + raw_topic
    props = p.properties
    if level == 5:
        if props is EMPTY_PROPERTIES:
            header += b"\x00"
        else:
            header += _props(props, "PUBLISH")
        if not tlen and props.topic_alias is None:
            raise LocalProtocolError("an empty topic name needs a topic alias")
    elif not tlen:
        raise LocalProtocolError("empty topic name (topic aliases need MQTT 5)")
    payload = p.payload
    if type(payload) is not bytes:
        if not isinstance(payload, (bytearray, memoryview)):
            raise LocalProtocolError(f"payload must be bytes, not {type(payload).__name__}")
        payload = bytes(payload)
    return b"".join((bytes((first,)), encode_varint(len(header) + len(payload)), header, payload))


def encode_plain_publish(topic: str, payload: bytes, qos: int, retain: bool, dup: bool, packet_id: int | None,
                         protocol_level: int) -> bytes:
    """The bytes `encode(Publish(...))` gives for a PUBLISH with no properties, without
    building the `Publish` (the broker's delivery path, once per message or subscriber).

    For topics and payloads that passed validation already (a decoded PUBLISH, a will):
    only the packet id is checked here."""
    raw = topic.encode("utf-8")
    first = 0x30 | (qos << 1)
    if retain:
        first |= 0x01
    if qos:
        if dup:
            first |= 0x08
        if type(packet_id) is not int or not 0 < packet_id <= 0xFFFF:
            raise LocalProtocolError(f"QoS {qos} PUBLISH needs a packet id 1..65535, not {packet_id!r}")
        header = len(raw).to_bytes(2, "big") + raw + packet_id.to_bytes(2, "big")
    else:
        header = len(raw).to_bytes(2, "big") + raw
    if protocol_level == 5:
        header += b"\x00"  # property length 0
    return b"".join((bytes((first,)), encode_varint(len(header) + len(payload)), header, payload))


def patch_publish(encoded: bytes, *, packet_id: int | None = None, dup: bool | None = None) -> bytes:
    """A copy of the encoded QoS>0 PUBLISH `encoded` with another packet id and/or DUP flag.

    Works at any protocol level (the packet id sits right after the topic name in all
    of them) and never looks at the properties or payload.
    """
    first = encoded[0]
    if first >> 4 != 3:
        raise LocalProtocolError("patch_publish: not an encoded PUBLISH")
    if not first & 0x06:
        raise LocalProtocolError("patch_publish: a QoS 0 PUBLISH has no packet id or DUP flag")
    # skip the remaining-length varint (1..4 bytes)
    pos = 1
    while encoded[pos] & 0x80:
        pos += 1
    pos += 1
    if dup is not None:
        first = (first | 0x08) if dup else (first & ~0x08)
    if packet_id is None:
        return bytes((first,)) + encoded[1:]
    if type(packet_id) is not int or not 0 < packet_id <= 0xFFFF:
        raise LocalProtocolError(f"packet id must be 1..65535, not {packet_id!r}")
    pid_at = pos + 2 + ((encoded[pos] << 8) | encoded[pos + 1])
    return b"".join(
        (bytes((first,)), encoded[1:pid_at], packet_id.to_bytes(2, "big"), encoded[pid_at + 2 :])
    )


def split_publish(encoded: bytes) -> tuple[bytes, bytes]:
    """The bytes of an encoded QoS>0 PUBLISH before and after its packet id, so that
    `head + packet_id.to_bytes(2, "big") + tail` is the same PUBLISH under another id
    (DUP flag as encoded). One message's bytes are split once and joined for each
    subscriber: cheaper than `patch_publish` for each, which finds the id every time."""
    first = encoded[0]
    if first >> 4 != 3 or not first & 0x06:
        raise LocalProtocolError("split_publish: not an encoded QoS>0 PUBLISH")
    pos = 1
    while encoded[pos] & 0x80:
        pos += 1
    pos += 1
    pid_at = pos + 2 + ((encoded[pos] << 8) | encoded[pos + 1])
    return encoded[:pid_at], encoded[pid_at + 2:]


# --- everything else ---------------------------------------------------------------------

def _encode_connect(p: Connect, level: int) -> bytes:
    if p.protocol_level != level:
        raise LocalProtocolError(
            f"CONNECT says protocol level {p.protocol_level} but level {level} was asked for"
        )
    flags = 0x02 if p.clean_start else 0
    will = p.will
    if will is not None:
        flags |= 0x04 | (will.qos << 3)
        if will.retain:
            flags |= 0x20
    if p.password is not None:
        if p.username is None and level < 5:
            raise LocalProtocolError("MQTT 3.1.1 needs a user name to send a password [MQTT-3.1.2-22]")
        flags |= 0x40
    if p.username is not None:
        flags |= 0x80
    out = [encode_utf8(p.protocol_name), bytes((level, flags)), encode_u16(p.keep_alive, "keep_alive")]
    if level == 5:
        out.append(_props(p.properties, "CONNECT"))
    out.append(encode_utf8(p.client_id))
    if will is not None:
        if level == 5:
            out.append(_props(will.properties, "WILL"))
        if not will.topic or "+" in will.topic or "#" in will.topic:
            raise LocalProtocolError(f"will topic {will.topic!r} is not a valid topic name")
        out.append(encode_utf8(will.topic))
        out.append(encode_binary(will.payload))
    if p.username is not None:
        out.append(encode_utf8(p.username))
    if p.password is not None:
        out.append(encode_binary(p.password))
    return _packet(0x10, b"".join(out))


def _encode_connack(p: Connack, level: int) -> bytes:
    _check_reason(p.reason_code, CONNACK_REASONS, "CONNACK")
    if p.session_present and p.reason_code:
        raise LocalProtocolError("session_present must be 0 when the CONNACK refuses [MQTT-3.2.2-6]")
    flags = 1 if p.session_present and level > 3 else 0
    if level == 5:
        return _packet(0x20, bytes((flags, p.reason_code)) + _props(p.properties, "CONNACK"))
    return bytes((0x20, 0x02, flags, connack_v3_return_code(p.reason_code)))


def _encode_ack(first: int, kind: str, allowed: frozenset[int]) -> Callable[[Puback | Pubrec | Pubrel | Pubcomp, int], bytes]:
    def encode_ack(p: Puback | Pubrec | Pubrel | Pubcomp, level: int) -> bytes:
        pid = encode_u16(p.packet_id, f"{kind} packet id")
        if level < 5:
            return bytes((first, 2)) + pid
        code = p.reason_code
        _check_reason(code, allowed, kind)
        if _no_props(p.properties):
            # [MQTT-3.4.2.1] the reason code may be left out when it is 0 and there are
            # no properties
            if code == 0:
                return bytes((first, 2)) + pid
            return bytes((first, 3)) + pid + bytes((code,))
        return _packet(first, pid + bytes((code,)) + _props(p.properties, kind))

    return encode_ack


def _encode_subscribe(p: Subscribe, level: int) -> bytes:
    if not p.subscriptions:
        raise LocalProtocolError("SUBSCRIBE needs at least one subscription [MQTT-3.8.3-2]")
    out = [encode_u16(p.packet_id, "SUBSCRIBE packet id")]
    if level == 5:
        out.append(_props(p.properties, "SUBSCRIBE"))
    for sub in p.subscriptions:
        try:
            validate_topic_filter(sub.topic_filter)
        except RemoteProtocolError as exc:
            raise LocalProtocolError(exc.message, exc.reason_code) from None
        options = sub.qos
        if level == 5:
            if sub.no_local:
                if sub.topic_filter.startswith("$share/"):
                    raise LocalProtocolError("no_local on a shared subscription [MQTT-3.8.3-4]")
                options |= 0x04
            if sub.retain_as_published:
                options |= 0x08
            options |= sub.retain_handling << 4
        elif sub.no_local or sub.retain_as_published or sub.retain_handling:
            raise LocalProtocolError("subscription options beyond QoS need MQTT 5")
        out.append(encode_utf8(sub.topic_filter))
        out.append(bytes((options,)))
    return _packet(0x82, b"".join(out))


def _encode_suback(p: Suback, level: int) -> bytes:
    for code in p.reason_codes:
        _check_reason(code, SUBACK_REASONS, "SUBACK")
    pid = encode_u16(p.packet_id, "SUBACK packet id")
    if level == 5:
        return _packet(0x90, pid + _props(p.properties, "SUBACK") + bytes(p.reason_codes))
    return _packet(0x90, pid + bytes(suback_v3_return_code(c) for c in p.reason_codes))


def _encode_unsubscribe(p: Unsubscribe, level: int) -> bytes:
    if not p.topic_filters:
        raise LocalProtocolError("UNSUBSCRIBE needs at least one topic filter [MQTT-3.10.3-2]")
    out = [encode_u16(p.packet_id, "UNSUBSCRIBE packet id")]
    if level == 5:
        out.append(_props(p.properties, "UNSUBSCRIBE"))
    for topic_filter in p.topic_filters:
        try:
            validate_topic_filter(topic_filter)
        except RemoteProtocolError as exc:
            raise LocalProtocolError(exc.message, exc.reason_code) from None
        out.append(encode_utf8(topic_filter))
    return _packet(0xA2, b"".join(out))


def _encode_unsuback(p: Unsuback, level: int) -> bytes:
    pid = encode_u16(p.packet_id, "UNSUBACK packet id")
    if level < 5:
        return bytes((0xB0, 2)) + pid
    for code in p.reason_codes:
        _check_reason(code, UNSUBACK_REASONS, "UNSUBACK")
    return _packet(0xB0, pid + _props(p.properties, "UNSUBACK") + bytes(p.reason_codes))


def _encode_pingreq(p: Pingreq, level: int) -> bytes:
    return _PINGREQ


def _encode_pingresp(p: Pingresp, level: int) -> bytes:
    return _PINGRESP


def _encode_disconnect(p: Disconnect, level: int) -> bytes:
    if level < 5:
        return _DISCONNECT_BARE
    _check_reason(p.reason_code, DISCONNECT_REASONS, "DISCONNECT")
    if _no_props(p.properties):
        if p.reason_code == 0:
            return _DISCONNECT_BARE
        return bytes((0xE0, 1, p.reason_code))
    return _packet(0xE0, bytes((p.reason_code,)) + _props(p.properties, "DISCONNECT"))


def _encode_auth(p: Auth, level: int) -> bytes:
    if level < 5:
        raise LocalProtocolError("AUTH exists only in MQTT 5")
    _check_reason(p.reason_code, AUTH_REASONS, "AUTH")
    if _no_props(p.properties) and p.reason_code == 0:
        return _AUTH_BARE
    return _packet(0xF0, bytes((p.reason_code,)) + _props(p.properties, "AUTH"))


# Each entry takes the packet type it is keyed by (a dict cannot say so to mypy).
_ENCODERS: dict[type, Callable[..., bytes]] = {
    Publish: _encode_publish,
    Connect: _encode_connect,
    Connack: _encode_connack,
    Puback: _encode_ack(0x40, "PUBACK", PUBACK_REASONS),
    Pubrec: _encode_ack(0x50, "PUBREC", PUBACK_REASONS),
    Pubrel: _encode_ack(0x62, "PUBREL", PUBREL_REASONS),
    Pubcomp: _encode_ack(0x70, "PUBCOMP", PUBREL_REASONS),
    Subscribe: _encode_subscribe,
    Suback: _encode_suback,
    Unsubscribe: _encode_unsubscribe,
    Unsuback: _encode_unsuback,
    Pingreq: _encode_pingreq,
    Pingresp: _encode_pingresp,
    Disconnect: _encode_disconnect,
    Auth: _encode_auth,
}


def encode(packet: Packet, protocol_level: int) -> bytes:
    """The wire bytes of `packet` at `protocol_level` (3, 4 or 5)."""
    if type(packet) is Publish and (protocol_level == 4 or protocol_level == 5):
        return _encode_publish(packet, protocol_level)
    if protocol_level not in _LEVELS:
        raise LocalProtocolError(f"protocol level {protocol_level!r} is not 3, 4 or 5")
    try:
        encoder = _ENCODERS[type(packet)]
    except KeyError:
        raise LocalProtocolError(f"{type(packet).__name__} is not an MQTT packet") from None
    return encoder(packet, protocol_level)
