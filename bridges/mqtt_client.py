"""The client side of one MQTT 3.1.1 / 5.0 connection, sans-I/O, on the project's codec
(`mqtt.Decoder(role="client")`, `mqtt.encode`): what a bridge needs of a client.

Bytes and `now` in (`receive_data`), events out; every send method returns the bytes
to write, so the driver decides when they leave. Our outgoing QoS 1/2 publishes carry
a caller's `token` (the cache queue's sequence number) and come back as `Delivered`
(PUBACK, or PUBCOMP) or `Refused` (a v5 reason code >= 0x80). Incoming publishes come
out as `Arrived`; the driver calls `accept(publish)` once it has taken the message here,
which gives the PUBACK / PUBREC; a QoS 2 message is handed out once per packet id until
its PUBREL.
"""

from __future__ import annotations

from dataclasses import dataclass

from mqtt import (
    Connack,
    Connect,
    Decoder,
    Disconnect,
    Packet,
    Pingreq,
    Pingresp,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Subscription,
    encode,
)


class ClientProtocolError(Exception):
    """The server broke the protocol (or refused us): the connection must end."""


@dataclass(frozen=True, slots=True)
class Connected:
    session_present: bool
    receive_maximum: int


@dataclass(frozen=True, slots=True)
class ConnectRefused:
    reason_code: int


@dataclass(frozen=True, slots=True)
class Delivered:
    token: int


@dataclass(frozen=True, slots=True)
class Refused:
    token: int
    reason_code: int


@dataclass(frozen=True, slots=True)
class Arrived:
    publish: Publish


@dataclass(frozen=True, slots=True)
class Subscribed:
    reason_codes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ServerDisconnected:
    reason_code: int


Event = Connected | ConnectRefused | Delivered | Refused | Arrived | Subscribed | ServerDisconnected


