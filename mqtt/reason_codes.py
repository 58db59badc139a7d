"""MQTT 5 reason codes, the subsets each packet may carry, and the v3.1.1 CONNACK mapping.

Everywhere in meshd a reason code is the MQTT 5 value; the encoder and decoder map to
and from the v3.1.1 return codes at the edge, so the broker reasons in one vocabulary.
"""

from __future__ import annotations

import enum

__all__ = [
    "ReasonCode",
    "connack_v3_return_code",
    "connack_reason_from_v3",
    "suback_v3_return_code",
    "CONNACK_REASONS",
    "PUBACK_REASONS",
    "PUBREC_REASONS",
    "PUBREL_REASONS",
    "PUBCOMP_REASONS",
    "SUBACK_REASONS",
    "SUBACK_V3_RETURN_CODES",
    "UNSUBACK_REASONS",
    "DISCONNECT_REASONS",
    "AUTH_REASONS",
]


class ReasonCode(enum.IntEnum):
    SUCCESS = 0x00
    NORMAL_DISCONNECTION = 0x00
    GRANTED_QOS_0 = 0x00
    GRANTED_QOS_1 = 0x01
    GRANTED_QOS_2 = 0x02
    DISCONNECT_WITH_WILL = 0x04
    NO_MATCHING_SUBSCRIBERS = 0x10
    NO_SUBSCRIPTION_EXISTED = 0x11
    CONTINUE_AUTHENTICATION = 0x18
    REAUTHENTICATE = 0x19
    UNSPECIFIED_ERROR = 0x80
    MALFORMED_PACKET = 0x81
    PROTOCOL_ERROR = 0x82
    IMPLEMENTATION_SPECIFIC_ERROR = 0x83
    UNSUPPORTED_PROTOCOL_VERSION = 0x84
    CLIENT_IDENTIFIER_NOT_VALID = 0x85
    BAD_USER_NAME_OR_PASSWORD = 0x86
    NOT_AUTHORIZED = 0x87
    SERVER_UNAVAILABLE = 0x88
    SERVER_BUSY = 0x89
    BANNED = 0x8A
    SERVER_SHUTTING_DOWN = 0x8B
    BAD_AUTHENTICATION_METHOD = 0x8C
    KEEP_ALIVE_TIMEOUT = 0x8D
    SESSION_TAKEN_OVER = 0x8E
    TOPIC_FILTER_INVALID = 0x8F
    TOPIC_NAME_INVALID = 0x90
    PACKET_IDENTIFIER_IN_USE = 0x91
    PACKET_IDENTIFIER_NOT_FOUND = 0x92
    RECEIVE_MAXIMUM_EXCEEDED = 0x93
    TOPIC_ALIAS_INVALID = 0x94
    PACKET_TOO_LARGE = 0x95
    MESSAGE_RATE_TOO_HIGH = 0x96
    QUOTA_EXCEEDED = 0x97
    ADMINISTRATIVE_ACTION = 0x98
    PAYLOAD_FORMAT_INVALID = 0x99
    RETAIN_NOT_SUPPORTED = 0x9A
    QOS_NOT_SUPPORTED = 0x9B
    USE_ANOTHER_SERVER = 0x9C
    SERVER_MOVED = 0x9D
    SHARED_SUBSCRIPTIONS_NOT_SUPPORTED = 0x9E
    CONNECTION_RATE_EXCEEDED = 0x9F
    MAXIMUM_CONNECT_TIME = 0xA0
    SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED = 0xA1
    WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED = 0xA2


