"""The sans-I/O server connection (mqtt.server): every flow fed whole and split at every
byte offset, keep alive driven by `now`, the limits and the 3.1.1/5.0 differences.

A `Script` plays a client: it feeds bytes into a fresh `ServerConnection`, answers each
event the way a broker would (accept a CONNECT, acknowledge a PUBLISH) and records the
events and the bytes the server sent, decoded. Feeding the same bytes in two pieces,
cut anywhere, must give the same record.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqtt import (
    Auth,
    Connack,
    Connect,
    Decoder,
    Disconnect,
    LocalProtocolError,
    Packet,
    Pingreq,
    Pingresp,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    ReasonCode,
    Suback,
    Subscribe,
    Subscription,
    Unsuback,
    Unsubscribe,
    Will,
    encode,
)
from mqtt.server import (
    ConnectRefused,
    Event,
    ProtocolViolation,
    PublishReleased,
    PublishRepeated,
    ServerConnection,
    ServerSettings,
    ServerState,
    TimedOut,
)


def wire(level: int, *packets: Packet) -> bytes:
    return b"".join(encode(p, level) for p in packets)


def decode_all(data: bytes, level: int) -> list[Packet]:
    """What a client of `level` reads from `data` (a CONNACK first tells it the level)."""
    decoder = Decoder(role="client", protocol_level=level)
    decoder.feed(data)
    return list(decoder)


@dataclass
class Script:
    """A broker's simple answers to the machine's events, and what it saw and sent."""

    settings: ServerSettings = field(default_factory=ServerSettings)
    now: float = 0.0
    conn: ServerConnection = field(init=False)
    events: list[Event] = field(default_factory=list)
    sent: bytearray = field(default_factory=bytearray)

    def __post_init__(self) -> None:
        self.conn = ServerConnection(self.settings, self.now)

    def feed(self, data: bytes) -> None:
        self.conn.receive_data(data, self.now)
        self.drain()

    def drain(self) -> None:
        conn = self.conn
        while (event := conn.next_event()) is not None:
            self.events.append(event)
            self.sent += self.answer(event)

    def answer(self, event: Event) -> bytes:
        conn = self.conn
        if isinstance(event, Connect):
            out = conn.accept(session_present=False,
                              assigned_client_identifier=None if event.client_id else "assigned-1")
            self.conn.receive_data(b"", self.now)  # what came behind the CONNECT is now decodable
            return out
        if isinstance(event, Publish):
            if event.qos == 1:
                return conn.puback(event.packet_id or 0)
            if event.qos == 2:
                return conn.pubrec(event.packet_id or 0)
            return b""
        if isinstance(event, PublishRepeated):
            return conn.pubrec(event.packet_id)
        if isinstance(event, PublishReleased):
            return conn.pubcomp(event.packet_id, event.known)
        if isinstance(event, Subscribe):
            return conn.suback(event.packet_id, [s.qos for s in event.subscriptions])
        if isinstance(event, Unsubscribe):
            return conn.unsuback(event.packet_id, [ReasonCode.SUCCESS] * len(event.topic_filters))
        if isinstance(event, Pingreq):
            return conn.pingresp()
        if isinstance(event, Pubrec):
            return conn.pubrel(event.packet_id)
        if isinstance(event, (ProtocolViolation, ConnectRefused)):
            return conn.close(event.reason_code)
        return b""

    def replies(self) -> list[Packet]:
        return decode_all(bytes(self.sent), self.conn.protocol_level)


def play(data: bytes, settings: ServerSettings | None = None) -> Script:
    script = Script(settings or ServerSettings())
    script.feed(data)
    return script


def assert_same_at_every_split(data: bytes, settings: ServerSettings | None = None) -> Script:
    """Feed `data` whole, then cut in two at every offset: same events, same replies."""
    whole = play(data, settings)
    for cut in range(len(data) + 1):
        script = Script(settings or ServerSettings())
        script.feed(data[:cut])
        script.feed(data[cut:])
        assert script.events == whole.events, f"cut at {cut}"
        assert script.sent == whole.sent, f"cut at {cut}"
    return whole


def connect(level: int = 5, *, client_id: str = "c1", clean_start: bool = True, keep_alive: int = 60,
            will: Will | None = None, properties: Properties = Properties(), username: str | None = None,
            password: bytes | None = None) -> Connect:
    return Connect(client_id=client_id, clean_start=clean_start, keep_alive=keep_alive, will=will,
                   properties=properties, protocol_level=level, username=username, password=password)


def last_reason(script: Script) -> int:
    """The reason code of the last event, a violation or refusal."""
    event = script.events[-1]
    assert isinstance(event, (ProtocolViolation, ConnectRefused)), event
    return event.reason_code


def only_packet(data: bytes | None, level: int) -> Publish:
    assert data is not None
    (packet,) = decode_all(data, level)
    assert isinstance(packet, Publish)
    return packet


# ----------------------------------------------------------------- flows, split everywhere


@pytest.mark.parametrize("level", [3, 4, 5])
def test_connect_publish_qos0_1_2_subscribe_ping_disconnect(level):
    data = wire(
        level,
        connect(level, keep_alive=30),
        Subscribe(packet_id=1, subscriptions=(Subscription("a/#", qos=2),)),
        Publish(topic="a/0", payload=b"zero"),
        Publish(topic="a/1", payload=b"one", qos=1, packet_id=2),
        Publish(topic="a/2", payload=b"two", qos=2, packet_id=3),
        Pingreq(),
        Pubrel(packet_id=3),
        Unsubscribe(packet_id=4, topic_filters=("a/#",)),
        Disconnect(),
    )
    script = assert_same_at_every_split(data)
    kinds = [type(e).__name__ for e in script.events]
    assert kinds == ["Connect", "Subscribe", "Publish", "Publish", "Publish", "Pingreq", "PublishReleased",
                     "Unsubscribe", "Disconnect"]
    assert script.events[6] == PublishReleased(3, True)
    replies = script.replies()
    assert [type(p) for p in replies] == [Connack, Suback, Puback, Pubrec, Pingresp, Pubcomp, Unsuback]
    assert replies[0].reason_code == ReasonCode.SUCCESS
    assert replies[5].reason_code == ReasonCode.SUCCESS
    assert script.conn.state is ServerState.CLOSED
    assert script.conn.take_will() is None


@pytest.mark.parametrize("level", [3, 4, 5])
def test_shedding_the_decoder_while_idle_changes_nothing(level):
    # An idle client's connection lets go of its decoder (`shed`, when parked); the next
    # bytes make a new one. Shed after every feed, cut anywhere: the same events and
    # replies, the protocol level (3.1's DUP PUBREL, v5 properties) and the packet size
    # limit kept, and a packet begun before the shed still whole.
    settings = ServerSettings(max_packet_size=200)
    data = wire(
        level,
        connect(level, keep_alive=30),
        Publish(topic="a/1", payload=b"one", qos=1, packet_id=2,
                properties=Properties(user_properties=(("k", "v"),)) if level == 5 else Properties()),
        Publish(topic="a/2", payload=b"two", qos=2, packet_id=3),
        Pingreq(),
    )
    # 3.1 resends a PUBREL with DUP set (0x6A), which only a level-3 decoder takes.
    data += (b"\x6a\x02\x00\x03" if level == 3 else wire(level, Pubrel(packet_id=3)))
    data += wire(level, Publish(topic="big", payload=b"x" * 300))
    whole = play(data, settings)
    assert last_reason(whole) == ReasonCode.PACKET_TOO_LARGE
    for cut in range(len(data) + 1):
        script = Script(settings)
        script.feed(data[:cut])
        script.conn.shed()
        script.feed(data[cut:])
        assert script.events == whole.events, f"cut at {cut}"
        assert script.sent == whole.sent, f"cut at {cut}"
    script = Script(settings)
    script.feed(wire(level, connect(level)))
    script.conn.shed()
    assert script.conn._decoder is None  # connected, nothing buffered: let go
    script.feed(wire(level, Pingreq())[:1])
    script.conn.shed()
    assert script.conn._decoder is not None  # half a packet: kept
    script.feed(wire(level, Pingreq())[1:])
    assert type(script.events[-1]) is Pingreq


def test_packets_behind_a_connect_wait_for_accept():
    conn = ServerConnection(ServerSettings(), 0.0)
    conn.receive_data(wire(5, connect(), Pingreq()), 0.0)
    event = conn.next_event()
    assert isinstance(event, Connect) and conn.state is ServerState.CONNECTING
    assert conn.next_event() is None  # the PINGREQ is held until the CONNECT is answered
    conn.accept(session_present=True)
    assert isinstance(conn.next_event(), Pingreq)


def test_every_shorter_prefix_of_a_connect_asks_for_more():
    data = wire(5, connect(will=Will("w", b"x"), username="u", password=b"p"))
    for end in range(len(data)):
        conn = ServerConnection(ServerSettings(), 0.0)
        conn.receive_data(data[:end], 0.0)
        assert conn.next_event() is None
        assert conn.state is ServerState.AWAITING_CONNECT


def test_outbound_qos1_and_qos2_flows_and_the_window():
    settings = ServerSettings(max_inflight=32)
    script = play(wire(5, connect(properties=Properties(receive_maximum=2))), settings)
    conn = script.conn
    a = conn.allocate_packet_id()
    b = conn.allocate_packet_id()
    assert (a, b) == (1, 2) and conn.window_full  # the client's receive maximum, not ours
    out = conn.publish("t", b"1", 1, False, a)
    assert out is not None and decode_all(out, 5) == [Publish(topic="t", payload=b"1", qos=1, packet_id=1)]
    script.feed(wire(5, Puback(packet_id=a)))
    assert not conn.window_full and conn.inflight_count == 1
    # QoS 2: PUBREC -> PUBREL -> PUBCOMP; the id stays taken until PUBCOMP.
    script.feed(wire(5, Pubrec(packet_id=b)))
    assert decode_all(bytes(script.sent), 5)[-1] == Pubrel(packet_id=b)
    assert conn.inflight_count == 1
    script.feed(wire(5, Pubcomp(packet_id=b)))
    assert conn.inflight_count == 0
    # PUBREC for an id never sent: PUBREL 0x92 on v5.
    assert decode_all(conn.pubrel(99), 5) == [Pubrel(packet_id=99, reason_code=ReasonCode.PACKET_IDENTIFIER_NOT_FOUND)]


def test_a_refusing_pubrec_ends_the_outbound_exchange():
    script = play(wire(5, connect()))
    conn = script.conn
    pid = conn.allocate_packet_id()
    script.feed(wire(5, Pubrec(packet_id=pid, reason_code=ReasonCode.NOT_AUTHORIZED)))
    assert conn.inflight_count == 0


def test_packet_ids_skip_those_in_use_and_wrap():
    conn = play(wire(5, connect())).conn
    conn.resume_inflight(1, False)
    conn.resume_inflight(3, True)
    assert [conn.allocate_packet_id() for _ in range(2)] == [2, 4]
    conn.release_packet_id(2)
    assert conn.inflight_count == 3


def test_packet_ids_wrap_after_65535_and_skip_those_still_in_use():
    conn = play(wire(5, connect())).conn
    conn.resume_inflight(65535, False)
    conn.resume_inflight(1, True)
    ids = [conn.allocate_packet_id() for _ in range(65533)]
    assert ids == list(range(2, 65535))
    for pid in ids:
        conn.release_packet_id(pid)
    assert conn.allocate_packet_id() == 2  # 65535, then 1, are still taken


def test_v311_has_no_way_to_say_packet_id_not_found():
    conn = play(wire(4, connect(4))).conn
    assert conn.pubrel(7) == b""
    assert decode_all(conn.pubcomp(7, known=False), 4) == [Pubcomp(packet_id=7)]


def test_qos2_retransmission_is_not_routed_twice_and_pubrel_of_an_unknown_id():
    data = wire(
        5, connect(),
        Publish(topic="q", payload=b"x", qos=2, packet_id=7),
        Publish(topic="q", payload=b"x", qos=2, packet_id=7, dup=True),
        Pubrel(packet_id=7),
        Pubrel(packet_id=8),
    )
    script = assert_same_at_every_split(data)
    assert script.events[2:] == [PublishRepeated(7), PublishReleased(7, True), PublishReleased(8, False)]
    replies = script.replies()
    assert replies[1:] == [Pubrec(packet_id=7), Pubrec(packet_id=7), Pubcomp(packet_id=7),
                           Pubcomp(packet_id=8, reason_code=ReasonCode.PACKET_IDENTIFIER_NOT_FOUND)]


def test_v31_resent_pubrel_with_dup_is_completed():
    """A 3.1 client sets DUP on a resent PUBREL (0x6A): the exchange completes."""
    data = wire(3, connect(3), Publish(topic="a", payload=b"x", qos=2, packet_id=9)) + b"\x6a\x02\x00\x09"
    script = assert_same_at_every_split(data)
    assert script.events[-1] == PublishReleased(9, True)
    assert [type(p) for p in script.replies()] == [Connack, Pubrec, Pubcomp]


@pytest.mark.parametrize("level", [4, 5])
def test_pubrel_with_dup_is_malformed_from_311_on(level):
    data = wire(level, connect(level), Publish(topic="a", payload=b"x", qos=2, packet_id=9)) + b"\x6a\x02\x00\x09"
    script = assert_same_at_every_split(data)
    assert last_reason(script) == ReasonCode.MALFORMED_PACKET


def test_a_refused_qos2_publish_does_not_wait_for_pubrel():
    conn = play(wire(5, connect())).conn
    conn.receive_data(wire(5, Publish(topic="q", qos=2, packet_id=5)), 0.0)
    assert isinstance(conn.next_event(), Publish)
    conn.pubrec(5, ReasonCode.NOT_AUTHORIZED)
    conn.receive_data(wire(5, Publish(topic="q", qos=2, packet_id=5)), 0.0)
    assert isinstance(conn.next_event(), Publish)  # not a repeat: it was never taken


def test_receive_maximum_overflow_is_0x93():
    settings = ServerSettings(receive_maximum=2)
    data = wire(5, connect(), *(Publish(topic="q", qos=2, packet_id=i) for i in (1, 2, 3)))
    script = assert_same_at_every_split(data, settings)
    assert script.events[-1] == ProtocolViolation(ReasonCode.RECEIVE_MAXIMUM_EXCEEDED, "receive maximum exceeded")
    assert script.replies()[-1] == Disconnect(reason_code=ReasonCode.RECEIVE_MAXIMUM_EXCEEDED)


def test_a_resumed_sessions_qos2_ids_count_against_receive_maximum():
    script = play(wire(5, connect()), ServerSettings(receive_maximum=1))
    script.conn.resume_qos2([9])
    script.feed(wire(5, Publish(topic="q", qos=2, packet_id=9)))
    assert script.events[-1] == PublishRepeated(9)
    script.feed(wire(5, Publish(topic="q", qos=2, packet_id=10)))
    assert last_reason(script) == ReasonCode.RECEIVE_MAXIMUM_EXCEEDED


@pytest.mark.parametrize("level, reply", [(5, [Disconnect(reason_code=ReasonCode.PACKET_TOO_LARGE)]), (4, [])])
def test_packet_too_large_is_0x95(level, reply):
    settings = ServerSettings(max_packet_size=64)
    data = wire(level, connect(level), Publish(topic="big", payload=b"x" * 100))
    script = assert_same_at_every_split(data, settings)
    assert last_reason(script) == ReasonCode.PACKET_TOO_LARGE
    assert script.replies()[1:] == reply
    assert script.conn.state is ServerState.CLOSED


def test_nothing_follows_a_violation():
    script = play(wire(5, connect(), Publish(topic="a", retain=True), Pingreq()),
                  ServerSettings(retain_available=False))
    assert [type(e).__name__ for e in script.events] == ["Connect", "ProtocolViolation"]
    assert last_reason(script) == ReasonCode.RETAIN_NOT_SUPPORTED
    script.feed(wire(5, Pingreq()))
    assert len(script.events) == 2


# ----------------------------------------------------------------- topic aliases


def test_inbound_topic_alias_is_resolved_and_checked():
    data = wire(
        5, connect(),
        Publish(topic="long/topic/name", payload=b"1", properties=Properties(topic_alias=3)),
        Publish(topic="", payload=b"2", properties=Properties(topic_alias=3)),
    )
    script = assert_same_at_every_split(data, ServerSettings(topic_alias_maximum=4))
    publishes = [e for e in script.events if isinstance(e, Publish)]
    assert [(e.topic, e.payload) for e in publishes] == [("long/topic/name", b"1"), ("long/topic/name", b"2")]


@pytest.mark.parametrize("publish, code", [
    (Publish(topic="t", properties=Properties(topic_alias=5)), ReasonCode.TOPIC_ALIAS_INVALID),
    (Publish(topic="", properties=Properties(topic_alias=2)), ReasonCode.PROTOCOL_ERROR),
])
def test_inbound_topic_alias_errors(publish, code):
    script = play(wire(5, connect(), publish), ServerSettings(topic_alias_maximum=4))
    assert isinstance(script.events[-1], ProtocolViolation) and last_reason(script) == code


def test_outbound_topic_aliases_up_to_the_clients_maximum():
    conn = play(wire(5, connect(properties=Properties(topic_alias_maximum=2)))).conn
    packets = [only_packet(conn.publish(topic, b"", 0, False, None), 5) for topic in ("a", "a", "b", "c", "b")]
    assert [(p.topic, p.properties.topic_alias) for p in packets] == [
        ("a", 1), ("", 1), ("b", 2), ("c", None), ("", 2)]
    # A resent message (DUP) carries its topic: the client may have lost the alias with the session.
    dup = only_packet(conn.publish("a", b"", 1, False, conn.allocate_packet_id(), dup=True), 5)
    assert (dup.topic, dup.properties.topic_alias) == ("a", None)


def test_no_outbound_aliases_unless_the_client_allows_them():
    conn = play(wire(5, connect())).conn
    assert conn.topic_alias_out_max == 0
    assert only_packet(conn.publish("a", b"", 0, False, None), 5).properties.topic_alias is None


def test_outbound_packet_larger_than_the_client_takes_is_dropped_and_its_id_freed():
    conn = play(wire(5, connect(properties=Properties(maximum_packet_size=32)))).conn
    pid = conn.allocate_packet_id()
    assert conn.publish("t", b"x" * 64, 1, False, pid) is None
    assert conn.inflight_count == 0
    assert conn.publish("t", b"x", 1, False, conn.allocate_packet_id()) is not None


def test_a_packet_too_large_for_the_client_sets_no_topic_alias():
    """MQTT-3.1.2-25: the dropped PUBLISH is never seen, so neither is the alias it
    would have set: the next PUBLISH on that topic sets it (topic name and alias)."""
    props = Properties(maximum_packet_size=20, topic_alias_maximum=5)
    conn = play(wire(5, connect(properties=props))).conn
    assert conn.publish("s/1", b"x" * 100, 1, False, conn.allocate_packet_id()) is None
    first = only_packet(conn.publish("s/1", b"a", 1, False, conn.allocate_packet_id()), 5)
    assert (first.topic, first.properties.topic_alias) == ("s/1", 1)
    second = only_packet(conn.publish("s/1", b"b", 1, False, conn.allocate_packet_id()), 5)
    assert (second.topic, second.properties.topic_alias) == ("", 1)


# ----------------------------------------------------------------- time


def test_keep_alive_deadline_follows_received_bytes():
    script = Script(ServerSettings(connect_timeout=5.0))
    conn = script.conn
    assert conn.deadline == 5.0
    script.now = 1.0
    script.feed(wire(5, connect(keep_alive=10)))
    assert conn.deadline == 1.0 + 15.0
    assert conn.handle_timer(15.9) is None
    script.now = 12.0
    script.feed(wire(5, Pingreq()))
    assert conn.deadline == 27.0
    assert conn.handle_timer(26.99) is None
    assert conn.handle_timer(27.0) == TimedOut(during_connect=False)
    assert decode_all(conn.close(ReasonCode.KEEP_ALIVE_TIMEOUT), 5) == [Disconnect(reason_code=ReasonCode.KEEP_ALIVE_TIMEOUT)]
    assert conn.deadline == math.inf


def test_connect_timeout_and_no_keep_alive():
    conn = ServerConnection(ServerSettings(connect_timeout=3.0), 100.0)
    assert conn.handle_timer(102.9) is None
    assert conn.handle_timer(103.0) == TimedOut(during_connect=True)
    assert conn.close() == b""
    script = play(wire(4, connect(4, keep_alive=0)))
    assert script.conn.deadline == math.inf


def test_a_connect_being_handled_has_no_deadline():
    conn = ServerConnection(ServerSettings(connect_timeout=1.0), 0.0)
    conn.receive_data(wire(5, connect()), 0.5)
    assert isinstance(conn.next_event(), Connect)
    assert conn.deadline == math.inf  # the handshake bounds its own waits


@pytest.mark.parametrize("asked, granted, told", [(0, 30, 30), (100, 30, 30), (20, 20, None)])
def test_v5_keep_alive_is_capped_and_the_client_told(asked, granted, told):
    script = play(wire(5, connect(keep_alive=asked)), ServerSettings(max_keepalive=30))
    assert script.conn.keep_alive == granted
    (connack,) = script.replies()
    assert isinstance(connack, Connack) and connack.properties.server_keep_alive == told


@pytest.mark.parametrize("level", [3, 4])
@pytest.mark.parametrize("asked", [0, 31, 100])
def test_v3_keep_alive_above_the_maximum_is_refused_with_return_code_2(level, asked):
    """3.1/3.1.1 have no Server Keep Alive: a longer keep alive (or none) would outlast
    the operator's maximum, so the CONNECT is refused with 2 (identifier rejected), as
    Mosquitto 2.0 does (handle_connect.c, max_keepalive)."""
    script = assert_same_at_every_split(wire(level, connect(level, keep_alive=asked)), ServerSettings(max_keepalive=30))
    assert last_reason(script) == ReasonCode.CLIENT_IDENTIFIER_NOT_VALID
    assert "maximum" in script.events[-1].message
    assert bytes(script.sent) == b"\x20\x02\x00\x02"
    assert script.conn.state is ServerState.CLOSED


@pytest.mark.parametrize("level", [3, 4])
def test_v3_keep_alive_within_the_maximum_or_without_one_is_kept(level):
    assert play(wire(level, connect(level, keep_alive=30)), ServerSettings(max_keepalive=30)).conn.keep_alive == 30
    assert play(wire(level, connect(level, keep_alive=0)), ServerSettings()).conn.keep_alive == 0
    assert play(wire(level, connect(level, keep_alive=65535)), ServerSettings()).conn.keep_alive == 65535


# ----------------------------------------------------------------- CONNECT and the versions


def test_v5_connack_says_what_the_server_grants():
    settings = ServerSettings(receive_maximum=10, max_packet_size=5000, topic_alias_maximum=7, retain_available=False)
    script = play(wire(5, connect(client_id="", properties=Properties(request_response_information=1))), settings)
    (connack,) = script.replies()
    assert isinstance(connack, Connack)
    props = connack.properties
    assert (props.receive_maximum, props.maximum_packet_size, props.topic_alias_maximum, props.retain_available,
            props.assigned_client_identifier) == (10, 5000, 7, 0, "assigned-1")


def test_v311_connack_has_no_properties():
    script = play(wire(4, connect(4)))
    assert script.replies() == [Connack(session_present=False, reason_code=0)]


@pytest.mark.parametrize("level, clean_start, refused", [
    (5, False, False), (5, True, False), (4, True, False), (4, False, True), (3, True, True),
])
def test_empty_client_id(level, clean_start, refused):
    script = play(wire(level, connect(level, client_id="", clean_start=clean_start)))
    if refused:
        assert script.events == [ConnectRefused(ReasonCode.CLIENT_IDENTIFIER_NOT_VALID, "empty client identifier")]
        assert script.replies() == [Connack(reason_code=ReasonCode.CLIENT_IDENTIFIER_NOT_VALID)]
    else:
        assert isinstance(script.events[0], Connect)


def test_enhanced_authentication_and_retained_wills_are_refused():
    auth = play(wire(5, connect(properties=Properties(authentication_method="SCRAM"))))
    assert auth.replies() == [Connack(reason_code=ReasonCode.BAD_AUTHENTICATION_METHOD)]
    will = play(wire(5, connect(will=Will("w", b"x", retain=True))), ServerSettings(retain_available=False))
    assert will.replies() == [Connack(reason_code=ReasonCode.RETAIN_NOT_SUPPORTED)]


@pytest.mark.parametrize("level, reply", [(5, [Connack(reason_code=ReasonCode.MALFORMED_PACKET)]), (4, [])])
def test_malformed_connect_answers_only_a_v5_client(level, reply):
    data = bytearray(wire(level, connect(level, client_id="abc")))
    data[-4] = 0x10  # the client id's length runs past the packet's end
    script = assert_same_at_every_split(bytes(data))
    assert last_reason(script) == ReasonCode.MALFORMED_PACKET
    assert decode_all(bytes(script.sent), 5) == reply


def test_unsupported_protocol_version_is_answered_in_311():
    connect_v6 = bytearray(wire(4, connect(4)))
    connect_v6[8] = 6  # the protocol level byte of "\x00\x04MQTT"
    script = play(bytes(connect_v6))
    assert last_reason(script) == ReasonCode.UNSUPPORTED_PROTOCOL_VERSION
    assert decode_all(bytes(script.sent), 4) == [Connack(reason_code=ReasonCode.UNSUPPORTED_PROTOCOL_VERSION)]


def test_a_first_packet_other_than_connect_is_closed_without_a_word():
    script = play(wire(5, Pingreq()))
    assert [type(e) for e in script.events] == [ProtocolViolation]
    assert last_reason(script) == ReasonCode.PROTOCOL_ERROR
    assert script.sent == b""


@pytest.mark.parametrize("level", [4, 5])
def test_malformed_packet_after_connect(level):
    script = play(wire(level, connect(level)) + b"\x30\x01\x00")  # PUBLISH too short for a topic
    assert last_reason(script) == ReasonCode.MALFORMED_PACKET
    expected = [Disconnect(reason_code=ReasonCode.MALFORMED_PACKET)] if level == 5 else []
    assert script.replies()[1:] == expected


def test_second_connect_and_auth_are_protocol_errors():
    again = play(wire(5, connect(), connect()))
    assert again.events[-1] == ProtocolViolation(ReasonCode.PROTOCOL_ERROR, "second CONNECT on one connection [MQTT-3.1.0-2]")
    auth = play(wire(5, connect(), Auth(reason_code=ReasonCode.REAUTHENTICATE)))
    assert last_reason(auth) == ReasonCode.PROTOCOL_ERROR
    assert auth.replies()[1:] == [Disconnect(reason_code=ReasonCode.PROTOCOL_ERROR)]


@pytest.mark.parametrize("reason, keeps_will", [(ReasonCode.NORMAL_DISCONNECTION, False), (ReasonCode.DISCONNECT_WITH_WILL, True)])
def test_disconnect_and_the_will(reason, keeps_will):
    will = Will("w", b"bye")
    script = play(wire(5, connect(will=will), Disconnect(reason_code=reason)))
    assert (script.conn.take_will() is not None) == keeps_will
    assert script.conn.state is ServerState.CLOSED


def test_a_will_survives_a_dropped_connection_until_taken():
    conn = play(wire(4, connect(4, will=Will("w", b"bye")))).conn
    assert conn.close() == b""
    assert conn.take_will() == Will("w", b"bye") and conn.take_will() is None


def test_session_expiry_zero_cannot_be_raised_on_disconnect():
    script = play(wire(5, connect(), Disconnect(properties=Properties(session_expiry_interval=60))))
    assert last_reason(script) == ReasonCode.PROTOCOL_ERROR
    lowered = play(wire(5, connect(properties=Properties(session_expiry_interval=60)),
                        Disconnect(properties=Properties(session_expiry_interval=0))))
    assert isinstance(lowered.events[-1], Disconnect)


def test_superseded_connect_is_accepted_then_taken_over():
    conn = ServerConnection(ServerSettings(), 0.0)
    conn.receive_data(wire(5, connect()), 0.0)
    assert isinstance(conn.next_event(), Connect)
    out = conn.accept(session_present=False) + conn.close(ReasonCode.SESSION_TAKEN_OVER)
    assert [type(p) for p in decode_all(out, 5)] == [Connack, Disconnect]


def test_calls_out_of_order_are_the_callers_bug():
    conn = ServerConnection(ServerSettings(), 0.0)
    with pytest.raises(LocalProtocolError):
        conn.accept(session_present=False)
    conn.close()
    with pytest.raises(LocalProtocolError):
        conn.accept(session_present=False)


# ----------------------------------------------------------------- any packets, any cuts


_client_packets = st.one_of(
    st.builds(Publish, topic=st.sampled_from(["a", "b/c"]), payload=st.binary(max_size=8), qos=st.just(0)),
    st.builds(lambda pid: Publish(topic="q", payload=b"p", qos=1, packet_id=pid), st.integers(1, 5)),
    st.builds(lambda pid: Publish(topic="q", payload=b"p", qos=2, packet_id=pid), st.integers(1, 5)),
    st.builds(lambda pid: Pubrel(packet_id=pid), st.integers(1, 5)),
    st.builds(lambda pid: Puback(packet_id=pid), st.integers(1, 5)),
    st.builds(lambda pid: Subscribe(packet_id=pid, subscriptions=(Subscription("a/#", qos=1),)), st.integers(1, 5)),
    st.just(Pingreq()),
)


@settings(max_examples=150, deadline=None)
@given(level=st.sampled_from([4, 5]), packets=st.lists(_client_packets, max_size=8),
       cuts=st.lists(st.integers(0, 2000), max_size=4))
def test_any_client_stream_cut_anywhere_gives_the_same_events(level, packets, cuts):
    data = wire(level, connect(level), *packets)
    whole = play(data, ServerSettings(receive_maximum=3))
    script = Script(ServerSettings(receive_maximum=3))
    start = 0
    for cut in sorted(c % (len(data) + 1) for c in cuts) + [len(data)]:
        script.feed(data[start:cut])
        start = cut
    assert script.events == whole.events
    assert script.sent == whole.sent
    # The QoS 2 bookkeeping agrees with the stream: at most receive_maximum ids wait,
    # and a violation ends the events.
    violations = [i for i, e in enumerate(whole.events) if isinstance(e, ProtocolViolation)]
    assert not violations or violations == [len(whole.events) - 1]


@pytest.mark.parametrize("level", [3, 4, 5])
def test_acknowledgements_are_the_encoders_bytes(level):
    # The machine writes acks without building packets (the QoS 1/2 hot path): same bytes.
    conn = play(wire(level, connect(level))).conn
    for pid in (1, 255, 256, 65535):
        for code in (ReasonCode.SUCCESS, ReasonCode.NO_MATCHING_SUBSCRIBERS, ReasonCode.NOT_AUTHORIZED):
            assert conn.puback(pid, code) == encode(Puback(packet_id=pid, reason_code=code), level)
        assert conn.pubcomp(pid, known=False) == encode(
            Pubcomp(packet_id=pid, reason_code=ReasonCode.PACKET_IDENTIFIER_NOT_FOUND), level)
    with pytest.raises(LocalProtocolError):
        conn.puback(0)
    if level == 5:
        with pytest.raises(LocalProtocolError):
            conn.puback(1, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND)  # not a PUBACK reason


@settings(max_examples=300, deadline=None)
@given(level=st.sampled_from([3, 4, 5]),
       garbage=st.one_of(st.binary(max_size=64), st.sampled_from([b"\xe0\x00", b"\xc0\x00\xe0\x00\xc0\x00"])),
       before_connect=st.booleans(),
       cut=st.integers(0, 200))
def test_garbage_in_any_state_ends_in_one_violation_and_never_raises(level, garbage, before_connect, cut):
    # Whatever the bytes, the machine answers with events (never an exception), a
    # violation is the last event, and close() answers in the state it came in.
    data = garbage if before_connect else wire(level, connect(level, keep_alive=5)) + garbage
    script = Script()
    script.feed(data[:cut])
    script.feed(data[cut:])
    ends = [i for i, e in enumerate(script.events) if isinstance(e, (ProtocolViolation, ConnectRefused))]
    assert not ends or ends == [len(script.events) - 1]
    if ends:
        assert script.conn.state is ServerState.CLOSED  # the Script closed it
        assert script.conn.next_event() is None
        assert script.conn.deadline == math.inf
    elif script.events and isinstance(script.events[-1], Disconnect):
        assert script.conn.state is ServerState.CLOSED and script.conn.deadline == math.inf
    elif script.conn.state is ServerState.CONNECTED:
        assert script.conn.deadline == pytest.approx(script.now + 5 * 1.5)
    else:
        assert script.conn.state is ServerState.AWAITING_CONNECT
        assert script.conn.deadline == ServerSettings().connect_timeout
