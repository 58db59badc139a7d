"""Protocol errors. Each says who broke the rules and which v5 reason code to answer with.

The decoder raises only `RemoteProtocolError` (and its subclasses); the encoder and the
packet constructors raise `LocalProtocolError`. A broker that catches a
`RemoteProtocolError` answers with `reason_code` (CONNACK before the session exists,
DISCONNECT on v5 after it) and closes the connection.
"""

from __future__ import annotations

from typing import ClassVar

from .reason_codes import ReasonCode

__all__ = [
    "MQTTError",
    "RemoteProtocolError",
    "LocalProtocolError",
    "MalformedPacket",
    "ProtocolError",
    "PacketTooLarge",
    "UnsupportedProtocolVersion",
    "TopicFilterInvalid",
    "TopicNameInvalid",
    "TopicAliasInvalid",
    "ClientIdentifierNotValid",
]


class MQTTError(Exception):
    """Base of every error of this package.

    `reason_code` is the MQTT 5 reason code that describes the failure; `message` a
    human-readable detail.
    """

    # ClassVar: each subclass overrides it; mypyc drops an undeclared class override.
    default_reason_code: ClassVar[int] = ReasonCode.UNSPECIFIED_ERROR

    def __init__(self, message: str = "", reason_code: int | None = None) -> None:
        if reason_code is None:
            reason_code = self.default_reason_code
        super().__init__(message)
        self.message = message
        self.reason_code = int(reason_code)

    def __str__(self) -> str:
        return f"{self.message} (reason 0x{self.reason_code:02X})"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, reason_code=0x{self.reason_code:02X})"


class RemoteProtocolError(MQTTError):
    """The peer sent something that breaks the protocol."""


class LocalProtocolError(MQTTError):
    """We tried to build or encode something that is not valid MQTT."""

    default_reason_code = ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR


class MalformedPacket(RemoteProtocolError):
    default_reason_code = ReasonCode.MALFORMED_PACKET


class ProtocolError(RemoteProtocolError):
    default_reason_code = ReasonCode.PROTOCOL_ERROR


class PacketTooLarge(RemoteProtocolError):
    default_reason_code = ReasonCode.PACKET_TOO_LARGE


class UnsupportedProtocolVersion(RemoteProtocolError):
    default_reason_code = ReasonCode.UNSUPPORTED_PROTOCOL_VERSION


class TopicFilterInvalid(RemoteProtocolError):
    default_reason_code = ReasonCode.TOPIC_FILTER_INVALID


class TopicNameInvalid(RemoteProtocolError):
    default_reason_code = ReasonCode.TOPIC_NAME_INVALID


class TopicAliasInvalid(RemoteProtocolError):
    default_reason_code = ReasonCode.TOPIC_ALIAS_INVALID


class ClientIdentifierNotValid(RemoteProtocolError):
    default_reason_code = ReasonCode.CLIENT_IDENTIFIER_NOT_VALID