class ClientConnection:
    def __init__(self, *, client_id: str, protocol_level: int = 4, keepalive: int = 30, clean_start: bool = True,
                 session_expiry: int = 0, username: str | None = None, password: str | None = None,
                 max_inflight: int = 32) -> None:
        self.client_id = client_id
        self.protocol_level = protocol_level
        self.keepalive = keepalive
        self.clean_start = clean_start
        self.session_expiry = session_expiry
        self.username = username
        self.password = password
        self.max_inflight = max_inflight
        self.connected = False
        self._decoder = Decoder(role="client", protocol_level=protocol_level)
        self._next_id = 0
        self._outgoing: dict[int, tuple[int, int]] = {}  # packet id -> (token, qos)
        self._qos2_in: set[int] = set()  # PUBREC sent, PUBREL not yet seen
        self._last_sent = 0.0

    # ------------------------------------------------------------------ sending

    def connect(self, now: float) -> bytes:
        props = Properties(session_expiry_interval=self.session_expiry or None) if self.protocol_level == 5 \
            else Properties()
        packet = Connect(self.client_id, clean_start=self.clean_start, keep_alive=self.keepalive,
                         username=self.username, password=self.password.encode() if self.password is not None else None,
                         properties=props, protocol_level=self.protocol_level)
        return self._send(packet, now)

    def can_publish(self) -> bool:
        return self.connected and len(self._outgoing) < self.max_inflight

    def publish(self, token: int, topic: str, payload: bytes, qos: int, retain: bool, now: float,
                properties: Properties | None = None) -> bytes:
        """A PUBLISH; for QoS 1/2 it counts against the window until `Delivered`/`Refused`."""
        packet_id = None
        if qos:
            packet_id = self._allocate_id()
            self._outgoing[packet_id] = (token, qos)
        props = properties if properties is not None and self.protocol_level == 5 else Properties()
        return self._send(Publish(topic, payload, qos, retain, packet_id=packet_id, properties=props), now)

    def subscribe(self, filters: list[tuple[str, int, bool]], now: float) -> bytes:
        """One SUBSCRIBE for (filter, max QoS, no local) triples."""
        subs = tuple(Subscription(f, qos, no_local and self.protocol_level == 5) for f, qos, no_local in filters)
        return self._send(Subscribe(self._allocate_id(), subs), now)

    def accept(self, publish: Publish, now: float) -> bytes:
        """The driver took an arrived message: its acknowledgement."""
        if publish.qos == 1:
            assert publish.packet_id is not None
            return self._send(Puback(publish.packet_id), now)
        if publish.qos == 2:
            assert publish.packet_id is not None
            return self._send(Pubrec(publish.packet_id), now)
        return b""

    def disconnect(self, now: float) -> bytes:
        self.connected = False
        return self._send(Disconnect(0), now)

    def ping_due(self) -> float | None:
        """When a PINGREQ is due (driver's `now` scale), None without keep alive."""
        return self._last_sent + self.keepalive * 0.75 if self.keepalive and self.connected else None

    def ping(self, now: float) -> bytes:
        return self._send(Pingreq(), now)

    def inflight_tokens(self) -> list[int]:
        return [token for token, _ in self._outgoing.values()]

    # ------------------------------------------------------------------ receiving

    def receive_data(self, data: bytes, now: float) -> tuple[list[Event], bytes]:
        """Events for `data`, and the bytes to answer at once (PUBREL, PUBCOMP).
        Raises ClientProtocolError when the server broke the protocol."""
        self._decoder.feed(data)
        events: list[Event] = []
        out: list[bytes] = []
        try:
            for packet in self._decoder:
                self._handle(packet, events, out, now)
        except ClientProtocolError:
            raise
        except Exception as exc:  # RemoteProtocolError and kin: a broken server
            raise ClientProtocolError(f"bad packet from the server: {exc}") from None
        return events, b"".join(out)

    def _handle(self, packet: Packet, events: list[Event], out: list[bytes], now: float) -> None:
        if isinstance(packet, Connack):
            if packet.reason_code >= 0x80:
                events.append(ConnectRefused(packet.reason_code))
                return
            self.connected = True
            receive_max = packet.properties.receive_maximum or 65535
            self.max_inflight = min(self.max_inflight, receive_max)
            events.append(Connected(packet.session_present, receive_max))
        elif isinstance(packet, Publish):
            if packet.qos == 2 and packet.packet_id in self._qos2_in:
                out.append(self._send(Pubrec(packet.packet_id), now))  # a resend: taken already
                return
            if packet.qos == 2:
                assert packet.packet_id is not None
                self._qos2_in.add(packet.packet_id)
            events.append(Arrived(packet))
        elif isinstance(packet, Pubrel):
            self._qos2_in.discard(packet.packet_id)
            out.append(self._send(Pubcomp(packet.packet_id), now))
        elif isinstance(packet, Puback):
            self._finish(packet.packet_id, packet.reason_code, events)
        elif isinstance(packet, Pubrec):
            if packet.reason_code >= 0x80:
                self._finish(packet.packet_id, packet.reason_code, events)
            elif packet.packet_id in self._outgoing:
                out.append(self._send(Pubrel(packet.packet_id), now))
        elif isinstance(packet, Pubcomp):
            self._finish(packet.packet_id, packet.reason_code, events)
        elif isinstance(packet, Suback):
            events.append(Subscribed(packet.reason_codes))
        elif isinstance(packet, Disconnect):
            self.connected = False
            events.append(ServerDisconnected(packet.reason_code))
        elif isinstance(packet, Pingresp):
            pass  # the keep alive was answered; nothing to report
        else:
            raise ClientProtocolError(f"unexpected {type(packet).__name__} from the server")

    def _finish(self, packet_id: int, reason_code: int, events: list[Event]) -> None:
        entry = self._outgoing.pop(packet_id, None)
        if entry is None:
            return  # an answer to a publish of an earlier connection: nothing waits for it
        token = entry[0]
        events.append(Refused(token, reason_code) if reason_code >= 0x80 else Delivered(token))

    # ------------------------------------------------------------------ internals

    def _send(self, packet: Packet, now: float) -> bytes:
        self._last_sent = now
        return encode(packet, self.protocol_level)

    def _allocate_id(self) -> int:
        for _ in range(65535):
            self._next_id = self._next_id % 65535 + 1
            if self._next_id not in self._outgoing:
                return self._next_id
        raise ClientProtocolError("no packet id free")
