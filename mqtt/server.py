"""The server side of one MQTT connection, sans I/O: bytes and `now` in, events out.

    conn = ServerConnection(settings, now)
    conn.receive_data(data, now)          # bytes from the socket
    while (event := conn.next_event()) is not None:
        ...                               # Connect, Publish, Subscribe, ...
        socket.send(conn.puback(pid))     # every send method returns the bytes to write

It owns everything MQTT says about one connection: CONNECT validation (client
identifier, authentication method, retained will), the CONNECT timeout and keep alive
(`deadline`, `handle_timer(now)`), topic aliases both ways, receive maximum (inbound
QoS 2 exchanges) and the outbound inflight window with its packet identifiers, the
QoS 2 state of both directions, maximum packet size both ways, the will and the
DISCONNECT rules, and the differences between 3.1, 3.1.1 and 5.0. It never writes on
its own: the caller answers each event with a send method (so it decides when an
acknowledgement may leave), and it never reads a clock or does I/O.

Events are the decoded packets where the packet is the fact (no copy on the publish
path), and small frozen records where it is not (`PublishRepeated`, `PublishReleased`,
`ConnectRefused`, `ProtocolViolation`, `TimedOut`). After a `ProtocolViolation`,
`ConnectRefused` or an inbound DISCONNECT the connection yields nothing more; the
caller sends `close(reason)` (a CONNACK or DISCONNECT as the state requires) and
closes the transport.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, replace
from typing import Iterable, Union

from .decoder import Decoder
from .encoder import encode, encode_plain_publish
from .errors import LocalProtocolError, MQTTError
from .packets import (
    Auth,
    Connack,
    Connect,
    Disconnect,
    Pingreq,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Unsuback,
    Unsubscribe,
    Will,
)
from .properties import EMPTY_PROPERTIES, Properties
from .reason_codes import PUBACK_REASONS, PUBREL_REASONS, ReasonCode

__all__ = [
    "ServerSettings", "ServerState", "ServerConnection", "Event",
    "ConnectRefused", "ProtocolViolation", "PublishRepeated", "PublishReleased", "TimedOut",
]

_PINGRESP = b"\xd0\x00"


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """What this server grants every client (the CONNACK's v5 properties say so)."""

    receive_maximum: int = 1024  # inbound QoS 2 exchanges at once (MQTT-3.3.4-9)
    max_packet_size: int = 1048576  # largest packet a client may send, header included
    topic_alias_maximum: int = 64  # aliases a client may set towards us
    max_keepalive: int = 65535  # v5: longer keep alives are cut down (Server Keep Alive); 3.1/3.1.1: refused (65535: no maximum)
    retain_available: bool = True
    max_inflight: int = 32  # outbound QoS 1/2 window, lowered by a v5 client's receive maximum
    connect_timeout: float = 10.0  # seconds from the connection to its CONNECT (MQTT-3.1.0-1 leaves it to us)


class ServerState(enum.Enum):
    AWAITING_CONNECT = "awaiting connect"  # nothing decoded yet
    CONNECTING = "connecting"  # a valid CONNECT is out as an event; `accept` or `close` next
    CONNECTED = "connected"
    CLOSED = "closed"  # refused, broke the rules, said DISCONNECT, or closed by us


class _Input(enum.Enum):
    CONNECT_RECEIVED = enum.auto()
    ACCEPTED = enum.auto()
    DISCONNECT_RECEIVED = enum.auto()
    CLOSED = enum.auto()


# Every state change of the connection, in one place (h11's _state.py). A pair that
# is not here is a bug of the caller (LocalProtocolError), never of the peer.
_S = ServerState
_TRANSITIONS: dict[tuple[ServerState, _Input], ServerState] = {
    (_S.AWAITING_CONNECT, _Input.CONNECT_RECEIVED): _S.CONNECTING,
    (_S.AWAITING_CONNECT, _Input.CLOSED): _S.CLOSED,
    (_S.CONNECTING, _Input.ACCEPTED): _S.CONNECTED,
    (_S.CONNECTING, _Input.CLOSED): _S.CLOSED,
    (_S.CONNECTED, _Input.DISCONNECT_RECEIVED): _S.CLOSED,
    (_S.CONNECTED, _Input.CLOSED): _S.CLOSED,
    (_S.CLOSED, _Input.CLOSED): _S.CLOSED,
}


# ------------------------------------------------------------------ events


@dataclass(frozen=True, slots=True)
class ConnectRefused:
    """A well-formed CONNECT this server must refuse (answer: `close(reason_code)`)."""

    reason_code: int
    message: str


@dataclass(frozen=True, slots=True)
class ProtocolViolation:
    """The client broke the rules (answer: `close(reason_code)`, then close)."""

    reason_code: int
    message: str


@dataclass(frozen=True, slots=True)
class PublishRepeated:
    """A QoS 2 PUBLISH whose packet id awaits its PUBREL came again: it was taken
    already (not to be routed twice); answer `pubrec(packet_id)`."""

    packet_id: int


@dataclass(frozen=True, slots=True)
class PublishReleased:
    """PUBREL: the client's QoS 2 exchange ends; `known` is False when no PUBLISH with
    that id was waiting. Answer `pubcomp(packet_id, known)`."""

    packet_id: int
    known: bool


@dataclass(frozen=True, slots=True)
class TimedOut:
    """No CONNECT within the CONNECT timeout, or keep alive ran out (1.5 x the keep
    alive with nothing received, MQTT-3.1.2-22)."""

    during_connect: bool


Event = Union[
    Connect, Publish, Subscribe, Unsubscribe, Puback, Pubrec, Pubcomp, Pingreq, Disconnect,
    ConnectRefused, ProtocolViolation, PublishRepeated, PublishReleased,
]


class _Rare:
    """What few connections need, made on first use: topic aliases (most clients use
    none) and the QoS 2 publishes received (few send QoS 2). One slot of the machine
    for both: every slot is 8 bytes of each idle client."""

    __slots__ = ("inbound", "outbound", "qos2_in")

    def __init__(self) -> None:
        self.inbound: dict[int, str] = {}  # the client's aliases
        self.outbound: dict[str, int] = {}  # ours, up to the client's Topic Alias Maximum
        self.qos2_in: set[int] = set()  # QoS 2 publishes received, PUBREL not yet


class ServerConnection:
    """One client connection's MQTT state; see the module docstring."""

    __slots__ = (
        "settings", "_decoder", "_state", "protocol_level", "keep_alive", "will", "_connect",
        "_connect_deadline", "_last_received", "_session_expiry", "send_window", "client_max_packet",
        "_rare", "topic_alias_out_max", "_inflight", "_next_packet_id", "_failed",
    )

    def __init__(self, settings: ServerSettings, now: float) -> None:
        self.settings = settings
        # None while shed (`shed`: an idle connected client holds no decoder).
        self._decoder: Decoder | None = Decoder(role="server", max_packet_size=settings.max_packet_size)
        self._state = ServerState.AWAITING_CONNECT
        self.protocol_level = 4  # until a CONNECT says otherwise
        self.keep_alive = 0  # as granted (a v5 client may be given less than it asked)
        self.will: Will | None = None
        self._connect: Connect | None = None  # while CONNECTING
        self._connect_deadline = now + settings.connect_timeout
        self._last_received = now
        self._session_expiry = 0  # v5 CONNECT's session expiry (a DISCONNECT may not raise 0)
        self.send_window = settings.max_inflight
        self.client_max_packet: int | None = None  # v5 Maximum Packet Size of the client
        # Created on first use: most clients use no alias, few send QoS 2.
        self._rare: _Rare | None = None
        self.topic_alias_out_max = 0  # aliases the client lets us set (0: none; PUBLISH bytes then differ per client)
        self._inflight: dict[int, bool] | None = None  # packet id -> PUBREL sent (QoS 2)
        self._next_packet_id = 1
        self._failed = False  # a violation, refusal or DISCONNECT: no more events

    # ----------------------------------------------------------- state

    @property
    def state(self) -> ServerState:
        return self._state

    def _move(self, event: _Input) -> None:
        try:
            self._state = _TRANSITIONS[self._state, event]
        except KeyError:
            raise LocalProtocolError(f"{event.name} is not allowed in state {self._state.value}") from None

    @property
    def deadline(self) -> float:
        """When `handle_timer` has something to say (`math.inf`: never)."""
        state = self._state
        if state is ServerState.CONNECTED:
            keep_alive = self.keep_alive
            return self._last_received + keep_alive * 1.5 if keep_alive else math.inf
        if state is ServerState.AWAITING_CONNECT:
            return self._connect_deadline
        return math.inf  # CONNECTING: the caller bounds its own work; CLOSED: nothing left

    def handle_timer(self, now: float) -> TimedOut | None:
        """`TimedOut` once `now` reached `deadline` (answer `close(KEEP_ALIVE_TIMEOUT)`)."""
        if now < self.deadline:
            return None
        return TimedOut(during_connect=self._state is not ServerState.CONNECTED)

    # ----------------------------------------------------------- receiving

    def receive_data(self, data: bytes | bytearray, now: float) -> None:
        """Bytes from the client. Keep alive counts from the last bytes received."""
        self._last_received = now
        decoder = self._decoder
        if decoder is None:  # shed while idle: what it knew is the level and the limit
            decoder = self._decoder = Decoder(role="server", protocol_level=self.protocol_level,
                                              max_packet_size=self.settings.max_packet_size)
        try:
            decoder.feed(data)
        except MQTTError:
            pass  # the decoder is dead and says so again on next_packet()

    def shed(self) -> None:
        """The client is idle: let go of the decoder if it holds nothing (no part of a
        packet, no error; ~0.1 KB of each idle connection). The next `receive_data`
        makes a new one, which only needs the CONNECT's protocol level."""
        decoder = self._decoder
        if decoder is not None and self._state is ServerState.CONNECTED and not self._failed and not decoder.buffered:
            self._decoder = None

    def next_event(self) -> Event | None:
        """The next event, or None when more bytes are needed (or nothing may follow)."""
        state = self._state
        if self._failed or not (state is ServerState.CONNECTED or state is ServerState.AWAITING_CONNECT):
            return None  # CONNECTING: what came behind the CONNECT waits for `accept`
        decoder = self._decoder
        if decoder is None:
            return None  # shed: nothing was received since
        try:
            packet = decoder.next_packet()
        except MQTTError as exc:
            return self._violation(exc.reason_code, exc.message)
        if packet is None:
            return None
        if state is ServerState.AWAITING_CONNECT:
            if type(packet) is not Connect:  # the decoder lets only a CONNECT through first
                return self._violation(ReasonCode.PROTOCOL_ERROR, "first packet must be CONNECT [MQTT-3.1.0-1]")
            return self._on_connect(packet)
        if type(packet) is Publish:
            if packet.properties is EMPTY_PROPERTIES and not packet.retain and packet.qos != 2:
                return packet  # the hot path: nothing to check, nothing to copy
            return self._on_publish(packet)
        if type(packet) is Puback or type(packet) is Pubcomp:
            if self._inflight is not None:
                self._inflight.pop(packet.packet_id, None)
            return packet
        if type(packet) is Pubrec:
            return self._on_pubrec(packet)
        if type(packet) is Pubrel:
            pid = packet.packet_id
            rare = self._rare
            known = False
            if rare is not None and pid in rare.qos2_in:
                rare.qos2_in.discard(pid)
                known = True
            return PublishReleased(pid, known)
        if type(packet) is Subscribe or type(packet) is Unsubscribe or type(packet) is Pingreq:
            return packet
        if type(packet) is Disconnect:
            return self._on_disconnect(packet)
        if type(packet) is Connect:
            return self._violation(ReasonCode.PROTOCOL_ERROR, "second CONNECT on one connection [MQTT-3.1.0-2]")
        if type(packet) is Auth:
            return self._violation(ReasonCode.PROTOCOL_ERROR, "AUTH without enhanced authentication")
        return self._violation(ReasonCode.PROTOCOL_ERROR, f"unexpected {type(packet).__name__}")

    def _violation(self, reason_code: int, message: str) -> ProtocolViolation:
        self._fail()
        return ProtocolViolation(reason_code, message)

    def _fail(self) -> None:
        # Nothing more is decoded; `close` still answers in the state the error came in.
        self._failed = True

    def _on_connect(self, c: Connect) -> Connect | ConnectRefused:
        self._move(_Input.CONNECT_RECEIVED)
        self._connect_deadline = math.inf  # its float is garbage now: an idle client keeps none
        level = self.protocol_level = c.protocol_level
        if not c.client_id and not (level == 5 or (level == 4 and c.clean_start)):
            # MQTT-3.1.3-8: 3.1.1 assigns an id only to a clean session; 3.1 never does.
            return self._refuse(ReasonCode.CLIENT_IDENTIFIER_NOT_VALID, "empty client identifier")
        props = c.properties
        if level == 5 and props.authentication_method is not None:
            return self._refuse(ReasonCode.BAD_AUTHENTICATION_METHOD, "enhanced authentication is not supported")
        if c.will is not None and c.will.retain and not self.settings.retain_available:
            return self._refuse(ReasonCode.RETAIN_NOT_SUPPORTED, "retained will, retain not available")
        keep_alive = c.keep_alive
        max_keepalive = self.settings.max_keepalive
        over_max = keep_alive > max_keepalive or (keep_alive == 0 and max_keepalive < 65535)
        if over_max and level < 5:
            # 3.1/3.1.1 cannot carry the server's keep alive: refuse with return code 2
            # (identifier rejected), as Mosquitto does, rather than let it hold longer.
            return self._refuse(ReasonCode.CLIENT_IDENTIFIER_NOT_VALID,
                                f"keep alive {keep_alive} s is above the server's maximum {max_keepalive} s"
                                if keep_alive else f"keep alive 0 (none); the server's maximum is {max_keepalive} s")
        self.will = c.will
        self._connect = c
        if level == 5:
            if over_max:
                keep_alive = max_keepalive  # MQTT-3.2.2-21: told in Server Keep Alive
            self._session_expiry = props.session_expiry_interval or 0
            if props.receive_maximum is not None:
                self.send_window = min(self.send_window, props.receive_maximum)
            self.client_max_packet = props.maximum_packet_size
            self.topic_alias_out_max = props.topic_alias_maximum or 0
        self.keep_alive = keep_alive
        return c

    def _refuse(self, reason_code: int, message: str) -> ConnectRefused:
        self._fail()
        return ConnectRefused(reason_code, message)

    def _on_publish(self, p: Publish) -> Publish | ProtocolViolation | PublishRepeated:
        if self.protocol_level == 5 and p.properties.topic_alias is not None:
            alias = p.properties.topic_alias
            if alias > self.settings.topic_alias_maximum:
                return self._violation(ReasonCode.TOPIC_ALIAS_INVALID, f"topic alias {alias} above maximum")
            if self._rare is None:
                self._rare = _Rare()
            aliases = self._rare.inbound
            if p.topic:
                aliases[alias] = p.topic
            else:
                topic = aliases.get(alias)
                if not topic:
                    return self._violation(ReasonCode.PROTOCOL_ERROR, f"unknown topic alias {alias}")
                p = replace(p, topic=topic)
        if p.retain and not self.settings.retain_available:
            return self._violation(ReasonCode.RETAIN_NOT_SUPPORTED, "retain not available")
        if p.qos == 2:
            rare = self._rare
            if rare is not None:
                qos2_in = rare.qos2_in
                if p.packet_id in qos2_in:
                    return PublishRepeated(p.packet_id)
                if len(qos2_in) >= self.settings.receive_maximum:
                    return self._violation(ReasonCode.RECEIVE_MAXIMUM_EXCEEDED, "receive maximum exceeded")
        return p

    def _on_pubrec(self, p: Pubrec) -> Pubrec:
        inflight = self._inflight
        if inflight is not None and p.packet_id in inflight:
            if p.reason_code >= 0x80:
                del inflight[p.packet_id]  # refused by the client: the exchange ends
            else:
                inflight[p.packet_id] = True
        return p

    def _on_disconnect(self, p: Disconnect) -> Disconnect | ProtocolViolation:
        expiry = p.properties.session_expiry_interval
        if expiry is not None and self._session_expiry == 0 and expiry != 0:
            return self._violation(ReasonCode.PROTOCOL_ERROR, "session expiry raised on DISCONNECT [MQTT-3.14.2-2]")
        if p.reason_code != ReasonCode.DISCONNECT_WITH_WILL:
            self.will = None  # MQTT-3.14.4-3: a normal DISCONNECT discards the will
        self._move(_Input.DISCONNECT_RECEIVED)
        self._fail()
        return p

    # ----------------------------------------------------------- connecting and closing

    def accept(self, *, session_present: bool, assigned_client_identifier: str | None = None,
               response_information: str | None = None) -> bytes:
        """CONNACK for the CONNECT event: the connection is up, keep alive counting from
        the CONNECT's arrival. `response_information` goes only to a v5 client that asked."""
        c = self._connect
        if c is None or self._state is not ServerState.CONNECTING:
            raise LocalProtocolError(f"accept in state {self._state.value}")
        self._move(_Input.ACCEPTED)
        self._connect = None
        props = EMPTY_PROPERTIES
        if self.protocol_level == 5:
            s = self.settings
            props = Properties(
                receive_maximum=s.receive_maximum,
                maximum_packet_size=s.max_packet_size,
                topic_alias_maximum=s.topic_alias_maximum,
                assigned_client_identifier=assigned_client_identifier,
                server_keep_alive=self.keep_alive if self.keep_alive != c.keep_alive else None,
                retain_available=None if s.retain_available else 0,
                response_information=response_information if c.properties.request_response_information == 1 else None,
            )
        return encode(Connack(session_present=session_present, reason_code=ReasonCode.SUCCESS, properties=props),
                      self.protocol_level)

    def close(self, reason_code: int | None = None) -> bytes:
        """We end the connection: the bytes that say why, for the state we are in.

        Before a CONNECT was understood, only an unsupported version (answered in
        3.1.1, MQTT-3.1.2-2) or a bad v5 CONNECT gets a CONNACK; a refused CONNECT gets
        its CONNACK; a connected v5 client a DISCONNECT; anything else nothing."""
        state = self._state
        self._move(_Input.CLOSED)
        self._fail()
        if reason_code is None:
            return b""
        if state is ServerState.AWAITING_CONNECT:
            if reason_code == ReasonCode.UNSUPPORTED_PROTOCOL_VERSION:
                return encode(Connack(reason_code=reason_code), 4)
            if self._decoder is not None and self._decoder.protocol_level == 5:  # never shed before CONNECT
                return encode(Connack(reason_code=reason_code), 5)
            return b""
        if state is ServerState.CONNECTING:
            return encode(Connack(reason_code=reason_code), self.protocol_level)
        if state is ServerState.CONNECTED and self.protocol_level == 5:
            return encode(Disconnect(reason_code=reason_code), 5)
        return b""

    def take_will(self) -> Will | None:
        """The will, for the broker to publish or drop; the connection forgets it."""
        will, self.will = self.will, None
        return will

    # ----------------------------------------------------------- acknowledging the client

    def puback(self, packet_id: int, reason_code: int = ReasonCode.SUCCESS) -> bytes:
        return _ack(0x40, packet_id, reason_code, PUBACK_REASONS, self.protocol_level)

    def pubrec(self, packet_id: int, reason_code: int = ReasonCode.SUCCESS) -> bytes:
        """PUBREC for a QoS 2 PUBLISH; unless it refuses the message, the packet id
        now waits for its PUBREL (and counts against the receive maximum)."""
        if reason_code < 0x80:
            rare = self._rare
            if rare is None:
                rare = self._rare = _Rare()
            rare.qos2_in.add(packet_id)
        return _ack(0x50, packet_id, reason_code, PUBACK_REASONS, self.protocol_level)

    def pubcomp(self, packet_id: int, known: bool = True) -> bytes:
        reason = ReasonCode.SUCCESS if known else ReasonCode.PACKET_IDENTIFIER_NOT_FOUND
        return _ack(0x70, packet_id, reason, PUBREL_REASONS, self.protocol_level)

    def suback(self, packet_id: int, reason_codes: Iterable[int], properties: Properties = EMPTY_PROPERTIES) -> bytes:
        return encode(Suback(packet_id=packet_id, reason_codes=tuple(reason_codes), properties=properties), self.protocol_level)

    def unsuback(self, packet_id: int, reason_codes: Iterable[int]) -> bytes:
        return encode(Unsuback(packet_id=packet_id, reason_codes=tuple(reason_codes)), self.protocol_level)

    def pingresp(self) -> bytes:
        return _PINGRESP

    def resume_qos2(self, packet_ids: Iterable[int]) -> None:
        """A resumed session's QoS 2 publishes still waiting for their PUBREL."""
        ids = set(packet_ids)
        if ids:
            if self._rare is None:
                self._rare = _Rare()
            self._rare.qos2_in = ids

    # ----------------------------------------------------------- publishing to the client

    @property
    def window_full(self) -> bool:
        """The client's receive maximum is reached: QoS 1/2 messages must wait."""
        inflight = self._inflight
        return inflight is not None and len(inflight) >= self.send_window

    @property
    def inflight_count(self) -> int:
        return len(self._inflight) if self._inflight is not None else 0

    def allocate_packet_id(self) -> int:
        """A free packet id for a QoS 1/2 PUBLISH, now inflight until acknowledged."""
        inflight = self._inflight
        if inflight is None:
            inflight = self._inflight = {}
        if len(inflight) >= 65535:
            raise LocalProtocolError("no free packet identifier")
        pid = self._next_packet_id
        while pid in inflight:
            pid = pid + 1 if pid < 65535 else 1
        self._next_packet_id = pid + 1 if pid < 65535 else 1
        inflight[pid] = False
        return pid

    def resume_inflight(self, packet_id: int, pubrel_sent: bool) -> None:
        """A resumed session's unacknowledged PUBLISH (or PUBREL) keeps its packet id."""
        inflight = self._inflight
        if inflight is None:
            inflight = self._inflight = {}
        inflight[packet_id] = pubrel_sent

    def release_packet_id(self, packet_id: int) -> None:
        """The caller dropped an inflight message (expired before it was resent)."""
        if self._inflight is not None:
            self._inflight.pop(packet_id, None)

    def publish(self, topic: str, payload: bytes, qos: int, retain: bool, packet_id: int | None,
                properties: Properties = EMPTY_PROPERTIES, dup: bool = False) -> bytes | None:
        """PUBLISH bytes for this client, with a topic alias where it allows them; None
        when the packet is larger than the client accepts (MQTT-3.1.2-25: dropped as if
        delivered, its packet id freed)."""
        level = self.protocol_level
        new_alias: tuple[str, int] | None = None  # set once the client is sure to see it
        if self.topic_alias_out_max and not dup and level == 5:
            if self._rare is None:
                self._rare = _Rare()
            aliases = self._rare.outbound
            alias = aliases.get(topic)
            if alias is not None:
                properties = replace(properties, topic_alias=alias)
                topic = ""
            elif len(aliases) < self.topic_alias_out_max:
                new_alias = (topic, len(aliases) + 1)
                properties = replace(properties, topic_alias=new_alias[1])
        if properties is EMPTY_PROPERTIES:
            data = encode_plain_publish(topic, payload, qos, retain, dup, packet_id if qos else None, level)
        else:
            data = encode(Publish(topic=topic, payload=payload, qos=qos, retain=retain, dup=dup,
                                  packet_id=packet_id if qos else None, properties=properties), level)
        limit = self.client_max_packet
        if limit is not None and len(data) > limit:
            # Never sent, so an alias it would have set is not set [MQTT-3.1.2-25].
            if packet_id is not None:
                self.release_packet_id(packet_id)
            return None
        if new_alias is not None:
            assert self._rare is not None
            self._rare.outbound[new_alias[0]] = new_alias[1]
        return data

    def fits(self, data: bytes) -> bool:
        """Whether the client accepts a packet this long (its v5 Maximum Packet Size)."""
        limit = self.client_max_packet
        return limit is None or len(data) <= limit

    def pubrel(self, packet_id: int) -> bytes:
        """PUBREL for a PUBREC (or a resumed exchange). For a packet id not inflight:
        PUBREL 0x92 on v5, nothing on 3.1.1 (it has no way to say so)."""
        inflight = self._inflight
        if inflight is not None and packet_id in inflight:
            inflight[packet_id] = True
            return _ack(0x62, packet_id, ReasonCode.SUCCESS, PUBREL_REASONS, self.protocol_level)
        if self.protocol_level == 5:
            return _ack(0x62, packet_id, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND, PUBREL_REASONS, 5)
        return b""


def _ack(first: int, packet_id: int, reason_code: int, allowed: frozenset[int], level: int) -> bytes:
    """PUBACK/PUBREC/PUBREL/PUBCOMP without properties: the bytes `encode` gives for the
    packet, without building it (one per QoS 1/2 message, in both directions)."""
    if not 0 < packet_id <= 0xFFFF:
        raise LocalProtocolError(f"packet id must be 1..65535, not {packet_id!r}")
    if level < 5 or reason_code == 0:  # MQTT-3.4.2.1: a 0 reason code may be left out
        return bytes((first, 2, packet_id >> 8, packet_id & 0xFF))
    if reason_code not in allowed:
        raise LocalProtocolError(f"reason code 0x{reason_code:02X} is not allowed here")
    return bytes((first, 3, packet_id >> 8, packet_id & 0xFF, reason_code))