# Which reason codes each packet may carry (MQTT 5 spec, the "Reason Code" tables of
# sections 3.2.2.2, 3.4.2.1, 3.5.2.1, 3.6.2.1, 3.7.2.1, 3.9.3, 3.11.3, 3.14.2.1, 3.15.2.1).
CONNACK_REASONS = frozenset(
    {0x00, 0x80, 0x81, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87, 0x88, 0x89, 0x8A, 0x8C,
     0x90, 0x95, 0x97, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9F}
)
PUBACK_REASONS = frozenset({0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99})
PUBREC_REASONS = PUBACK_REASONS
PUBREL_REASONS = frozenset({0x00, 0x92})
PUBCOMP_REASONS = PUBREL_REASONS
SUBACK_REASONS = frozenset(
    {0x00, 0x01, 0x02, 0x80, 0x83, 0x87, 0x8F, 0x91, 0x97, 0x9E, 0xA1, 0xA2}
)
SUBACK_V3_RETURN_CODES = frozenset({0x00, 0x01, 0x02, 0x80})
UNSUBACK_REASONS = frozenset({0x00, 0x11, 0x80, 0x83, 0x87, 0x8F, 0x91})
DISCONNECT_REASONS = frozenset(
    {0x00, 0x04, 0x80, 0x81, 0x82, 0x83, 0x87, 0x89, 0x8B, 0x8D, 0x8E, 0x8F, 0x90,
     0x93, 0x94, 0x95, 0x96, 0x97, 0x98, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9E, 0x9F,
     0xA0, 0xA1, 0xA2}
)
AUTH_REASONS = frozenset({0x00, 0x18, 0x19})

# v3.1.1 CONNACK return codes (section 3.2.2.3).
_V3_ACCEPTED = 0
_V3_UNACCEPTABLE_PROTOCOL_VERSION = 1
_V3_IDENTIFIER_REJECTED = 2
_V3_SERVER_UNAVAILABLE = 3
_V3_BAD_USER_NAME_OR_PASSWORD = 4
_V3_NOT_AUTHORIZED = 5

# v5 -> v3.1.1. The direct equivalents first; then the v5-only codes, mapped to the
# v3 code an operator of Mosquitto/EMQX would expect: rejections of *who* the client is
# (banned, wrong authentication method) become "not authorized" (5); everything that is
# about the server's state or the request as a whole (unspecified/implementation
# errors, malformed or protocol-violating CONNECT, busy, moved, quota, rate limits,
# unsupported QoS/retain, packet too large, ...) becomes "server unavailable" (3).
# v3.1.1 has no way to say "malformed" in a CONNACK (the spec says close the socket);
# a broker that wants to follow it to the letter closes without a CONNACK instead.
_V5_TO_V3 = {
    0x00: _V3_ACCEPTED,
    0x84: _V3_UNACCEPTABLE_PROTOCOL_VERSION,
    0x85: _V3_IDENTIFIER_REJECTED,
    0x88: _V3_SERVER_UNAVAILABLE,
    0x89: _V3_SERVER_UNAVAILABLE,
    0x86: _V3_BAD_USER_NAME_OR_PASSWORD,
    0x87: _V3_NOT_AUTHORIZED,
    0x8A: _V3_NOT_AUTHORIZED,  # banned
    0x8C: _V3_NOT_AUTHORIZED,  # bad authentication method
}

_V3_TO_V5 = {
    _V3_ACCEPTED: 0x00,
    _V3_UNACCEPTABLE_PROTOCOL_VERSION: 0x84,
    _V3_IDENTIFIER_REJECTED: 0x85,
    _V3_SERVER_UNAVAILABLE: 0x88,
    _V3_BAD_USER_NAME_OR_PASSWORD: 0x86,
    _V3_NOT_AUTHORIZED: 0x87,
}


def connack_v3_return_code(reason: int) -> int:
    """Map a v5 CONNACK reason code to the v3.1.1 return code (0..5).

    0x00->0, 0x84->1, 0x85->2, 0x86->4, 0x87/0x8A/0x8C->5; any other failure -> 3.
    """
    code = _V5_TO_V3.get(reason)
    if code is not None:
        return code
    if reason < 0x80:
        raise ValueError(f"0x{reason:02X} is not a CONNACK failure or success code")
    return _V3_SERVER_UNAVAILABLE


def connack_reason_from_v3(code: int) -> int:
    """Map a v3.1.1 CONNACK return code (0..5) to the v5 reason code; ValueError otherwise."""
    try:
        return _V3_TO_V5[code]
    except KeyError:
        raise ValueError(f"v3.1.1 CONNACK return code {code} is reserved") from None


def suback_v3_return_code(reason: int) -> int:
    """v5 SUBACK reason -> v3.1.1 return code: granted QoS as-is, any failure -> 0x80."""
    return reason if reason < 0x80 else 0x80
