"""MQTT packet objects, one class per control packet type.

Packets are plain values, never changed once built (frozen dataclasses, but for the
publish path's five: see `Publish`): the decoder produces them, the encoder consumes them, and they
mean the same thing at every protocol level (reason codes are always MQTT 5 values;
properties are `EMPTY_PROPERTIES` on 3.1/3.1.1). Cheap sanity checks run when a packet
is built and raise `LocalProtocolError`; the rest is checked by the encoder.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Union

from .errors import LocalProtocolError
from .properties import EMPTY_PROPERTIES, Properties

__all__ = [
    "PacketType",
    "Will",
    "Connect",
    "Connack",
    "Publish",
    "Puback",
    "Pubrec",
    "Pubrel",
    "Pubcomp",
    "Subscription",
    "Subscribe",
    "Suback",
    "Unsubscribe",
    "Unsuback",
    "Pingreq",
    "Pingresp",
    "Disconnect",
    "Auth",
    "Packet",
    "PROTOCOL_NAMES",
]


class PacketType(enum.IntEnum):
    """The control packet type in the high nibble of the first byte."""

    CONNECT = 1
    CONNACK = 2
    PUBLISH = 3
    PUBACK = 4
    PUBREC = 5
    PUBREL = 6
    PUBCOMP = 7
    SUBSCRIBE = 8
    SUBACK = 9
    UNSUBSCRIBE = 10
    UNSUBACK = 11
    PINGREQ = 12
    PINGRESP = 13
    DISCONNECT = 14
    AUTH = 15


# protocol level -> protocol name on the wire
PROTOCOL_NAMES = {3: "MQIsdp", 4: "MQTT", 5: "MQTT"}



def _check_qos(qos: int, what: str) -> None:
    if qos not in (0, 1, 2) or type(qos) is bool:
        raise LocalProtocolError(f"{what} QoS must be 0, 1 or 2, not {qos!r}")


def _check_packet_id(packet_id: int, what: str) -> None:
    if type(packet_id) is not int or not 0 < packet_id <= 0xFFFF:
        raise LocalProtocolError(f"{what} packet id must be 1..65535, not {packet_id!r}")


@dataclass(frozen=True, slots=True)
class Will:
    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    properties: Properties = EMPTY_PROPERTIES

    def __post_init__(self) -> None:
        _check_qos(self.qos, "will")


@dataclass(frozen=True, slots=True)
class Connect:
    client_id: str
    clean_start: bool = True
    keep_alive: int = 60
    username: str | None = None
    password: bytes | None = None
    will: Will | None = None
    properties: Properties = EMPTY_PROPERTIES
    protocol_level: int = 4
    protocol_name: str = "MQTT"

    def __post_init__(self) -> None:
        expected = PROTOCOL_NAMES.get(self.protocol_level)
        if expected is None:
            raise LocalProtocolError(f"protocol level {self.protocol_level!r} is not 3, 4 or 5")
        if self.protocol_level == 3 and self.protocol_name == "MQTT":
            # The default name is the 3.1.1/5 one; MQTT 3.1 calls itself MQIsdp.
            object.__setattr__(self, "protocol_name", "MQIsdp")
        elif self.protocol_name != expected:
            raise LocalProtocolError(
                f"protocol level {self.protocol_level} is named {expected!r}, "
                f"not {self.protocol_name!r}"
            )
        if type(self.keep_alive) is not int or not 0 <= self.keep_alive <= 0xFFFF:
            raise LocalProtocolError(f"keep_alive {self.keep_alive!r} is not 0..65535")


@dataclass(frozen=True, slots=True)
class Connack:
    session_present: bool = False
    reason_code: int = 0
    properties: Properties = EMPTY_PROPERTIES


# The packets of the publish path (PUBLISH and its acks, one or more per message) have
# an `__init__` of their own, not the dataclass's: mypyc compiles a written one (~40 ns),
# while the one `dataclass` generates, frozen, stays Python and assigns each field through
# `object.__setattr__` (0.8-2 us, a tenth of a QoS 1 delivery's CPU). Not frozen, then:
# they are values all the same, never changed once built (`dataclasses.replace` makes
# another); `unsafe_hash` keeps them hashable as the frozen ones are.
@dataclass(slots=True, init=False, unsafe_hash=True)
class Publish:
    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int | None = None
    properties: Properties = EMPTY_PROPERTIES

    def __init__(self, topic: str, payload: bytes = b"", qos: int = 0, retain: bool = False, dup: bool = False,
                 packet_id: int | None = None, properties: Properties = EMPTY_PROPERTIES) -> None:
        if qos != 0 and qos != 1 and qos != 2:
            raise LocalProtocolError(f"PUBLISH QoS must be 0, 1 or 2, not {qos!r}")
        self.topic = topic
        self.payload = payload
        self.qos = qos
        self.retain = retain
        self.dup = dup
        self.packet_id = packet_id
        self.properties = properties


@dataclass(slots=True, init=False, unsafe_hash=True)
class Puback:
    packet_id: int
    reason_code: int = 0
    properties: Properties = EMPTY_PROPERTIES

    def __init__(self, packet_id: int, reason_code: int = 0, properties: Properties = EMPTY_PROPERTIES) -> None:
        _check_packet_id(packet_id, "PUBACK")
        self.packet_id = packet_id
        self.reason_code = reason_code
        self.properties = properties


@dataclass(slots=True, init=False, unsafe_hash=True)
class Pubrec:
    packet_id: int
    reason_code: int = 0
    properties: Properties = EMPTY_PROPERTIES

    def __init__(self, packet_id: int, reason_code: int = 0, properties: Properties = EMPTY_PROPERTIES) -> None:
        _check_packet_id(packet_id, "PUBREC")
        self.packet_id = packet_id
        self.reason_code = reason_code
        self.properties = properties


@dataclass(slots=True, init=False, unsafe_hash=True)
class Pubrel:
    packet_id: int
    reason_code: int = 0
    properties: Properties = EMPTY_PROPERTIES

    def __init__(self, packet_id: int, reason_code: int = 0, properties: Properties = EMPTY_PROPERTIES) -> None:
        _check_packet_id(packet_id, "PUBREL")
        self.packet_id = packet_id
        self.reason_code = reason_code
        self.properties = properties


@dataclass(slots=True, init=False, unsafe_hash=True)
class Pubcomp:
    packet_id: int
    reason_code: int = 0
    properties: Properties = EMPTY_PROPERTIES

    def __init__(self, packet_id: int, reason_code: int = 0, properties: Properties = EMPTY_PROPERTIES) -> None:
        _check_packet_id(packet_id, "PUBCOMP")
        self.packet_id = packet_id
        self.reason_code = reason_code
        self.properties = properties


@dataclass(frozen=True, slots=True)
class Subscription:
    topic_filter: str
    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0

    def __post_init__(self) -> None:
        _check_qos(self.qos, "subscription")
        if self.retain_handling not in (0, 1, 2):
            raise LocalProtocolError(f"retain_handling must be 0, 1 or 2, not {self.retain_handling!r}")


@dataclass(frozen=True, slots=True)
class Subscribe:
    packet_id: int
    subscriptions: tuple[Subscription, ...]
    properties: Properties = EMPTY_PROPERTIES

    def __post_init__(self) -> None:
        _check_packet_id(self.packet_id, "SUBSCRIBE")
        if type(self.subscriptions) is not tuple:
            object.__setattr__(self, "subscriptions", tuple(self.subscriptions))


@dataclass(frozen=True, slots=True)
class Suback:
    packet_id: int
    reason_codes: tuple[int, ...]
    properties: Properties = EMPTY_PROPERTIES

    def __post_init__(self) -> None:
        _check_packet_id(self.packet_id, "SUBACK")
        if type(self.reason_codes) is not tuple:
            object.__setattr__(self, "reason_codes", tuple(self.reason_codes))


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    packet_id: int
    topic_filters: tuple[str, ...]
    properties: Properties = EMPTY_PROPERTIES

    def __post_init__(self) -> None:
        _check_packet_id(self.packet_id, "UNSUBSCRIBE")
        if type(self.topic_filters) is not tuple:
            object.__setattr__(self, "topic_filters", tuple(self.topic_filters))


@dataclass(frozen=True, slots=True)
class Unsuback:
    packet_id: int
    reason_codes: tuple[int, ...] = ()
    properties: Properties = EMPTY_PROPERTIES

    def __post_init__(self) -> None:
        _check_packet_id(self.packet_id, "UNSUBACK")
        if type(self.reason_codes) is not tuple:
            object.__setattr__(self, "reason_codes", tuple(self.reason_codes))


@dataclass(frozen=True, slots=True)
class Pingreq:
    pass


@dataclass(frozen=True, slots=True)
class Pingresp:
    pass


@dataclass(frozen=True, slots=True)
class Disconnect:
    reason_code: int = 0
    properties: Properties = EMPTY_PROPERTIES


@dataclass(frozen=True, slots=True)
class Auth:
    reason_code: int = 0
    properties: Properties = EMPTY_PROPERTIES


Packet = Union[
    Connect, Connack, Publish, Puback, Pubrec, Pubrel, Pubcomp, Subscribe, Suback,
    Unsubscribe, Unsuback, Pingreq, Pingresp, Disconnect, Auth,
]
