"""The MQTT specifications' normative statements, one row each, against a real node.

Every numbered statement of MQTT 3.1.1 (MQTT-x.y.z-n) and every conformance statement
of MQTT 5.0 (numbered as in the OASIS Standard of 2019) has a row: either the scenario that exercises it (the packet sequence a
client sends and the exact bytes the server must answer, over real sockets to a node
running in this process), or the reason it does not apply to a server (a rule for
clients only, or for a feature meshd does not offer). `test_table_counts` keeps the
numbers of the closing note honest.

The bytes are built by hand here (`_Bytes`), not by the codec under test, so a bug
shared by our encoder and decoder cannot hide. A scenario proves that nothing else
arrived by a marker: a later packet whose bytes must come next.

Where a statement leaves the answer open, the row says what meshd does and which
broker does the same (Mosquitto 2.0.11 was run here on 127.0.0.1 and probed with the
same bytes; EMQX from its documentation and source).
"""

from __future__ import annotations

import itertools
import socket
import time
from dataclasses import dataclass
from typing import Callable

import pytest
import trio
from trio_websocket import open_websocket_url

from mqtt import Connack, Decoder, Packet, Publish
from mqtt.server import ConnectRefused, ServerConnection, ServerSettings
from tests.mqtt.helpers import pkt, props, s, u16
from tests.support import RunningNode, node_settings, wait_for

TIMEOUT = 10.0
H = bytes.fromhex


# ----------------------------------------------------------------- bytes, by hand

NOPROPS = b"\x00"
PINGREQ, PINGRESP, DISCONNECT = b"\xc0\x00", b"\xd0\x00", b"\xe0\x00"
CONNACK4 = H("20020000")
CONNACK4_PRESENT = H("20020100")
# What a default node grants a v5 client: Receive Maximum 1024, Topic Alias Maximum 64,
# Maximum Packet Size 1 MiB; no Reason String, no User Property, no Server Keep Alive
# (the client's keep alive holds), no Authentication Method, no Response Information.
CONNACK5 = H("200e0000") + H("0b2104002200402700100000")
CONNACK5_PRESENT = H("200e0100") + H("0b2104002200402700100000")


def connect(lv: int, cid: str, *, clean: bool = True, ka: int = 60, will: tuple | None = None,
            user: str | None = None, pw: bytes | None = None, cprops: bytes = NOPROPS,
            wprops: bytes = NOPROPS, flags_extra: int = 0) -> bytes:
    name, level = (b"MQIsdp", 3) if lv == 3 else (b"MQTT", lv)
    flags = (0x02 if clean else 0) | flags_extra
    payload = s(cid)
    if will is not None:
        topic, message, qos, retain = will
        flags |= 0x04 | (qos << 3) | (0x20 if retain else 0)
        payload += (wprops if lv == 5 else b"") + s(topic) + s(message)
    if user is not None:
        flags |= 0x80
        payload += s(user)
    if pw is not None:
        flags |= 0x40
        payload += s(pw)
    head = s(name) + bytes((level, flags)) + u16(ka) + (cprops if lv == 5 else b"")
    return pkt(0x10, head + payload)


def publish(lv: int, topic: str | bytes, payload: bytes = b"", qos: int = 0, pid: int | None = None, *,
            retain: bool = False, dup: bool = False, pr: bytes = NOPROPS) -> bytes:
    first = 0x30 | (qos << 1) | (0x01 if retain else 0) | (0x08 if dup else 0)
    body = s(topic) + (u16(pid) if pid is not None else b"") + (pr if lv == 5 else b"") + payload
    return pkt(first, body)


def subscribe(lv: int, pid: int, *filters: tuple[str | bytes, int], pr: bytes = NOPROPS, first: int = 0x82) -> bytes:
    return pkt(first, u16(pid) + (pr if lv == 5 else b"") + b"".join(s(f) + bytes((o,)) for f, o in filters))


def unsubscribe(lv: int, pid: int, *filters: str, first: int = 0xA2) -> bytes:
    return pkt(first, u16(pid) + (NOPROPS if lv == 5 else b"") + b"".join(s(f) for f in filters))


def suback(lv: int, pid: int, *codes: int) -> bytes:
    return pkt(0x90, u16(pid) + (NOPROPS if lv == 5 else b"") + bytes(codes))


def unsuback(lv: int, pid: int, *codes: int) -> bytes:
    return pkt(0xB0, u16(pid) + (NOPROPS + bytes(codes) if lv == 5 else b""))


def ack(kind: int, pid: int, code: int | None = None) -> bytes:
    """PUBACK 0x40, PUBREC 0x50, PUBREL 0x62, PUBCOMP 0x70."""
    return pkt(kind, u16(pid) + (bytes((code,)) if code is not None else b""))


def disconnect5(code: int) -> bytes:
    return bytes((0xE0, 1, code))


# ----------------------------------------------------------------- the network


class Wire:
    """One client connection: bytes out, exact bytes expected back."""

    def __init__(self, port: int, lv: int) -> None:
        self.lv = lv
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
        self.buf = b""

    def send(self, *data: bytes) -> "Wire":
        self.sock.sendall(b"".join(data))
        return self

    def expect(self, *data: bytes) -> "Wire":
        want = b"".join(data)
        while len(self.buf) < len(want):
            chunk = self.sock.recv(65536)
            assert chunk, f"closed; got {self.buf.hex()} of {want.hex()}"
            self.buf += chunk
        got, self.buf = self.buf[: len(want)], self.buf[len(want):]
        assert got.hex() == want.hex()
        return self

    def read_packet(self) -> Packet:
        """The next packet, decoded (where its bytes cannot be known in advance)."""
        decoder = Decoder(role="client", protocol_level=self.lv)
        decoder.feed(self.buf)
        self.buf = b""
        while (packet := decoder.next_packet()) is None:
            chunk = self.sock.recv(65536)
            assert chunk, "closed"
            decoder.feed(chunk)
        assert decoder.buffered == 0
        return packet

    def expect_closed(self) -> None:
        """The server closes the connection with nothing (more) sent."""
        while True:
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                break
            self.buf += chunk
        assert self.buf == b"", f"sent before closing: {self.buf.hex()}"

    def drop(self) -> None:
        """The client's network fails: the socket closes without DISCONNECT."""
        self.sock.close()


_NAMES = itertools.count()


class Net:
    """The node under test, and fresh names per scenario (rows share one node)."""

    def __init__(self, node: RunningNode) -> None:
        self.node = node
        self.wires: list[Wire] = []

    def wire(self, lv: int) -> Wire:
        w = Wire(self.node.mqtt_port, lv)
        self.wires.append(w)
        return w

    def name(self, what: str) -> str:
        """A name no other row uses on the shared node ('x/' gives a level: 'x/7/')."""
        n = next(_NAMES)
        return f"{what}{n}/" if what.endswith("/") else f"{what}{n}"

    def client(self, lv: int, what: str = "c", *, present: bool = False, cid: str | None = None, **kw: object) -> Wire:
        """A connected client (CONNACK checked)."""
        w = self.wire(lv)
        w.send(connect(lv, cid or self.name(what), **kw))
        if lv == 5:
            w.expect(CONNACK5_PRESENT if present else CONNACK5)
        else:
            w.expect(CONNACK4_PRESENT if present else CONNACK4)
        return w

    def watcher(self, lv: int, *filters: tuple[str, int]) -> Wire:
        w = self.client(lv, "w")
        w.send(subscribe(lv, 1, *filters)).expect(suback(lv, 1, *(o & 3 for _, o in filters)))
        return w

    def wait(self, condition: Callable[[], bool]) -> None:
        wait_for(lambda: self.node.call(condition), TIMEOUT, "the node's condition")

    def wait_node_seconds(self, seconds: float) -> None:
        """Until the node's own clock has moved on by `seconds` (a message expiry)."""
        assert self.node.node is not None
        clock = self.node.node.clock
        until = self.node.call(clock.wall) + seconds
        self.wait(lambda: clock.wall() >= until)

    def close(self) -> None:
        for w in self.wires:
            w.sock.close()
        self.wires.clear()


@pytest.fixture(scope="module")
def shared_node(tmp_path_factory):
    node = RunningNode(node_settings(str(tmp_path_factory.mktemp("conformance")), ws="127.0.0.1:0")).start()
    yield node
    node.stop()


@pytest.fixture
def net(shared_node):
    n = Net(shared_node)
    yield n
    n.close()


def marker(net: Net, lv: int, w: Wire, topic: str, pid: int = 1, qos: int = 0) -> None:
    """Publish a marker to `topic`; `w` (subscribed to it) must get it next."""
    p = net.client(4, "m")
    p.send(publish(4, topic, b"marker"))
    p.send(PINGREQ).expect(PINGRESP)
    w.expect(publish(lv, topic, b"marker", qos, pid if qos else None))


# ----------------------------------------------------------------- scenarios
# Each takes the network and the protocol level (4 for 3.1.1 rows, 5 for 5.0 rows)
# and asserts the exact bytes the server sends.


def first_packet_not_connect(net: Net, lv: int) -> None:
    net.wire(lv).send(PINGREQ).expect_closed()  # no CONNACK, no DISCONNECT [MQTT-3.14.0-1]


def second_connect(net: Net, lv: int) -> None:
    w = net.client(lv)
    w.send(connect(lv, net.name("again")))
    if lv == 5:
        w.expect(disconnect5(0x82))
    w.expect_closed()


def bad_protocol_name(net: Net, lv: int) -> None:
    # 3.1.2-1 lets the server close or answer 0x84: not MQTT at all, meshd closes without
    # a word, as Mosquitto 2.0.11 does.
    net.wire(lv).send(pkt(0x10, s("MQTX") + bytes((lv, 2)) + u16(60) + s("x"))).expect_closed()


def bad_protocol_level(net: Net, lv: int) -> None:
    # An MQTT server that does not speak this version says so in a 3.1.1 CONNACK (return
    # code 1), which every version's client reads, as Mosquitto 2.0.11 does.
    net.wire(lv).send(pkt(0x10, s("MQTT") + bytes((9, 2)) + u16(60) + s("x"))).expect(H("20020001")).expect_closed()


def connect_reserved_flag(net: Net, lv: int) -> None:
    w = net.wire(lv).send(connect(lv, net.name("r"), flags_extra=0x01))
    if lv == 5:
        w.expect(H("20030081") + NOPROPS)  # CONNACK 0x81 Malformed
    w.expect_closed()


def clean_start_discards_session(net: Net, lv: int) -> None:
    cid, topic = net.name("cs"), net.name("cs/")
    cprops = props(b"\x11" + (300).to_bytes(4, "big")) if lv == 5 else NOPROPS
    a = net.client(lv, cid=cid, clean=False, cprops=cprops)
    a.send(subscribe(lv, 1, (topic, 1))).expect(suback(lv, 1, 1))
    a.send(DISCONNECT).expect_closed()
    b = net.client(lv, cid=cid, clean=True)  # session present 0
    b.send(subscribe(lv, 2, (topic + "m", 0))).expect(suback(lv, 2, 0))
    p = net.client(4, "p")
    p.send(publish(4, topic, b"old", 1, 1), publish(4, topic + "m", b"marker")).expect(ack(0x40, 1))
    b.expect(publish(lv, topic + "m", b"marker"))  # the old subscription is gone


def clean_session_ends_with_connection(net: Net, lv: int) -> None:
    """3.1.1 MQTT-3.1.2-6 / 5.0 3.1.2-4: a clean session lasts as long as its network
    connection, also when a persistent CONNECT takes the client id over (issue 21)."""
    cid, topic = net.name("ct"), net.name("ct/")
    a = net.client(lv, cid=cid, clean=True)
    a.send(subscribe(lv, 1, (topic, 0))).expect(suback(lv, 1, 0))
    cprops = props(b"\x11" + (300).to_bytes(4, "big")) if lv == 5 else NOPROPS
    b = net.client(lv, cid=cid, clean=False, cprops=cprops)  # session present 0
    if lv == 5:
        a.expect(disconnect5(0x8E))
    a.expect_closed()  # MQTT-3.1.4-2 (3.1.1) / 3.1.4-3 (5.0): the old connection is closed
    b.send(subscribe(lv, 2, (topic + "m", 0))).expect(suback(lv, 2, 0))
    p = net.client(4, "p")
    p.send(publish(4, topic, b"old"), publish(4, topic + "m", b"marker"), PINGREQ).expect(PINGRESP)
    b.expect(publish(lv, topic + "m", b"marker"))


def persistent_session_resumes(net: Net, lv: int) -> None:
    """Clean Start 0 resumes the session: session present 1, QoS 1 messages that came
    while it was away are delivered (MQTT-3.1.2-4/5, 3.2.2-2 of 3.1.1; 3.1.2-5, 3.1.2-23,
    3.2.2-3, 4.5.0-1 of 5.0)."""
    cid, topic = net.name("ps"), net.name("ps/")
    cprops = props(b"\x11" + (300).to_bytes(4, "big")) if lv == 5 else NOPROPS
    a = net.client(lv, cid=cid, clean=False, cprops=cprops)  # no session yet: present 0
    a.send(subscribe(lv, 1, (topic, 1))).expect(suback(lv, 1, 1))
    a.send(DISCONNECT).expect_closed()
    p = net.client(4, "p")
    p.send(publish(4, topic, b"while away", 1, 7)).expect(ack(0x40, 7))
    b = net.client(lv, cid=cid, clean=False, cprops=cprops, present=True)
    b.expect(publish(lv, topic, b"while away", 1, 1))
    b.send(ack(0x40, 1), PINGREQ).expect(PINGRESP)


def unacknowledged_resent_on_reconnect(net: Net, lv: int) -> None:
    """MQTT-4.4.0-1 and 3.3.1-1: an unacknowledged QoS 1 PUBLISH goes again, same packet
    id, DUP 1, when the session resumes; DUP of the publisher's copy does not carry
    over (3.3.1-3): it sent DUP 1, the first delivery has DUP 0."""
    cid, topic = net.name("rs"), net.name("rs/")
    cprops = props(b"\x11" + (300).to_bytes(4, "big")) if lv == 5 else NOPROPS
    a = net.client(lv, cid=cid, clean=False, cprops=cprops)
    a.send(subscribe(lv, 1, (topic, 1))).expect(suback(lv, 1, 1))
    p = net.client(4, "p")
    p.send(publish(4, topic, b"m", 1, 3, dup=True)).expect(ack(0x40, 3))
    a.expect(publish(lv, topic, b"m", 1, 1))
    a.drop()
    b = net.client(lv, cid=cid, clean=False, cprops=cprops, present=True)
    b.expect(publish(lv, topic, b"m", 1, 1, dup=True))
    b.send(ack(0x40, 1))
    b.send(DISCONNECT).expect_closed()
    net.client(lv, cid=cid, clean=False, cprops=cprops, present=True).send(PINGREQ).expect(PINGRESP)  # nothing resent


def pubrel_resent_not_publish(net: Net, lv: int) -> None:
    """Outbound QoS 2: after PUBREC the server sends PUBREL and never the PUBLISH again;
    the PUBREL is unacknowledged until PUBCOMP and goes again on resume (MQTT-4.3.3-1 of
    3.1.1; 4.3.3-3..6 and 4.4.0-1 of 5.0)."""
    cid, topic = net.name("q2"), net.name("q2/")
    cprops = props(b"\x11" + (300).to_bytes(4, "big")) if lv == 5 else NOPROPS
    a = net.client(lv, cid=cid, clean=False, cprops=cprops)
    a.send(subscribe(lv, 1, (topic, 2))).expect(suback(lv, 1, 2))
    net.client(4, "p").send(publish(4, topic, b"two", 2, 4)).expect(ack(0x50, 4))
    a.expect(publish(lv, topic, b"two", 2, 1))
    a.send(ack(0x50, 1)).expect(ack(0x62, 1))
    a.drop()
    b = net.client(lv, cid=cid, clean=False, cprops=cprops, present=True)
    b.expect(ack(0x62, 1))
    b.send(ack(0x70, 1), PINGREQ).expect(PINGRESP)


def will_published_on_network_failure(net: Net, lv: int) -> None:
    topic = net.name("will/")
    watcher = net.watcher(lv, (topic, 0))
    a = net.client(lv, will=(topic, b"gone", 0, False), user="u", pw=b"p")  # payload order: id, will, user, password
    a.drop()
    watcher.expect(publish(lv, topic, b"gone"))  # not retained (Will Retain 0)


def will_retained(net: Net, lv: int) -> None:
    topic = net.name("willr/")
    a = net.client(lv, will=(topic, b"kept", 1, True))
    watcher = net.watcher(lv, (topic, 0))
    a.drop()
    watcher.expect(publish(lv, topic, b"kept"))  # out; the retained copy is stored before
    late = net.client(lv)
    late.send(subscribe(lv, 1, (topic, 1))).expect(suback(lv, 1, 1), publish(lv, topic, b"kept", 1, 1, retain=True))


def will_discarded_on_disconnect(net: Net, lv: int) -> None:
    topic = net.name("willd/")
    watcher = net.watcher(lv, (topic, 0), (topic + "m", 0))
    a = net.client(lv, will=(topic, b"never", 0, False))
    a.send(DISCONNECT).expect_closed()
    marker(net, lv, watcher, topic + "m")


def no_will_without_will_flag(net: Net, lv: int) -> None:
    topic = net.name("willn/")
    watcher = net.watcher(lv, (topic + "m", 0))
    net.client(lv).drop()
    marker(net, lv, watcher, topic + "m")


def will_delay_cancelled_by_reconnect(net: Net, lv: int) -> None:
    """5.0 MQTT-3.1.3-9: a new connection before the Will Delay Interval: no will."""
    topic, cid = net.name("willdel/"), net.name("wd")
    watcher = net.watcher(5, (topic, 0), (topic + "m", 0))
    cprops = props(b"\x11" + (60).to_bytes(4, "big"))
    a = net.client(5, cid=cid, clean=False, cprops=cprops, will=(topic, b"late", 0, False),
                   wprops=props(b"\x18" + (30).to_bytes(4, "big")))
    a.drop()
    net.client(5, cid=cid, clean=False, cprops=cprops, present=True)
    marker(net, 5, watcher, topic + "m")


def will_properties_kept(net: Net, lv: int) -> None:
    """5.0 MQTT-3.1.3-10: the will's User Properties, in their order."""
    topic = net.name("willp/")
    watcher = net.watcher(5, (topic, 0))
    user = b"\x26" + s("b") + s("2") + b"\x26" + s("a") + s("1") + b"\x26" + s("b") + s("3")
    net.client(5, will=(topic, b"w", 0, False), wprops=props(user)).drop()
    watcher.expect(publish(5, topic, b"w", pr=props(user)))


def malformed_connect(flags: int, payload: bytes) -> Callable[[Net, int], None]:
    """A CONNECT whose flags and payload disagree: malformed. 5.0: CONNACK 0x81."""

    def scenario(net: Net, lv: int) -> None:
        head = s("MQTT") + bytes((lv, flags)) + u16(60) + (NOPROPS if lv == 5 else b"")
        w = net.wire(lv).send(pkt(0x10, head + payload))
        if lv == 5:
            w.expect(H("20030081") + NOPROPS)
        w.expect_closed()

    return scenario


def keep_alive_timeout(net: Net, lv: int) -> None:
    """1.5 x keep alive without a packet: closed (5.0: DISCONNECT 0x8D first, as EMQX does;
    Mosquitto just closes). No Server Keep Alive was sent, so the client's value holds
    (5.0 MQTT-3.2.2-22)."""
    w = net.client(lv, ka=1)
    started = time.monotonic()
    if lv == 5:
        w.expect(disconnect5(0x8D))
    w.expect_closed()
    assert time.monotonic() - started >= 1.4


def client_id_23_characters(net: Net, lv: int) -> None:
    net.client(lv, cid="0123456789abcdefghijKLM").send(PINGREQ).expect(PINGRESP)


def empty_client_id_assigned(net: Net, lv: int) -> None:
    w = net.wire(lv).send(connect(lv, ""))
    if lv == 4:
        w.expect(CONNACK4)
    else:
        connack = w.read_packet()
        assert isinstance(connack, Connack) and connack.reason_code == 0 and not connack.session_present
        assert connack.properties.assigned_client_identifier  # [MQTT-3.2.2-16]
    w.send(PINGREQ).expect(PINGRESP)


def empty_client_id_persistent_refused(net: Net, lv: int) -> None:
    net.wire(lv).send(connect(lv, "", clean=False)).expect(H("20020002")).expect_closed()


def refused_connect_processes_nothing_after(net: Net, lv: int) -> None:
    """A refused CONNECT: CONNACK with session present 0 and the refusal, then close;
    nothing sent behind the CONNECT is processed (a PUBLISH to a watched topic)."""
    topic = net.name("ref/")
    watcher = net.watcher(lv, (topic, 0), (topic + "m", 0))
    w = net.wire(lv)
    if lv == 4:
        w.send(connect(4, "", clean=False), publish(4, topic, b"no")).expect(H("20020002")).expect_closed()
    else:
        w.send(connect(5, net.name("x"), cprops=props(b"\x15" + s("SCRAM-SHA-1"))), publish(5, topic, b"no"))
        w.expect(H("2003008c") + NOPROPS).expect_closed()  # 0x8C Bad authentication method [MQTT-4.12.0-1]
    marker(net, lv, watcher, topic + "m")


def utf8_ill_formed(net: Net, lv: int) -> None:
    w = net.client(lv).send(publish(lv, b"a\xff", b"x"))
    if lv == 5:
        w.expect(disconnect5(0x81))
    w.expect_closed()


def utf8_nul(net: Net, lv: int) -> None:
    w = net.client(lv).send(publish(lv, b"a\x00b", b"x"))
    if lv == 5:
        w.expect(disconnect5(0x81))
    w.expect_closed()


def utf8_bom_kept(net: Net, lv: int) -> None:
    topic = "\ufeff" + net.name("bom/")
    watcher = net.watcher(lv, (topic, 0))
    net.client(lv).send(publish(lv, topic, b"b"), PINGREQ).expect(PINGRESP)
    watcher.expect(publish(lv, topic, b"b"))


def varint_not_minimal(net: Net, lv: int) -> None:
    w = net.client(lv).send(H("c08000"))
    if lv == 5:
        w.expect(disconnect5(0x81))
    w.expect_closed()


def user_property_ill_formed(net: Net, lv: int) -> None:
    net.client(5).send(publish(5, "t", b"", pr=props(b"\x26" + s("k") + s(b"\xc0\x80")))).expect(disconnect5(0x81)).expect_closed()


def reserved_flags(first: int, body: bytes) -> Callable[[Net, int], None]:
    def scenario(net: Net, lv: int) -> None:
        w = net.client(lv).send(pkt(first, body))
        if lv == 5:
            w.expect(disconnect5(0x81))
        w.expect_closed()

    return scenario


def violation(data: Callable[[int], bytes], code: int) -> Callable[[Net, int], None]:
    """After CONNECT: `data` breaks a rule; 5.0 gets DISCONNECT `code`; both are closed."""

    def scenario(net: Net, lv: int) -> None:
        w = net.client(lv).send(data(lv))
        if lv == 5:
            w.expect(disconnect5(code))
        w.expect_closed()

    return scenario


def acks_carry_the_packet_id(net: Net, lv: int) -> None:
    """PUBACK/PUBREC/PUBCOMP/SUBACK/UNSUBACK carry the id of what they answer; on 5.0
    without Reason String or User Property (Request Problem Information 0 is kept), and
    with no properties a Property Length of 0."""
    topic = net.name("ack/")
    sub = net.client(lv)
    sub.send(subscribe(lv, 9, (topic, 2))).expect(suback(lv, 9, 2))
    w = net.client(lv)
    w.send(publish(lv, topic, b"1", 1, 7)).expect(ack(0x40, 7))  # 5.0: 0x00 Success may be left out [3.4.2.1]
    sub.expect(publish(lv, topic, b"1", 1, 1))
    sub.send(ack(0x40, 1))
    w.send(publish(lv, topic, b"2", 2, 8)).expect(ack(0x50, 8))
    w.send(ack(0x62, 8)).expect(ack(0x70, 8))
    sub.expect(publish(lv, topic, b"2", 2, 2))
    sub.send(ack(0x50, 2)).expect(ack(0x62, 2))
    sub.send(ack(0x70, 2))
    sub.send(unsubscribe(lv, 11, topic, "never/subscribed"))
    sub.expect(unsuback(lv, 11, 0x00, 0x11))  # 5.0: 0x11 No subscription existed
    sub.send(PINGREQ).expect(PINGRESP)


def no_subscribers_reason(net: Net, lv: int) -> None:
    """5.0 PUBACK reason codes [MQTT-3.4.2-1]: 0x10 No matching subscribers."""
    net.client(5).send(publish(5, net.name("nobody/"), b"", 1, 3)).expect(ack(0x40, 3, 0x10))


def qos0_delivery(net: Net, lv: int) -> None:
    topic = net.name("q0/")
    watcher = net.watcher(lv, (topic, 0))
    net.client(lv).send(publish(lv, topic, b"zero"), PINGREQ).expect(PINGRESP)
    watcher.expect(publish(lv, topic, b"zero"))  # no packet id, DUP 0


def server_packet_ids(net: Net, lv: int) -> None:
    topic = net.name("ids/")
    watcher = net.watcher(lv, (topic, 1))
    net.client(4).send(publish(4, topic, b"a", 1, 1), publish(4, topic, b"b", 1, 2)).expect(ack(0x40, 1), ack(0x40, 2))
    watcher.expect(publish(lv, topic, b"a", 1, 1), publish(lv, topic, b"b", 1, 2))


def qos2_duplicate_not_delivered_twice(net: Net, lv: int) -> None:
    """MQTT-4.3.3-2 (3.1.1) / 4.3.3-10 (5.0): a QoS 2 PUBLISH resent before PUBREL is
    answered with PUBREC again and not delivered again; after PUBCOMP the same id is a
    new message (4.3.3-12)."""
    topic = net.name("dup2/")
    watcher = net.watcher(lv, (topic, 0))
    w = net.client(lv)
    w.send(publish(lv, topic, b"once", 2, 5)).expect(ack(0x50, 5))
    w.send(publish(lv, topic, b"once", 2, 5, dup=True)).expect(ack(0x50, 5))
    w.send(ack(0x62, 5)).expect(ack(0x70, 5))
    w.send(publish(lv, topic, b"again", 2, 5)).expect(ack(0x50, 5))
    w.send(ack(0x62, 5)).expect(ack(0x70, 5))
    watcher.expect(publish(lv, topic, b"once"), publish(lv, topic, b"again"))


def qos1_same_id_is_new(net: Net, lv: int) -> None:
    topic = net.name("dup1/")
    watcher = net.watcher(lv, (topic, 0))
    w = net.client(lv)
    w.send(publish(lv, topic, b"1", 1, 5)).expect(ack(0x40, 5))
    w.send(publish(lv, topic, b"2", 1, 5, dup=True)).expect(ack(0x40, 5))
    watcher.expect(publish(lv, topic, b"1"), publish(lv, topic, b"2"))


def refused_pubrec_then_same_id_is_new(net: Net, lv: int) -> None:
    """5.0 MQTT-4.3.3-9: after PUBREC >= 0x80 (here: a PUBLISH to $SYS/, refused 0x87 as
    Mosquitto does) the same packet id starts a new exchange."""
    topic = net.name("nr/")
    watcher = net.watcher(5, (topic, 0))
    w = net.client(5)
    w.send(publish(5, "$SYS/" + topic, b"no", 2, 6)).expect(ack(0x50, 6, 0x87))
    w.send(publish(5, topic, b"yes", 2, 6)).expect(ack(0x50, 6))
    w.send(ack(0x62, 6)).expect(ack(0x70, 6))
    watcher.expect(publish(5, topic, b"yes"))


def pubrel_unknown_id(net: Net, lv: int) -> None:
    """5.0 PUBCOMP/PUBREL reason codes [MQTT-3.7.2-1, 3.6.2-1]: 0x92 for an unknown id."""
    w = net.client(5)
    w.send(ack(0x62, 40)).expect(ack(0x70, 40, 0x92))
    w.send(ack(0x50, 41)).expect(ack(0x62, 41, 0x92))


def retained_messages(net: Net, lv: int) -> None:
    """Retained: stored and replaced (even by QoS 0), sent with RETAIN 1 to a new
    subscription, with RETAIN 0 to one that existed; an empty payload clears it; a
    non-retained PUBLISH neither stores nor clears."""
    topic = net.name("ret/")
    existing = net.watcher(lv, (topic, 0))
    p = net.client(lv)
    p.send(publish(lv, topic, b"first", 1, 1, retain=True)).expect(ack(0x40, 1))
    p.send(publish(lv, topic, b"second", 0, retain=True))
    p.send(publish(lv, topic, b"plain"), PINGREQ).expect(PINGRESP)
    existing.expect(publish(lv, topic, b"first"), publish(lv, topic, b"second"), publish(lv, topic, b"plain"))
    new = net.client(lv)
    new.send(subscribe(lv, 1, (topic, 0))).expect(suback(lv, 1, 0), publish(lv, topic, b"second", retain=True))
    p.send(publish(lv, topic, b"", 0, retain=True), PINGREQ).expect(PINGRESP)
    existing.expect(publish(lv, topic, b""))  # delivered normally, retain 0
    late = net.client(lv)
    late.send(subscribe(lv, 1, (topic, 0))).expect(suback(lv, 1, 0))
    late.send(PINGREQ).expect(PINGRESP)  # nothing retained any more


def retain_handling(net: Net, lv: int) -> None:
    """5.0 MQTT-3.3.1-9..11: Retain Handling 0 sends the retained message on every
    SUBSCRIBE (also when it replaces the subscription, 3.8.4-4), 1 only when the
    subscription is new, 2 never; Retain As Published 1 keeps RETAIN (3.3.1-13)."""
    topic = net.name("rh/")
    net.client(5).send(publish(5, topic, b"r", 0, retain=True), PINGREQ).expect(PINGRESP)
    w = net.client(5)
    w.send(subscribe(5, 1, (topic, 0x00))).expect(suback(5, 1, 0), publish(5, topic, b"r", retain=True))
    w.send(subscribe(5, 2, (topic, 0x00))).expect(suback(5, 2, 0), publish(5, topic, b"r", retain=True))
    w.send(subscribe(5, 3, (topic, 0x10))).expect(suback(5, 3, 0))
    w.send(subscribe(5, 4, (topic, 0x20))).expect(suback(5, 4, 0))
    w.send(PINGREQ).expect(PINGRESP)
    fresh = net.client(5)
    fresh.send(subscribe(5, 1, (topic, 0x10))).expect(suback(5, 1, 0), publish(5, topic, b"r", retain=True))
    rap = net.client(5)
    rap.send(subscribe(5, 1, (topic, 0x28))).expect(suback(5, 1, 0))
    net.client(5).send(publish(5, topic, b"live", 0, retain=True), PINGREQ).expect(PINGRESP)
    rap.expect(publish(5, topic, b"live", retain=True))  # Retain As Published
    w.expect(publish(5, topic, b"live"))  # 3.3.1-12: RETAIN 0 when forwarding


def wildcard_in_topic_name(net: Net, lv: int) -> None:
    # 3.3.2-2 names no code: meshd answers 0x90 Topic Name invalid, as EMQX does
    # (Mosquitto 2.0.11 answers 0x82).
    w = net.client(lv).send(publish(lv, "a/+", b""))
    if lv == 5:
        w.expect(disconnect5(0x90))
    w.expect_closed()


def topic_matches_filter(net: Net, lv: int) -> None:
    base = net.name("m/")
    watcher = net.watcher(lv, (base + "+/x", 0))
    net.client(4).send(publish(4, base + "a/y", b"no"), publish(4, base + "a/x", b"yes"), PINGREQ).expect(PINGRESP)
    watcher.expect(publish(lv, base + "a/x", b"yes"))


def overlapping_subscriptions(net: Net, lv: int) -> None:
    """One copy at the highest QoS of the matching subscriptions (3.3.5-1 of 3.1.1,
    3.3.4-2 of 5.0); on 5.0 it carries every matching Subscription Identifier (3.3.4-3/4)."""
    base = net.name("ov/")
    w = net.client(lv)
    sub_id = (lambda n: props(b"\x0b" + bytes((n,)))) if lv == 5 else (lambda n: NOPROPS)
    w.send(subscribe(lv, 1, (base + "#", 0), pr=sub_id(1))).expect(suback(lv, 1, 0))
    w.send(subscribe(lv, 2, (base + "+", 1), pr=sub_id(2))).expect(suback(lv, 2, 1))
    net.client(4).send(publish(4, base + "x", b"o", 1, 1)).expect(ack(0x40, 1))
    if lv == 5:
        w.expect(publish(5, base + "x", b"o", 1, 1, pr=props(b"\x0b\x01\x0b\x02")))
    else:
        w.expect(publish(4, base + "x", b"o", 1, 1))


def subscription_identifier_per_copy(net: Net, lv: int) -> None:
    """5.0 MQTT-3.3.4-5: a copy per subscription (two clients) carries its own identifier."""
    topic = net.name("sid/")
    a, b = net.client(5), net.client(5)
    a.send(subscribe(5, 1, (topic, 0), pr=props(b"\x0b\x05"))).expect(suback(5, 1, 0))
    b.send(subscribe(5, 1, (topic, 0), pr=props(b"\x0b\x06"))).expect(suback(5, 1, 0))
    net.client(4).send(publish(4, topic, b"s"), PINGREQ).expect(PINGRESP)
    a.expect(publish(5, topic, b"s", pr=props(b"\x0b\x05")))
    b.expect(publish(5, topic, b"s", pr=props(b"\x0b\x06")))


def message_properties_forwarded(net: Net, lv: int) -> None:
    """5.0: Payload Format Indicator, Response Topic, Correlation Data, User Properties
    (in order, duplicates kept) and Content Type reach the subscriber unaltered
    (MQTT-3.3.2-4, 3.3.2-15..18, 3.3.2-20); Message Expiry minus the time waited (3.3.2-6)."""
    topic = net.name("pp/")
    w = net.watcher(5, (topic, 0))
    user = b"\x26" + s("k") + s("2") + b"\x26" + s("a") + s("1") + b"\x26" + s("k") + s("2")
    sent = (b"\x01\x01" + b"\x03" + s("text/plain") + b"\x08" + s("reply/here") + b"\x09" + s(b"\x00\x01") + user)
    net.client(5).send(publish(5, topic, b"p", pr=props(sent)), PINGREQ).expect(PINGRESP)
    w.expect(publish(5, topic, b"p", pr=props(sent)))
    net.client(5).send(publish(5, topic, b"e", pr=props(b"\x02" + (100).to_bytes(4, "big"))), PINGREQ).expect(PINGRESP)
    got = w.read_packet()
    assert isinstance(got, Publish) and got.payload == b"e"
    assert got.properties.message_expiry_interval in (99, 100)  # whole seconds waited: none or one


def topic_aliases(net: Net, lv: int) -> None:
    """5.0: outbound aliases only up to the client's Topic Alias Maximum, never 0, none
    when it allows none (3.1.2-26/27, 3.3.2-8, 3.3.2-11); inbound aliases 1..64 accepted
    (3.3.2-12); an alias does not outlive its connection (3.3.2-7)."""
    t1, t2 = net.name("al/"), net.name("al/")
    w = net.client(5, cprops=props(b"\x22" + u16(1)))
    w.send(subscribe(5, 1, (t1, 0), (t2, 0))).expect(suback(5, 1, 0, 0))
    p = net.client(5)
    p.send(publish(5, t1, b"a", pr=props(b"\x23" + u16(64))))  # sets inbound alias 64
    p.send(publish(5, "", b"b", pr=props(b"\x23" + u16(64))), publish(5, t2, b"c"), PINGREQ).expect(PINGRESP)
    w.expect(publish(5, t1, b"a", pr=props(b"\x23" + u16(1))), publish(5, "", b"b", pr=props(b"\x23" + u16(1))))
    w.expect(publish(5, t2, b"c"))  # the client's maximum (1) is used up: no alias
    none = net.watcher(5, (t1, 0))
    p.send(publish(5, t1, b"d"), PINGREQ).expect(PINGRESP)
    none.expect(publish(5, t1, b"d"))
    w.expect(publish(5, "", b"d", pr=props(b"\x23" + u16(1))))
    fresh = net.client(5)
    fresh.send(publish(5, "", b"x", pr=props(b"\x23" + u16(64)))).expect(disconnect5(0x82)).expect_closed()


def too_large_for_the_client(net: Net, lv: int) -> None:
    """5.0 MQTT-3.1.2-24/25: never more than the client's Maximum Packet Size; the
    message is dropped as if sent, and the next one flows (issue 21)."""
    topic = net.name("big/")
    w = net.client(5, cprops=props(b"\x27" + (40).to_bytes(4, "big") + b"\x21" + u16(1)))
    w.send(subscribe(5, 1, (topic, 1))).expect(suback(5, 1, 1))
    net.client(4).send(publish(4, topic, b"x" * 100, 1, 1), publish(4, topic, b"y", 1, 2)).expect(ack(0x40, 1), ack(0x40, 2))
    w.expect(publish(5, topic, b"y", 1, 2))


def receive_maximum_respected(net: Net, lv: int) -> None:
    """5.0 MQTT-3.3.4-9, 4.9.0-1/2: no more QoS 1 PUBLISHes than the client's Receive
    Maximum unacknowledged; others continue (PINGRESP, 3.3.4-10 and 4.9.0-3)."""
    topic = net.name("rm/")
    w = net.client(5, cprops=props(b"\x21" + u16(1)))
    w.send(subscribe(5, 1, (topic, 1))).expect(suback(5, 1, 1))
    net.client(4).send(publish(4, topic, b"1", 1, 1), publish(4, topic, b"2", 1, 2)).expect(ack(0x40, 1), ack(0x40, 2))
    w.expect(publish(5, topic, b"1", 1, 1))
    w.send(PINGREQ).expect(PINGRESP)  # the second waits for the first's PUBACK
    w.send(ack(0x40, 1)).expect(publish(5, topic, b"2", 1, 2))


def pingresp(net: Net, lv: int) -> None:
    net.client(lv).send(PINGREQ).expect(PINGRESP)


def connack_first_and_once(net: Net, lv: int) -> None:
    """The CONNACK is the first packet and the only one; packets sent right behind the
    CONNECT are answered after it."""
    w = net.wire(lv).send(connect(lv, net.name("cf")), PINGREQ)
    w.expect(CONNACK5 if lv == 5 else CONNACK4, PINGRESP)


def subscribe_multiple(net: Net, lv: int) -> None:
    """Several filters: handled in turn, one SUBACK with a code each, in order; the
    granted QoS is the one asked (meshd grants QoS 2); a failed one says 0x80/0x87."""
    base = net.name("mf/")
    w = net.client(lv)
    w.send(subscribe(lv, 3, (base + "2", 2), (base + "0", 0), (base + "1", 1))).expect(suback(lv, 3, 2, 0, 1))
    net.client(4).send(publish(4, base + "1", b"q", 2, 1)).expect(ack(0x50, 1))
    w.expect(publish(lv, base + "1", b"q", 1, 1))  # min(published 2, granted 1) [MQTT-3.8.4-8 of 5.0]


def resubscribe_replaces(net: Net, lv: int) -> None:
    topic = net.name("re/")
    w = net.client(lv)
    w.send(subscribe(lv, 1, (topic, 0))).expect(suback(lv, 1, 0))
    w.send(subscribe(lv, 2, (topic, 1))).expect(suback(lv, 2, 1))
    net.client(4).send(publish(4, topic, b"r", 1, 1)).expect(ack(0x40, 1))
    w.expect(publish(lv, topic, b"r", 1, 1))  # once, at the new QoS
    w.send(ack(0x40, 1), PINGREQ).expect(PINGRESP)


def unsubscribe_exact_match(net: Net, lv: int) -> None:
    """UNSUBSCRIBE compares filters character by character: 'u/+' does not remove 'u/a';
    after the UNSUBACK no new message is added (3.10.4-1/2); several filters, one
    UNSUBACK (3.10.4-6)."""
    base = net.name("u/")
    w = net.client(lv)
    w.send(subscribe(lv, 1, (base + "a", 0), (base + "b", 0))).expect(suback(lv, 1, 0, 0))
    w.send(unsubscribe(lv, 2, base + "+")).expect(unsuback(lv, 2, 0x11))
    w.send(unsubscribe(lv, 3, base + "b", base + "c")).expect(unsuback(lv, 3, 0x00, 0x11))
    net.client(4).send(publish(4, base + "b", b"gone"), publish(4, base + "a", b"kept"), PINGREQ).expect(PINGRESP)
    w.expect(publish(lv, base + "a", b"kept"))


def unsubscribe_completes_inflight(net: Net, lv: int) -> None:
    """MQTT-3.10.4-3: a QoS 2 delivery started before UNSUBSCRIBE is completed."""
    topic = net.name("ui/")
    w = net.client(lv)
    w.send(subscribe(lv, 1, (topic, 2))).expect(suback(lv, 1, 2))
    net.client(4).send(publish(4, topic, b"2", 2, 1)).expect(ack(0x50, 1))
    w.expect(publish(lv, topic, b"2", 2, 1))
    w.send(unsubscribe(lv, 2, topic)).expect(unsuback(lv, 2, 0))
    w.send(ack(0x50, 1)).expect(ack(0x62, 1))
    w.send(ack(0x70, 1), PINGREQ).expect(PINGRESP)


def ordered_topic(net: Net, lv: int) -> None:
    topic = net.name("ord/")
    w = net.watcher(lv, (topic, 1))
    p = net.client(4)
    for n in range(1, 6):
        p.send(publish(4, topic, bytes((48 + n,)), 1, n))
    p.expect(*(ack(0x40, n) for n in range(1, 6)))
    w.expect(*(publish(lv, topic, bytes((48 + n,)), 1, n) for n in range(1, 6)))


def dollar_topics_not_matched_by_wildcards(net: Net, lv: int) -> None:
    base = net.name("dl")
    all_ = net.watcher(lv, ("#", 0))
    plus = net.watcher(lv, ("+/x", 0))
    dollar = net.watcher(lv, (f"${base}/#", 0))
    p = net.client(4).send(publish(4, f"${base}/x", b"d"))
    p.send(PINGREQ).expect(PINGRESP)
    dollar.expect(publish(lv, f"${base}/x", b"d"))
    mark = net.name("dlm")
    p.send(publish(4, mark + "/x", b"m"), PINGREQ).expect(PINGRESP)
    # Whatever else '#' sees (other rows' traffic), the $ topic is not among it.
    plus.expect(publish(lv, mark + "/x", b"m"))
    seen = b""
    while publish(lv, mark + "/x", b"m") not in seen:
        seen += all_.sock.recv(65536)
    assert f"${base}/x".encode() not in seen


def empty_topic(net: Net, lv: int) -> None:
    w = net.client(lv).send(publish(lv, "", b"x"))
    if lv == 5:
        w.expect(disconnect5(0x82))  # no topic alias either: Protocol Error (3.3.2.3.4)
    w.expect_closed()


def no_normalisation(net: Net, lv: int) -> None:
    base = net.name("nf/")
    w = net.watcher(lv, (base + "caf\u00e9", 0))
    net.client(4).send(publish(4, base + "cafe\u0301", b"decomposed"), publish(4, base + "caf\u00e9", b"composed"), PINGREQ).expect(PINGRESP)
    w.expect(publish(lv, base + "caf\u00e9", b"composed"))


def reserved_topics(net: Net, lv: int) -> None:
    """3.1.1 MQTT-3.3.5-2: a PUBLISH the server does not authorize is acknowledged
    positively (3.1.1 cannot refuse) and dropped: here one to $SYS/ (issue 21)."""
    topic, mark = net.name("$SYS/fake/"), net.name("mark/")
    w = net.watcher(lv, (topic, 0), (mark, 0))
    net.client(4).send(publish(4, topic, b"no", 1, 1)).expect(ack(0x40, 1))
    marker(net, lv, w, mark)


def shared_subscription_filters(net: Net, lv: int) -> None:
    """5.0 MQTT-4.8.2-1/2: '$share/' needs a ShareName and a filter; meshd answers
    DISCONNECT 0x8F (EMQX answers 0x8F too; Mosquitto accepts it as a plain filter)."""
    net.client(5).send(subscribe(5, 1, ("$share//t", 0))).expect(disconnect5(0x8F)).expect_closed()
    net.client(5).send(subscribe(5, 1, ("$share/g", 0))).expect(disconnect5(0x8F)).expect_closed()


def shared_subscription_delivery(net: Net, lv: int) -> None:
    """5.0 MQTT-4.8.2-3: one member of the group gets it, at its granted QoS."""
    topic, group = net.name("sh/"), net.name("g")
    w = net.client(5)
    w.send(subscribe(5, 1, (f"$share/{group}/{topic}", 1))).expect(suback(5, 1, 1))
    net.client(4).send(publish(4, topic, b"s", 2, 1)).expect(ack(0x50, 1))
    w.expect(publish(5, topic, b"s", 1, 1))


def refused_delivery_not_resent(net: Net, lv: int) -> None:
    """5.0 MQTT-4.4.0-2 and 4.8.2-6: PUBACK >= 0x80 ends the delivery: not resent on
    resume, not sent to another member of a share group."""
    topic, group, cid = net.name("rf/"), net.name("g"), net.name("rf")
    cprops = props(b"\x11" + (300).to_bytes(4, "big"))
    a = net.client(5, cid=cid, clean=False, cprops=cprops)
    a.send(subscribe(5, 1, (f"$share/{group}/{topic}", 1))).expect(suback(5, 1, 1))
    net.client(4).send(publish(4, topic, b"no", 1, 1)).expect(ack(0x40, 1))
    a.expect(publish(5, topic, b"no", 1, 1))
    a.send(ack(0x40, 1, 0x80), DISCONNECT).expect_closed()
    b = net.client(5, cid=cid, clean=False, cprops=cprops, present=True)
    b.send(PINGREQ).expect(PINGRESP)


def session_expires(net: Net, lv: int) -> None:
    """5.0 MQTT-4.1.0-2 (and 3.1.2-23): the session outlives the connection by its
    Session Expiry Interval (1 s here), then it is gone."""
    cid = net.name("se")
    cprops = props(b"\x11" + (1).to_bytes(4, "big"))
    net.client(5, cid=cid, clean=False, cprops=cprops).send(DISCONNECT).expect_closed()
    assert net.node.call(lambda: cid in net.node.node.broker.sessions)
    net.wait(lambda: cid not in net.node.node.broker.sessions)
    net.client(5, cid=cid, clean=False, cprops=cprops)  # session present 0


def retain_not_available(net: Net, lv: int) -> None:
    """5.0 MQTT-3.2.2-13: without retain support, a retained will is refused with CONNACK
    0x9A. Fed to the server machine as a node with `retain_available = false` runs it."""
    conn = ServerConnection(ServerSettings(retain_available=False), 0.0)
    conn.receive_data(connect(5, "rw", will=("w", b"x", 0, True)), 0.0)
    event = conn.next_event()
    assert isinstance(event, ConnectRefused)
    assert conn.close(event.reason_code).hex() == (H("2003009a") + NOPROPS).hex()


def expired_message_not_delivered(net: Net, lv: int) -> None:
    """5.0 MQTT-3.3.2-5: a message that expired before its delivery started is deleted;
    one still valid is delivered with the time waited taken off (3.3.2-6)."""
    cid, topic = net.name("ex"), net.name("ex/")
    cprops = props(b"\x11" + (300).to_bytes(4, "big"))
    a = net.client(5, cid=cid, clean=False, cprops=cprops)
    a.send(subscribe(5, 1, (topic, 1))).expect(suback(5, 1, 1))
    a.send(DISCONNECT).expect_closed()
    p = net.client(5)
    p.send(publish(5, topic, b"short", 1, 1, pr=props(b"\x02" + (1).to_bytes(4, "big")))).expect(ack(0x40, 1))
    p.send(publish(5, topic, b"long", 1, 2, pr=props(b"\x02" + (100).to_bytes(4, "big")))).expect(ack(0x40, 2))
    net.wait_node_seconds(1.1)
    b = net.client(5, cid=cid, clean=False, cprops=cprops, present=True)
    got = b.read_packet()
    assert isinstance(got, Publish) and got.payload == b"long" and got.packet_id == 1
    assert got.properties.message_expiry_interval in (98, 99)
    b.send(ack(0x40, 1), PINGREQ).expect(PINGRESP)


def qos2_sent_is_not_expired(net: Net, lv: int) -> None:
    """5.0 MQTT-4.3.3-7: once a QoS 2 PUBLISH was sent, message expiry no longer applies:
    resent on resume though its interval has passed (issue 21)."""
    cid, topic = net.name("q2x"), net.name("q2x/")
    cprops = props(b"\x11" + (300).to_bytes(4, "big"))
    a = net.client(5, cid=cid, clean=False, cprops=cprops)
    a.send(subscribe(5, 1, (topic, 2))).expect(suback(5, 1, 2))
    expiry = props(b"\x02" + (1).to_bytes(4, "big"))
    net.client(5).send(publish(5, topic, b"x", 2, 1, pr=expiry)).expect(ack(0x50, 1))
    a.expect(publish(5, topic, b"x", 2, 1, pr=expiry))
    a.drop()
    net.wait_node_seconds(1.1)
    b = net.client(5, cid=cid, clean=False, cprops=cprops, present=True)
    b.expect(publish(5, topic, b"x", 2, 1, dup=True, pr=expiry))  # 1 s left at the least
    b.send(ack(0x50, 1)).expect(ack(0x62, 1))
    b.send(ack(0x70, 1), PINGREQ).expect(PINGRESP)


def qos2_receiver_continues_after_expiry(net: Net, lv: int) -> None:
    """5.0 MQTT-4.3.3-13: the server as receiver completes a QoS 2 exchange whose
    message expired meanwhile."""
    w = net.client(5)
    w.send(publish(5, net.name("rx/"), b"x", 2, 3, pr=props(b"\x02" + (1).to_bytes(4, "big")))).expect(ack(0x50, 3, 0x10))
    net.wait_node_seconds(1.1)
    w.send(ack(0x62, 3)).expect(ack(0x70, 3))


def shared_delivery_dies_with_its_session(net: Net, lv: int) -> None:
    """5.0 MQTT-4.8.2-5: a shared delivery whose subscriber's session ended goes to no
    other member of the group."""
    topic, group = net.name("shd/"), net.name("g")
    share = f"$share/{group}/{topic}"
    a = net.client(5)  # a clean session: it ends with the connection
    a.send(subscribe(5, 1, (share, 1))).expect(suback(5, 1, 1))
    p = net.client(4)
    p.send(publish(4, topic, b"first", 1, 1)).expect(ack(0x40, 1))
    a.expect(publish(5, topic, b"first", 1, 1))
    a.drop()
    b = net.client(5)
    b.send(subscribe(5, 1, (share, 1))).expect(suback(5, 1, 1))
    p.send(publish(4, topic, b"second", 1, 2)).expect(ack(0x40, 2))
    b.expect(publish(5, topic, b"second", 1, 1))


def disconnect_bytes(net: Net, lv: int) -> None:
    """5.0: the server's DISCONNECT uses a DISCONNECT reason code, carries no Session
    Expiry, Reason String or User Property, and nothing follows it (3.14.2-1..4, 3.14.4-1/2)."""
    net.client(5).send(publish(5, "a/#", b"")).expect(disconnect5(0x90)).expect_closed()


def auth_packet_without_method(net: Net, lv: int) -> None:
    """5.0 MQTT-4.12.0-7 (kept by the server): AUTH without an Authentication Method
    in the CONNECT is a Protocol Error."""
    net.client(5).send(H("f000")).expect(disconnect5(0x82)).expect_closed()


def subscription_identifier_from_client(net: Net, lv: int) -> None:
    net.client(5).send(publish(5, "t", b"", pr=props(b"\x0b\x01"))).expect(disconnect5(0x82)).expect_closed()


def no_local(net: Net, lv: int) -> None:
    """5.0 MQTT-3.8.3-3: No Local: not sent back to the connection's own client id."""
    topic = net.name("nl/")
    w = net.client(5)
    w.send(subscribe(5, 1, (topic, 0x04), (topic + "m", 0))).expect(suback(5, 1, 0, 0))
    w.send(publish(5, topic, b"own"), publish(5, topic + "m", b"m"))
    w.expect(publish(5, topic + "m", b"m"))


def websocket_transport(net: Net, lv: int) -> None:
    """MQTT-6.0.0-1..4: binary messages, a packet across messages (and an empty one,
    issue 21), a text message closes, the subprotocol is 'mqtt'."""
    port = net.node.ports["ws"]

    async def run() -> list[object]:
        out: list[object] = []
        async with open_websocket_url(f"ws://127.0.0.1:{port}/mqtt", subprotocols=["mqtt"]) as ws:
            out.append(ws.subprotocol)
            data = connect(lv, net.name("ws"))
            await ws.send_message(data[:3])
            await ws.send_message(b"")
            await ws.send_message(data[3:] + PINGREQ)
            got = b""
            while len(got) < len((CONNACK5 if lv == 5 else CONNACK4) + PINGRESP):
                got += await ws.get_message()
            out.append(got)
            await ws.send_message("text")
            try:
                with trio.fail_after(TIMEOUT):
                    while True:
                        await ws.get_message()
            except Exception as exc:  # ConnectionClosed: the server ended it
                out.append(type(exc).__name__)
        return out

    subprotocol, got, closed = trio.run(run)
    assert subprotocol == "mqtt"
    assert got == (CONNACK5 if lv == 5 else CONNACK4) + PINGRESP
    assert closed == "ConnectionClosed"


# ----------------------------------------------------------------- the statements


@dataclass(frozen=True)
class Row:
    statement: str  # e.g. "MQTT-3.1.2-6"
    spec: str  # "3.1.1" or "5.0"
    gist: str
    scenario: Callable[[Net, int], None] | None = None
    not_applicable: str = ""  # why the statement binds no server (or no server like meshd)


def R(statement: str, spec: str, gist: str, scenario: Callable[[Net, int], None]) -> Row:
    return Row(statement, spec, gist, scenario=scenario)


def NA(statement: str, spec: str, gist: str, why: str) -> Row:
    return Row(statement, spec, gist, not_applicable=why)


CLIENT = "a rule for clients"
V3 = "3.1.1"
V5 = "5.0"

_pw_without_user = malformed_connect(0x42, s("c") + s("pw"))

ROWS: list[Row] = [
    # ------------------------------------------------------------------ MQTT 3.1.1
    R("MQTT-1.5.3-1", V3, "ill-formed UTF-8 closes the connection", utf8_ill_formed),
    R("MQTT-1.5.3-2", V3, "U+0000 in a string closes the connection", utf8_nul),
    R("MQTT-1.5.3-3", V3, "0xEF 0xBB 0xBF is U+FEFF, never stripped", utf8_bom_kept),
    R("MQTT-2.2.2-1", V3, "reserved flags carry the listed values", reserved_flags(0x60, u16(1))),
    R("MQTT-2.2.2-2", V3, "invalid flags close the connection", reserved_flags(0x63, u16(1))),
    R("MQTT-2.3.1-1", V3, "SUBSCRIBE, UNSUBSCRIBE, PUBLISH QoS>0 carry a non-zero packet id",
      violation(lambda lv: publish(lv, "t", b"", 1, 0), 0x82)),  # Mosquitto 2.0.11: 0x82 too
    NA("MQTT-2.3.1-2", V3, "a client assigns an unused packet id", CLIENT),
    NA("MQTT-2.3.1-3", V3, "a client resends with the same packet id", CLIENT),
    R("MQTT-2.3.1-4", V3, "the server's QoS>0 PUBLISHes get unused non-zero ids", server_packet_ids),
    R("MQTT-2.3.1-5", V3, "a QoS 0 PUBLISH has no packet id", qos0_delivery),
    R("MQTT-2.3.1-6", V3, "PUBACK/PUBREC/PUBREL carry the PUBLISH's packet id", acks_carry_the_packet_id),
    R("MQTT-2.3.1-7", V3, "SUBACK/UNSUBACK carry the request's packet id", acks_carry_the_packet_id),
    R("MQTT-3.1.0-1", V3, "the first packet is CONNECT", first_packet_not_connect),
    R("MQTT-3.1.0-2", V3, "a second CONNECT is a protocol violation: close", second_connect),
    R("MQTT-3.1.2-1", V3, "a wrong protocol name: the server may close", bad_protocol_name),
    R("MQTT-3.1.2-2", V3, "an unsupported level: CONNACK 1, then close", bad_protocol_level),
    R("MQTT-3.1.2-3", V3, "the reserved CONNECT flag is 0, else close", connect_reserved_flag),
    R("MQTT-3.1.2-4", V3, "CleanSession 0 resumes the session (or makes one)", persistent_session_resumes),
    R("MQTT-3.1.2-5", V3, "a CleanSession 0 session keeps QoS 1/2 messages while away", persistent_session_resumes),
    R("MQTT-3.1.2-6", V3, "CleanSession 1 discards the old session; it lasts as long as the connection",
      clean_session_ends_with_connection),
    R("MQTT-3.1.2-7", V3, "retained messages are not session state: they outlive it", retained_messages),
    R("MQTT-3.1.2-8", V3, "the will is published when the connection closes without DISCONNECT",
      will_published_on_network_failure),
    R("MQTT-3.1.2-9", V3, "with the will flag, will topic and message are in the payload", will_published_on_network_failure),
    R("MQTT-3.1.2-10", V3, "the will is removed once published or on DISCONNECT", will_discarded_on_disconnect),
    R("MQTT-3.1.2-11", V3, "will flag 0: will QoS/retain 0, no will fields", malformed_connect(0x0A, s("c"))),
    R("MQTT-3.1.2-12", V3, "will flag 0: no will is published", no_will_without_will_flag),
    R("MQTT-3.1.2-13", V3, "will flag 0: will QoS 0", malformed_connect(0x0A, s("c"))),
    R("MQTT-3.1.2-14", V3, "will QoS is not 3", malformed_connect(0x1E, s("c") + s("w") + s("x"))),
    R("MQTT-3.1.2-15", V3, "will flag 0: will retain 0", malformed_connect(0x22, s("c"))),
    R("MQTT-3.1.2-16", V3, "will retain 0: published not retained", will_published_on_network_failure),
    R("MQTT-3.1.2-17", V3, "will retain 1: published retained", will_retained),
    R("MQTT-3.1.2-18", V3, "user name flag 0: no user name", malformed_connect(0x02, s("c") + s("u"))),
    R("MQTT-3.1.2-19", V3, "user name flag 1: a user name", malformed_connect(0x82, s("c"))),
    R("MQTT-3.1.2-20", V3, "password flag 0: no password", malformed_connect(0x82, s("c") + s("u") + s("p"))),
    R("MQTT-3.1.2-21", V3, "password flag 1: a password", malformed_connect(0xC2, s("c") + s("u"))),
    R("MQTT-3.1.2-22", V3, "no user name: password flag 0", _pw_without_user),
    NA("MQTT-3.1.2-23", V3, "the client sends PINGREQ within the keep alive", CLIENT),
    R("MQTT-3.1.2-24", V3, "1.5 x keep alive without a packet: the server closes", keep_alive_timeout),
    R("MQTT-3.1.3-1", V3, "payload fields in the order id, will topic, will message, user, password",
      will_published_on_network_failure),
    R("MQTT-3.1.3-2", V3, "the client id names the session state", persistent_session_resumes),
    R("MQTT-3.1.3-3", V3, "the client id is present, the payload's first field", malformed_connect(0x02, b"")),
    R("MQTT-3.1.3-4", V3, "the client id is UTF-8", malformed_connect(0x02, s(b"\xff"))),
    R("MQTT-3.1.3-5", V3, "ids of 1..23 characters [0-9a-zA-Z] are allowed", client_id_23_characters),
    R("MQTT-3.1.3-6", V3, "an empty id (clean session) gets a unique one", empty_client_id_assigned),
    NA("MQTT-3.1.3-7", V3, "an empty id needs CleanSession 1", CLIENT + " (the server's side is MQTT-3.1.3-8)"),
    R("MQTT-3.1.3-8", V3, "an empty id with CleanSession 0: CONNACK 2, close", empty_client_id_persistent_refused),
    R("MQTT-3.1.3-9", V3, "a rejected client id: CONNACK 2, close", empty_client_id_persistent_refused),
    R("MQTT-3.1.3-10", V3, "the will topic is UTF-8", malformed_connect(0x06, s("c") + s(b"\xff") + s("m"))),
    R("MQTT-3.1.3-11", V3, "the user name is UTF-8", malformed_connect(0x82, s("c") + s(b"\xc0\xaf"))),
    R("MQTT-3.1.4-1", V3, "a CONNECT not in the format is closed", malformed_connect(0x02, s("c") + b"!")),
    R("MQTT-3.1.4-2", V3, "the same client id connected: the old connection is closed",
      clean_session_ends_with_connection),
    R("MQTT-3.1.4-3", V3, "the CleanSession processing", clean_start_discards_session),
    R("MQTT-3.1.4-4", V3, "CONNACK 0 acknowledges the CONNECT", connack_first_and_once),
    R("MQTT-3.1.4-5", V3, "after a refused CONNECT nothing more is processed", refused_connect_processes_nothing_after),
    R("MQTT-3.2.0-1", V3, "the server's first packet is CONNACK", connack_first_and_once),
    R("MQTT-3.2.2-1", V3, "CleanSession 1: session present 0", clean_start_discards_session),
    R("MQTT-3.2.2-2", V3, "CleanSession 0 with a session: session present 1", persistent_session_resumes),
    R("MQTT-3.2.2-3", V3, "CleanSession 0 without a session: session present 0", persistent_session_resumes),
    R("MQTT-3.2.2-4", V3, "a non-zero return code has session present 0", empty_client_id_persistent_refused),
    R("MQTT-3.2.2-5", V3, "a non-zero return code closes the connection", empty_client_id_persistent_refused),
    R("MQTT-3.2.2-6", V3, "no applicable return code: close without CONNACK", connect_reserved_flag),
    R("MQTT-3.3.1-1", V3, "DUP 1 on a re-delivery", unacknowledged_resent_on_reconnect),
    R("MQTT-3.3.1-2", V3, "DUP 0 on QoS 0", qos0_delivery),
    R("MQTT-3.3.1-3", V3, "an outgoing DUP does not copy the incoming one", unacknowledged_resent_on_reconnect),
    R("MQTT-3.3.1-4", V3, "QoS 3: close", violation(lambda lv: pkt(0x36, s("t") + u16(1)), 0x81)),
    R("MQTT-3.3.1-5", V3, "RETAIN 1 stores the message, replacing the topic's last", retained_messages),
    R("MQTT-3.3.1-6", V3, "a new subscription gets the retained message", retained_messages),
    R("MQTT-3.3.1-7", V3, "a QoS 0 retained message replaces the retained one", retained_messages),
    R("MQTT-3.3.1-8", V3, "RETAIN 1 when sent for a new subscription", retained_messages),
    R("MQTT-3.3.1-9", V3, "RETAIN 0 when sent to an established subscription", retained_messages),
    R("MQTT-3.3.1-10", V3, "an empty retained PUBLISH removes the retained message", retained_messages),
    R("MQTT-3.3.1-11", V3, "an empty retained message is not stored", retained_messages),
    R("MQTT-3.3.1-12", V3, "RETAIN 0 neither stores nor replaces", retained_messages),
    R("MQTT-3.3.2-1", V3, "the topic name is present and UTF-8", utf8_ill_formed),
    R("MQTT-3.3.2-2", V3, "no wildcards in a topic name", wildcard_in_topic_name),
    R("MQTT-3.3.2-3", V3, "the topic sent matches the subscription's filter", topic_matches_filter),
    R("MQTT-3.3.4-1", V3, "the receiver answers as the QoS says", acks_carry_the_packet_id),
    R("MQTT-3.3.5-1", V3, "overlapping subscriptions: the highest QoS", overlapping_subscriptions),
    R("MQTT-3.3.5-2", V3, "an unauthorized PUBLISH: positive ack or close", reserved_topics),
    R("MQTT-3.6.1-1", V3, "PUBREL flags 0010, else close", reserved_flags(0x60, u16(1))),
    R("MQTT-3.8.1-1", V3, "SUBSCRIBE flags 0010, else close", reserved_flags(0x80, u16(1) + s("a") + b"\x00")),
    R("MQTT-3.8.3-1", V3, "topic filters are UTF-8", violation(lambda lv: subscribe(lv, 1, (b"\xff", 0)), 0x81)),
    R("MQTT-3.8.3-2", V3, "wildcards supported (else refused)", topic_matches_filter),
    R("MQTT-3.8.3-3", V3, "at least one filter, else a protocol violation",
      violation(lambda lv: pkt(0x82, u16(1) + (NOPROPS if lv == 5 else b"")), 0x82)),
    R("MQTT-3.8.3-4", V3, "reserved option bits or QoS 3: malformed",
      violation(lambda lv: subscribe(lv, 1, ("a", 0x03)), 0x81)),
    R("MQTT-3.8.4-1", V3, "SUBSCRIBE is answered with SUBACK", acks_carry_the_packet_id),
    R("MQTT-3.8.4-2", V3, "the SUBACK has the SUBSCRIBE's packet id", acks_carry_the_packet_id),
    R("MQTT-3.8.4-3", V3, "the same filter again replaces the subscription", resubscribe_replaces),
    R("MQTT-3.8.4-4", V3, "several filters: as several SUBSCRIBEs, one SUBACK", subscribe_multiple),
    R("MQTT-3.8.4-5", V3, "a return code for each filter", subscribe_multiple),
    R("MQTT-3.8.4-6", V3, "the return code is the QoS granted or 0x80", subscribe_multiple),
    R("MQTT-3.9.3-1", V3, "return codes in the filters' order", subscribe_multiple),
    R("MQTT-3.9.3-2", V3, "return codes other than 0, 1, 2, 0x80 are not used", subscribe_multiple),
    R("MQTT-3.10.1-1", V3, "UNSUBSCRIBE flags 0010, else close", reserved_flags(0xA0, u16(1) + s("a"))),
    R("MQTT-3.10.3-1", V3, "UNSUBSCRIBE filters are UTF-8", violation(lambda lv: pkt(0xA2, u16(1) + (NOPROPS if lv == 5 else b"") + s(b"\xff")), 0x81)),
    R("MQTT-3.10.3-2", V3, "at least one filter, else a protocol violation",
      violation(lambda lv: pkt(0xA2, u16(1) + (NOPROPS if lv == 5 else b"")), 0x82)),
    R("MQTT-3.10.4-1", V3, "filters compared character by character", unsubscribe_exact_match),
    R("MQTT-3.10.4-2", V3, "no new messages for a removed subscription", unsubscribe_exact_match),
    R("MQTT-3.10.4-3", V3, "QoS 1/2 deliveries already started complete", unsubscribe_completes_inflight),
    R("MQTT-3.10.4-4", V3, "UNSUBSCRIBE is answered with UNSUBACK", acks_carry_the_packet_id),
    R("MQTT-3.10.4-5", V3, "UNSUBACK with the same id, even when nothing was removed", acks_carry_the_packet_id),
    R("MQTT-3.10.4-6", V3, "several filters: one UNSUBACK", unsubscribe_exact_match),
    R("MQTT-3.12.4-1", V3, "PINGREQ is answered with PINGRESP", pingresp),
    R("MQTT-3.14.1-1", V3, "DISCONNECT reserved flags 0, else close", reserved_flags(0xE1, b"")),
    NA("MQTT-3.14.4-1", V3, "after DISCONNECT the client closes the connection", CLIENT),
    NA("MQTT-3.14.4-2", V3, "after DISCONNECT the client sends nothing", CLIENT),
    R("MQTT-3.14.4-3", V3, "DISCONNECT discards the will unpublished", will_discarded_on_disconnect),
    R("MQTT-4.1.0-1", V3, "session state is kept for the session's life", persistent_session_resumes),
    R("MQTT-4.1.0-2", V3, "a session lasts at least as long as its connection", clean_session_ends_with_connection),
    R("MQTT-4.3.1-1", V3, "QoS 0: PUBLISH with QoS 0, DUP 0", qos0_delivery),
    R("MQTT-4.3.2-1", V3, "QoS 1 sender: new id, DUP 0, unacknowledged until PUBACK", unacknowledged_resent_on_reconnect),
    R("MQTT-4.3.2-2", V3, "QoS 1 receiver: PUBACK with the id; the same id after it is new", qos1_same_id_is_new),
    R("MQTT-4.3.3-1", V3, "QoS 2 sender: PUBLISH, PUBREL after PUBREC, never the PUBLISH again", pubrel_resent_not_publish),
    R("MQTT-4.3.3-2", V3, "QoS 2 receiver: PUBREC; no duplicate delivery until PUBREL; PUBCOMP",
      qos2_duplicate_not_delivered_twice),
    R("MQTT-4.4.0-1", V3, "on resume, unacknowledged PUBLISH and PUBREL are resent, original ids",
      unacknowledged_resent_on_reconnect),
    R("MQTT-4.5.0-1", V3, "a message taken is added to the matching sessions", persistent_session_resumes),
    NA("MQTT-4.5.0-2", V3, "the client acknowledges every PUBLISH", CLIENT),
    NA("MQTT-4.6.0-1", V3, "the client resends in the original order", CLIENT),
    NA("MQTT-4.6.0-2", V3, "the client sends PUBACKs in order", CLIENT),
    NA("MQTT-4.6.0-3", V3, "the client sends PUBRECs in order", CLIENT),
    NA("MQTT-4.6.0-4", V3, "the client sends PUBRELs in order", CLIENT),
    R("MQTT-4.6.0-5", V3, "every topic is an Ordered Topic by default", ordered_topic),
    R("MQTT-4.6.0-6", V3, "an Ordered Topic's messages go out in the order received", ordered_topic),
    R("MQTT-4.7.1-1", V3, "wildcards are not used in topic names", wildcard_in_topic_name),
    R("MQTT-4.7.1-2", V3, "'#' alone or after '/', and last", violation(lambda lv: subscribe(lv, 1, ("a/#/b", 0)), 0x8F)),
    R("MQTT-4.7.1-3", V3, "'+' occupies a whole level", violation(lambda lv: subscribe(lv, 1, ("a+", 0)), 0x8F)),
    R("MQTT-4.7.2-1", V3, "filters starting with a wildcard do not match '$' topics",
      dollar_topics_not_matched_by_wildcards),
    R("MQTT-4.7.3-1", V3, "topic names and filters are at least one character", empty_topic),
    R("MQTT-4.7.3-2", V3, "no U+0000 in topic names and filters", utf8_nul),
    NA("MQTT-4.7.3-3", V3, "topic names and filters encode to at most 65535 bytes",
       "the two-byte length prefix cannot say more; nothing to receive"),
    R("MQTT-4.7.3-4", V3, "no normalisation when matching", no_normalisation),
    R("MQTT-4.8.0-1", V3, "a protocol violation closes the connection", varint_not_minimal),
    NA("MQTT-4.8.0-2", V3, "a transient error closes the connection",
       "no transient error to provoke from a client; a failing connection task is closed (mesh/connection.py)"),
    R("MQTT-6.0.0-1", V3, "binary WebSocket frames; a text frame closes", websocket_transport),
    R("MQTT-6.0.0-2", V3, "packets are not aligned on WebSocket frames", websocket_transport),
    NA("MQTT-6.0.0-3", V3, "the client offers the 'mqtt' subprotocol", CLIENT),
    R("MQTT-6.0.0-4", V3, "the server selects 'mqtt'", websocket_transport),
    NA("MQTT-7.0.0-1", V3, "a server that also connects out to servers conforms as a client too",
       "meshd nodes link to each other over their own protocol (CBOR mesh links), not MQTT"),
    R("MQTT-7.0.0-2", V3, "no extension is needed to interoperate", connack_first_and_once),
    R("MQTT-7.1.1-1", V3, "the server runs over an ordered, lossless byte stream (TCP, WebSocket)", websocket_transport),
    NA("MQTT-7.1.2-1", V3, "the client runs over an ordered, lossless byte stream", CLIENT),
    # ------------------------------------------------------------------ MQTT 5.0
    R("MQTT-1.5.4-1", V5, "ill-formed UTF-8 (or surrogates): malformed", utf8_ill_formed),
    R("MQTT-1.5.4-2", V5, "no U+0000 in strings", utf8_nul),
    R("MQTT-1.5.4-3", V5, "0xEF 0xBB 0xBF is U+FEFF, never stripped", utf8_bom_kept),
    R("MQTT-1.5.5-1", V5, "variable byte integers use the fewest bytes", varint_not_minimal),
    R("MQTT-1.5.7-1", V5, "both strings of a pair are UTF-8", user_property_ill_formed),
    R("MQTT-2.1.3-1", V5, "reserved flags carry the listed values, else malformed", reserved_flags(0x60, u16(1))),
    R("MQTT-2.2.1-2", V5, "a QoS 0 PUBLISH has no packet id", qos0_delivery),
    NA("MQTT-2.2.1-3", V5, "a client assigns unused non-zero ids",
       CLIENT + " (meshd refuses an id of 0 with 0x82, as Mosquitto does: MQTT-2.3.1-1 row)"),
    R("MQTT-2.2.1-4", V5, "the server assigns unused non-zero ids", server_packet_ids),
    R("MQTT-2.2.1-5", V5, "PUBACK/PUBREC/PUBREL/PUBCOMP carry the PUBLISH's id", acks_carry_the_packet_id),
    R("MQTT-2.2.1-6", V5, "SUBACK/UNSUBACK carry the request's id", acks_carry_the_packet_id),
    R("MQTT-2.2.2-1", V5, "no properties: a Property Length of 0", acks_carry_the_packet_id),
    R("MQTT-3.1.0-1", V5, "the first packet is CONNECT", first_packet_not_connect),
    R("MQTT-3.1.0-2", V5, "a second CONNECT is a Protocol Error: close", second_connect),
    R("MQTT-3.1.2-1", V5, "protocol name 'MQTT'; else CONNACK 0x84 may go, then close", bad_protocol_name),
    R("MQTT-3.1.2-2", V5, "an unsupported version: CONNACK 0x84 may go, then close", bad_protocol_level),
    R("MQTT-3.1.2-3", V5, "the reserved CONNECT flag is 0", connect_reserved_flag),
    R("MQTT-3.1.2-4", V5, "Clean Start 1 discards the session", clean_start_discards_session),
    R("MQTT-3.1.2-5", V5, "Clean Start 0 with a session resumes it", persistent_session_resumes),
    R("MQTT-3.1.2-6", V5, "Clean Start 0 without a session makes one", persistent_session_resumes),
    R("MQTT-3.1.2-7", V5, "the will is stored with the session", will_published_on_network_failure),
    R("MQTT-3.1.2-8", V5, "the will is published when the connection closes (unless DISCONNECT 0x00)",
      will_published_on_network_failure),
    R("MQTT-3.1.2-9", V5, "with the will flag, will properties, topic and payload are present",
      will_published_on_network_failure),
    R("MQTT-3.1.2-10", V5, "the will is removed once published or on DISCONNECT 0x00", will_discarded_on_disconnect),
    R("MQTT-3.1.2-11", V5, "will flag 0: will QoS 0", malformed_connect(0x0A, s("c"))),
    R("MQTT-3.1.2-12", V5, "will QoS 0, 1 or 2", malformed_connect(0x1E, s("c") + NOPROPS + s("w") + s("x"))),
    R("MQTT-3.1.2-13", V5, "will flag 0: will retain 0", malformed_connect(0x22, s("c"))),
    R("MQTT-3.1.2-14", V5, "will retain 0: published not retained", will_published_on_network_failure),
    R("MQTT-3.1.2-15", V5, "will retain 1: published retained", will_retained),
    R("MQTT-3.1.2-16", V5, "user name flag 0: no user name", malformed_connect(0x02, s("c") + s("u"))),
    R("MQTT-3.1.2-17", V5, "user name flag 1: a user name", malformed_connect(0x82, s("c"))),
    R("MQTT-3.1.2-18", V5, "password flag 0: no password", malformed_connect(0x82, s("c") + s("u") + s("p"))),
    R("MQTT-3.1.2-19", V5, "password flag 1: a password", malformed_connect(0xC2, s("c") + s("u"))),
    NA("MQTT-3.1.2-20", V5, "the client sends PINGREQ within the keep alive", CLIENT),
    NA("MQTT-3.1.2-21", V5, "the client uses the Server Keep Alive", CLIENT),
    R("MQTT-3.1.2-22", V5, "1.5 x keep alive without a packet: the server closes", keep_alive_timeout),
    R("MQTT-3.1.2-23", V5, "session state is kept after the connection while the expiry is > 0", session_expires),
    R("MQTT-3.1.2-24", V5, "nothing larger than the client's Maximum Packet Size", too_large_for_the_client),
    R("MQTT-3.1.2-25", V5, "too large: discarded as if sent", too_large_for_the_client),
    R("MQTT-3.1.2-26", V5, "no topic alias above the client's Topic Alias Maximum", topic_aliases),
    R("MQTT-3.1.2-27", V5, "Topic Alias Maximum absent or 0: no aliases", topic_aliases),
    R("MQTT-3.1.2-28", V5, "Request Response Information 0: no Response Information", connack_first_and_once),
    R("MQTT-3.1.2-29", V5, "Request Problem Information 0: no Reason String/User Property but on PUBLISH, CONNACK, DISCONNECT",
      acks_carry_the_packet_id),
    NA("MQTT-3.1.2-30", V5, "with an Authentication Method, the client sends only AUTH/DISCONNECT before CONNACK",
       CLIENT),
    R("MQTT-3.1.3-1", V5, "payload fields in order: id, will properties, will topic, will payload, user, password",
      will_published_on_network_failure),
    R("MQTT-3.1.3-2", V5, "the client id names the session state", persistent_session_resumes),
    R("MQTT-3.1.3-3", V5, "the client id is the payload's first field", malformed_connect(0x02, b"")),
    R("MQTT-3.1.3-4", V5, "the client id is UTF-8", malformed_connect(0x02, s(b"\xff"))),
    R("MQTT-3.1.3-5", V5, "ids of 1..23 characters [0-9a-zA-Z] are allowed", client_id_23_characters),
    R("MQTT-3.1.3-6", V5, "an empty id gets a unique one", empty_client_id_assigned),
    R("MQTT-3.1.3-7", V5, "... and the CONNACK carries it as Assigned Client Identifier", empty_client_id_assigned),
    NA("MQTT-3.1.3-8", V5, "a rejected client id: CONNACK 0x85 may go, then close",
       "meshd rejects no 5.0 client id (any UTF-8 string; an empty one is assigned)"),
    R("MQTT-3.1.3-9", V5, "a reconnect before the Will Delay Interval: no will", will_delay_cancelled_by_reconnect),
    R("MQTT-3.1.3-10", V5, "the will's User Properties keep their order", will_properties_kept),
    R("MQTT-3.1.3-11", V5, "the will topic is UTF-8", malformed_connect(0x06, s("c") + NOPROPS + s(b"\xff") + s("m"))),
    R("MQTT-3.1.3-12", V5, "the user name is UTF-8", malformed_connect(0x82, s("c") + s(b"\xc0\xaf"))),
    R("MQTT-3.1.4-1", V5, "a CONNECT not in the format is closed (CONNACK 0x81 first)", malformed_connect(0x02, s("c") + b"!")),
    R("MQTT-3.1.4-2", V5, "a CONNECT failing further checks is closed", refused_connect_processes_nothing_after),
    R("MQTT-3.1.4-3", V5, "the same client id connected: DISCONNECT 0x8E to the old one, closed",
      clean_session_ends_with_connection),
    R("MQTT-3.1.4-4", V5, "the Clean Start processing", clean_start_discards_session),
    R("MQTT-3.1.4-5", V5, "CONNACK 0x00 acknowledges the CONNECT", connack_first_and_once),
    R("MQTT-3.1.4-6", V5, "after a refused CONNECT nothing but AUTH is processed", refused_connect_processes_nothing_after),
    R("MQTT-3.2.0-1", V5, "CONNACK 0x00 before any other packet", connack_first_and_once),
    R("MQTT-3.2.0-2", V5, "one CONNACK per connection", connack_first_and_once),
    R("MQTT-3.2.2-1", V5, "CONNACK flag bits 7-1 are 0", persistent_session_resumes),
    R("MQTT-3.2.2-2", V5, "Clean Start 1: session present 0", clean_start_discards_session),
    R("MQTT-3.2.2-3", V5, "Clean Start 0: session present as the state says", persistent_session_resumes),
    NA("MQTT-3.2.2-4", V5, "a client without session state and session present 1 closes", CLIENT),
    NA("MQTT-3.2.2-5", V5, "a client with session state and session present 0 discards it", CLIENT),
    R("MQTT-3.2.2-6", V5, "a non-zero reason code has session present 0", refused_connect_processes_nothing_after),
    R("MQTT-3.2.2-7", V5, "a reason code >= 0x80 closes the connection", refused_connect_processes_nothing_after),
    R("MQTT-3.2.2-8", V5, "CONNACK uses Connect Reason Codes", connect_reserved_flag),
    NA("MQTT-3.2.2-9", V5, "no QoS 1/2 support: Maximum QoS in CONNACK", "meshd supports QoS 0, 1 and 2"),
    NA("MQTT-3.2.2-10", V5, "no QoS 1/2 support: still accept SUBSCRIBE at any QoS", "meshd supports QoS 0, 1 and 2"),
    NA("MQTT-3.2.2-11", V5, "the client keeps to Maximum QoS", CLIENT),
    NA("MQTT-3.2.2-12", V5, "a will QoS above the server's: refused (0x9B)", "meshd supports will QoS 0, 1 and 2"),
    R("MQTT-3.2.2-13", V5, "a retained will without retain support: refused (0x9A)", retain_not_available),
    NA("MQTT-3.2.2-14", V5, "Retain Available 0: the client sends no RETAIN", CLIENT),
    NA("MQTT-3.2.2-15", V5, "the client keeps to the server's Maximum Packet Size", CLIENT),
    R("MQTT-3.2.2-16", V5, "an empty client id: CONNACK with a new Assigned Client Identifier", empty_client_id_assigned),
    NA("MQTT-3.2.2-17", V5, "the client keeps to the Topic Alias Maximum", CLIENT),
    NA("MQTT-3.2.2-18", V5, "Topic Alias Maximum 0: the client sends no aliases", CLIENT),
    R("MQTT-3.2.2-19", V5, "no Reason String making the CONNACK too large", connack_first_and_once),
    R("MQTT-3.2.2-20", V5, "no User Property making the CONNACK too large", connack_first_and_once),
    NA("MQTT-3.2.2-21", V5, "the client uses the Server Keep Alive", CLIENT),
    R("MQTT-3.2.2-22", V5, "no Server Keep Alive sent: the client's keep alive holds", keep_alive_timeout),
    R("MQTT-3.3.1-1", V5, "DUP 1 on a re-delivery", unacknowledged_resent_on_reconnect),
    R("MQTT-3.3.1-2", V5, "DUP 0 on QoS 0", qos0_delivery),
    R("MQTT-3.3.1-3", V5, "an outgoing DUP does not copy the incoming one", unacknowledged_resent_on_reconnect),
    R("MQTT-3.3.1-4", V5, "QoS 3 is malformed", violation(lambda lv: pkt(0x36, s("t") + u16(1) + NOPROPS), 0x81)),
    R("MQTT-3.3.1-5", V5, "RETAIN 1 stores the message, replacing the last", retained_messages),
    R("MQTT-3.3.1-6", V5, "an empty retained PUBLISH removes the retained message", retained_messages),
    R("MQTT-3.3.1-7", V5, "an empty retained message is not stored", retained_messages),
    R("MQTT-3.3.1-8", V5, "RETAIN 0 neither stores nor replaces", retained_messages),
    R("MQTT-3.3.1-9", V5, "Retain Handling 0: retained messages on SUBSCRIBE", retain_handling),
    R("MQTT-3.3.1-10", V5, "Retain Handling 1: only for a new subscription", retain_handling),
    R("MQTT-3.3.1-11", V5, "Retain Handling 2: none", retain_handling),
    R("MQTT-3.3.1-12", V5, "Retain As Published 0: RETAIN 0 when forwarding", retain_handling),
    R("MQTT-3.3.1-13", V5, "Retain As Published 1: RETAIN as received", retain_handling),
    R("MQTT-3.3.2-1", V5, "the topic name is present and UTF-8", utf8_ill_formed),
    R("MQTT-3.3.2-2", V5, "no wildcards in a topic name", wildcard_in_topic_name),
    R("MQTT-3.3.2-3", V5, "the topic sent matches the subscription's filter", topic_matches_filter),
    R("MQTT-3.3.2-4", V5, "Payload Format Indicator forwarded unaltered", message_properties_forwarded),
    R("MQTT-3.3.2-5", V5, "an expired message is not delivered", expired_message_not_delivered),
    R("MQTT-3.3.2-6", V5, "Message Expiry Interval minus the time waited", message_properties_forwarded),
    R("MQTT-3.3.2-7", V5, "no topic alias outlives its connection", topic_aliases),
    R("MQTT-3.3.2-8", V5, "no topic alias 0 is sent", topic_aliases),
    NA("MQTT-3.3.2-9", V5, "the client keeps to the server's Topic Alias Maximum", CLIENT),
    NA("MQTT-3.3.2-10", V5, "the client accepts aliases up to its maximum", CLIENT),
    R("MQTT-3.3.2-11", V5, "the server keeps to the client's Topic Alias Maximum", topic_aliases),
    R("MQTT-3.3.2-12", V5, "the server accepts aliases 1..its maximum", topic_aliases),
    NA("MQTT-3.3.2-13", V5, "the Response Topic is UTF-8",
       CLIENT + " (a received one that is not is malformed: tests/mqtt/test_malformed.py)"),
    NA("MQTT-3.3.2-14", V5, "the Response Topic has no wildcards",
       CLIENT + "; meshd forwards it as sent, as Mosquitto 2.0.11 does"),
    R("MQTT-3.3.2-15", V5, "Response Topic forwarded unaltered", message_properties_forwarded),
    R("MQTT-3.3.2-16", V5, "Correlation Data forwarded unaltered", message_properties_forwarded),
    R("MQTT-3.3.2-17", V5, "User Properties forwarded unaltered", message_properties_forwarded),
    R("MQTT-3.3.2-18", V5, "User Properties keep their order", message_properties_forwarded),
    NA("MQTT-3.3.2-19", V5, "the Content Type is UTF-8",
       CLIENT + " (a received one that is not is malformed: tests/mqtt/test_malformed.py)"),
    R("MQTT-3.3.2-20", V5, "Content Type forwarded unaltered", message_properties_forwarded),
    R("MQTT-3.3.4-1", V5, "the receiver answers as the QoS says", acks_carry_the_packet_id),
    R("MQTT-3.3.4-2", V5, "overlapping subscriptions: the highest QoS", overlapping_subscriptions),
    R("MQTT-3.3.4-3", V5, "overlapping subscriptions: their Subscription Identifiers", overlapping_subscriptions),
    R("MQTT-3.3.4-4", V5, "a single copy carries every matching identifier", overlapping_subscriptions),
    R("MQTT-3.3.4-5", V5, "separate copies each carry their own identifier", subscription_identifier_per_copy),
    R("MQTT-3.3.4-6", V5, "a client's PUBLISH carries no Subscription Identifier", subscription_identifier_from_client),
    NA("MQTT-3.3.4-7", V5, "the client keeps to the server's Receive Maximum", CLIENT),
    NA("MQTT-3.3.4-8", V5, "the client delays nothing but PUBLISH for it", CLIENT),
    R("MQTT-3.3.4-9", V5, "the server keeps to the client's Receive Maximum", receive_maximum_respected),
    R("MQTT-3.3.4-10", V5, "the server delays nothing but PUBLISH for it", receive_maximum_respected),
    R("MQTT-3.4.2-1", V5, "PUBACK uses PUBACK reason codes", no_subscribers_reason),
    R("MQTT-3.4.2-2", V5, "no Reason String making a PUBACK too large", acks_carry_the_packet_id),
    R("MQTT-3.4.2-3", V5, "no User Property making a PUBACK too large", acks_carry_the_packet_id),
    R("MQTT-3.5.2-1", V5, "PUBREC uses PUBREC reason codes", refused_pubrec_then_same_id_is_new),
    R("MQTT-3.5.2-2", V5, "no Reason String making a PUBREC too large", acks_carry_the_packet_id),
    R("MQTT-3.5.2-3", V5, "no User Property making a PUBREC too large", acks_carry_the_packet_id),
    R("MQTT-3.6.1-1", V5, "PUBREL flags 0010, else malformed", reserved_flags(0x60, u16(1))),
    R("MQTT-3.6.2-1", V5, "PUBREL uses PUBREL reason codes", pubrel_unknown_id),
    R("MQTT-3.6.2-2", V5, "no Reason String making a PUBREL too large", acks_carry_the_packet_id),
    R("MQTT-3.6.2-3", V5, "no User Property making a PUBREL too large", acks_carry_the_packet_id),
    R("MQTT-3.7.2-1", V5, "PUBCOMP uses PUBCOMP reason codes", pubrel_unknown_id),
    R("MQTT-3.7.2-2", V5, "no Reason String making a PUBCOMP too large", acks_carry_the_packet_id),
    R("MQTT-3.7.2-3", V5, "no User Property making a PUBCOMP too large", acks_carry_the_packet_id),
    R("MQTT-3.8.1-1", V5, "SUBSCRIBE flags 0010, else malformed", reserved_flags(0x80, u16(1) + NOPROPS + s("a") + b"\x00")),
    R("MQTT-3.8.3-1", V5, "topic filters are UTF-8", violation(lambda lv: subscribe(lv, 1, (b"\xff", 0)), 0x81)),
    R("MQTT-3.8.3-2", V5, "at least one filter (no payload: Protocol Error)",
      violation(lambda lv: pkt(0x82, u16(1) + NOPROPS), 0x82)),
    R("MQTT-3.8.3-3", V5, "No Local: not sent back to its own client id", no_local),
    R("MQTT-3.8.3-4", V5, "No Local on a shared subscription: Protocol Error",
      violation(lambda lv: subscribe(lv, 1, ("$share/g/a", 0x04)), 0x82)),
    R("MQTT-3.8.3-5", V5, "reserved option bits: malformed", violation(lambda lv: subscribe(lv, 1, ("a", 0x40)), 0x81)),
    R("MQTT-3.8.4-1", V5, "SUBSCRIBE is answered with SUBACK", acks_carry_the_packet_id),
    R("MQTT-3.8.4-2", V5, "the SUBACK has the SUBSCRIBE's id", acks_carry_the_packet_id),
    R("MQTT-3.8.4-3", V5, "the same filter again replaces the subscription", resubscribe_replaces),
    R("MQTT-3.8.4-4", V5, "Retain Handling 0: retained messages re-sent on replacing", retain_handling),
    R("MQTT-3.8.4-5", V5, "several filters: as several SUBSCRIBEs, one SUBACK", subscribe_multiple),
    R("MQTT-3.8.4-6", V5, "a reason code for each filter", subscribe_multiple),
    R("MQTT-3.8.4-7", V5, "the code is the QoS granted or a failure", subscribe_multiple),
    R("MQTT-3.8.4-8", V5, "delivered at min(published QoS, granted QoS)", subscribe_multiple),
    R("MQTT-3.9.2-1", V5, "no Reason String making a SUBACK too large", acks_carry_the_packet_id),
    R("MQTT-3.9.2-2", V5, "no User Property making a SUBACK too large", acks_carry_the_packet_id),
    R("MQTT-3.9.3-1", V5, "reason codes in the filters' order", subscribe_multiple),
    R("MQTT-3.9.3-2", V5, "SUBACK uses Subscribe Reason Codes", subscribe_multiple),
    R("MQTT-3.10.1-1", V5, "UNSUBSCRIBE flags 0010, else malformed", reserved_flags(0xA0, u16(1) + NOPROPS + s("a"))),
    R("MQTT-3.10.3-1", V5, "UNSUBSCRIBE filters are UTF-8",
      violation(lambda lv: pkt(0xA2, u16(1) + NOPROPS + s(b"\xff")), 0x81)),
    R("MQTT-3.10.3-2", V5, "at least one filter (no payload: Protocol Error)",
      violation(lambda lv: pkt(0xA2, u16(1) + NOPROPS), 0x82)),
    R("MQTT-3.10.4-1", V5, "filters compared character by character", unsubscribe_exact_match),
    R("MQTT-3.10.4-2", V5, "no new messages for a removed subscription", unsubscribe_exact_match),
    R("MQTT-3.10.4-3", V5, "QoS 1/2 deliveries already started complete", unsubscribe_completes_inflight),
    R("MQTT-3.10.4-4", V5, "UNSUBSCRIBE is answered with UNSUBACK", acks_carry_the_packet_id),
    R("MQTT-3.10.4-5", V5, "UNSUBACK with the same id, even when nothing was removed", acks_carry_the_packet_id),
    R("MQTT-3.10.4-6", V5, "several filters: one UNSUBACK", unsubscribe_exact_match),
    R("MQTT-3.11.2-1", V5, "no Reason String making an UNSUBACK too large", acks_carry_the_packet_id),
    R("MQTT-3.11.2-2", V5, "no User Property making an UNSUBACK too large", acks_carry_the_packet_id),
    R("MQTT-3.11.3-1", V5, "reason codes in the filters' order", unsubscribe_exact_match),
    R("MQTT-3.11.3-2", V5, "UNSUBACK uses Unsubscribe Reason Codes", acks_carry_the_packet_id),
    R("MQTT-3.12.4-1", V5, "PINGREQ is answered with PINGRESP", pingresp),
    R("MQTT-3.14.0-1", V5, "no DISCONNECT before a CONNACK < 0x80", first_packet_not_connect),
    R("MQTT-3.14.1-1", V5, "DISCONNECT reserved flags 0, else 0x81", reserved_flags(0xE1, b"")),
    R("MQTT-3.14.2-1", V5, "DISCONNECT uses Disconnect Reason Codes", disconnect_bytes),
    R("MQTT-3.14.2-2", V5, "the server sends no Session Expiry on DISCONNECT", disconnect_bytes),
    R("MQTT-3.14.2-3", V5, "no Reason String making a DISCONNECT too large", disconnect_bytes),
    R("MQTT-3.14.2-4", V5, "no User Property making a DISCONNECT too large", disconnect_bytes),
    R("MQTT-3.14.4-1", V5, "nothing follows a DISCONNECT", disconnect_bytes),
    R("MQTT-3.14.4-2", V5, "after DISCONNECT the connection is closed", disconnect_bytes),
    R("MQTT-3.14.4-3", V5, "DISCONNECT 0x00 discards the will", will_discarded_on_disconnect),
    R("MQTT-3.15.1-1", V5, "AUTH flags 0, else malformed", reserved_flags(0xF1, b"")),
    NA("MQTT-3.15.2-1", V5, "AUTH uses Authenticate Reason Codes",
       "meshd sends no AUTH: enhanced authentication is refused with 0x8C (MQTT-4.12.0-1 row)"),
    NA("MQTT-3.15.2-2", V5, "no Reason String making an AUTH too large", "meshd sends no AUTH"),
    NA("MQTT-3.15.2-3", V5, "no User Property making an AUTH too large", "meshd sends no AUTH"),
    R("MQTT-4.1.0-1", V5, "session state is kept while the connection is open", persistent_session_resumes),
    R("MQTT-4.1.0-2", V5, "session state goes when the connection closed and the expiry passed", session_expires),
    R("MQTT-4.2-1", V5, "an ordered, lossless byte stream (TCP, WebSocket)", websocket_transport),
    R("MQTT-4.3.1-1", V5, "QoS 0: QoS 0, DUP 0", qos0_delivery),
    R("MQTT-4.3.2-1", V5, "QoS 1 sender: an unused packet id", server_packet_ids),
    R("MQTT-4.3.2-2", V5, "QoS 1 sender: DUP 0 first", server_packet_ids),
    R("MQTT-4.3.2-3", V5, "QoS 1 sender: unacknowledged until PUBACK", unacknowledged_resent_on_reconnect),
    R("MQTT-4.3.2-4", V5, "QoS 1 receiver: PUBACK with the id", acks_carry_the_packet_id),
    R("MQTT-4.3.2-5", V5, "QoS 1 receiver: the same id after PUBACK is new", qos1_same_id_is_new),
    R("MQTT-4.3.3-1", V5, "QoS 2 sender: an unused packet id", server_packet_ids),
    R("MQTT-4.3.3-2", V5, "QoS 2 sender: DUP 0 first", pubrel_resent_not_publish),
    R("MQTT-4.3.3-3", V5, "QoS 2 sender: unacknowledged until PUBREC", pubrel_resent_not_publish),
    R("MQTT-4.3.3-4", V5, "QoS 2 sender: PUBREL with the id after a PUBREC < 0x80", pubrel_resent_not_publish),
    R("MQTT-4.3.3-5", V5, "QoS 2 sender: PUBREL unacknowledged until PUBCOMP", pubrel_resent_not_publish),
    R("MQTT-4.3.3-6", V5, "QoS 2 sender: no PUBLISH again after PUBREL", pubrel_resent_not_publish),
    R("MQTT-4.3.3-7", V5, "QoS 2 sender: no message expiry once the PUBLISH was sent", qos2_sent_is_not_expired),
    R("MQTT-4.3.3-8", V5, "QoS 2 receiver: PUBREC with the id", acks_carry_the_packet_id),
    R("MQTT-4.3.3-9", V5, "QoS 2 receiver: after PUBREC >= 0x80 the id is new", refused_pubrec_then_same_id_is_new),
    R("MQTT-4.3.3-10", V5, "QoS 2 receiver: PUBREC again, no duplicate, until PUBREL",
      qos2_duplicate_not_delivered_twice),
    R("MQTT-4.3.3-11", V5, "QoS 2 receiver: PUBCOMP with the PUBREL's id", acks_carry_the_packet_id),
    R("MQTT-4.3.3-12", V5, "QoS 2 receiver: after PUBCOMP the id is new", qos2_duplicate_not_delivered_twice),
    R("MQTT-4.3.3-13", V5, "QoS 2 receiver: the exchange continues after message expiry",
      qos2_receiver_continues_after_expiry),
    R("MQTT-4.4.0-1", V5, "on resume, unacknowledged PUBLISH and PUBREL go again with their ids",
      unacknowledged_resent_on_reconnect),
    R("MQTT-4.4.0-2", V5, "PUBACK/PUBREC >= 0x80: acknowledged, never resent", refused_delivery_not_resent),
    R("MQTT-4.5.0-1", V5, "a message taken is added to the matching sessions", persistent_session_resumes),
    NA("MQTT-4.5.0-2", V5, "the client acknowledges every PUBLISH", CLIENT),
    NA("MQTT-4.6.0-1", V5, "the client resends in the original order", CLIENT),
    NA("MQTT-4.6.0-2", V5, "the client sends PUBACKs in order", CLIENT),
    NA("MQTT-4.6.0-3", V5, "the client sends PUBRECs in order", CLIENT),
    NA("MQTT-4.6.0-4", V5, "the client sends PUBRELs in order", CLIENT),
    R("MQTT-4.6.0-5", V5, "an Ordered Topic's messages go out in the order received", ordered_topic),
    R("MQTT-4.6.0-6", V5, "every topic is an Ordered Topic on non-shared subscriptions", ordered_topic),
    R("MQTT-4.7.0-1", V5, "no wildcards in topic names", wildcard_in_topic_name),
    # 4.7.1 names no code for a filter that breaks its rules: meshd answers DISCONNECT 0x8F
    # Topic Filter invalid, as EMQX does (Mosquitto 2.0.11 answers 0x81).
    R("MQTT-4.7.1-1", V5, "'#' alone or after '/', and last", violation(lambda lv: subscribe(lv, 1, ("a/#/b", 0)), 0x8F)),
    R("MQTT-4.7.1-2", V5, "'+' occupies a whole level", violation(lambda lv: subscribe(lv, 1, ("a+", 0)), 0x8F)),
    R("MQTT-4.7.2-1", V5, "filters starting with a wildcard do not match '$' topics",
      dollar_topics_not_matched_by_wildcards),
    R("MQTT-4.7.3-1", V5, "topic names and filters are at least one character", empty_topic),
    R("MQTT-4.7.3-2", V5, "no U+0000 in topic names and filters", utf8_nul),
    NA("MQTT-4.7.3-3", V5, "topic names and filters encode to at most 65535 bytes",
       "the two-byte length prefix cannot say more; nothing to receive"),
    R("MQTT-4.7.3-4", V5, "no normalisation when matching", no_normalisation),
    R("MQTT-4.8.2-1", V5, "'$share/' then a ShareName of one character or more", shared_subscription_filters),
    R("MQTT-4.8.2-2", V5, "the ShareName has no '/', '+', '#' and is followed by '/' and a filter",
      shared_subscription_filters),
    R("MQTT-4.8.2-3", V5, "a shared delivery respects the granted QoS", shared_subscription_delivery),
    R("MQTT-4.8.2-4", V5, "a QoS 2 shared delivery completes on reconnect", pubrel_resent_not_publish),
    R("MQTT-4.8.2-5", V5, "a shared delivery whose session ended goes to no one else",
      shared_delivery_dies_with_its_session),
    R("MQTT-4.8.2-6", V5, "PUBACK/PUBREC >= 0x80 from a shared subscriber: not sent to another",
      refused_delivery_not_resent),
    R("MQTT-4.9.0-1", V5, "the send quota starts at the client's Receive Maximum", receive_maximum_respected),
    R("MQTT-4.9.0-2", V5, "quota 0: no QoS > 0 PUBLISH", receive_maximum_respected),
    R("MQTT-4.9.0-3", V5, "quota 0: every other packet still flows", receive_maximum_respected),
    R("MQTT-4.12.0-1", V5, "an unsupported Authentication Method: CONNACK 0x8C, close",
      refused_connect_processes_nothing_after),
    NA("MQTT-4.12.0-2", V5, "the server's AUTH asks with 0x18", "meshd has no enhanced authentication"),
    NA("MQTT-4.12.0-3", V5, "the client's AUTH answers with 0x18", CLIENT),
    NA("MQTT-4.12.0-4", V5, "the server may refuse authentication at any point", "meshd has no enhanced authentication"),
    NA("MQTT-4.12.0-5", V5, "AUTH and CONNACK carry the CONNECT's Authentication Method",
       "meshd has no enhanced authentication"),
    R("MQTT-4.12.0-6", V5, "no Authentication Method from the client: no AUTH, none in CONNACK", connack_first_and_once),
    R("MQTT-4.12.0-7", V5, "no Authentication Method: the client sends no AUTH (kept by refusing it)",
      auth_packet_without_method),
    NA("MQTT-4.12.1-1", V5, "re-authentication keeps the Authentication Method", "meshd has no enhanced authentication"),
    NA("MQTT-4.12.1-2", V5, "a failed re-authentication: DISCONNECT", "meshd has no enhanced authentication"),
    R("MQTT-4.13.1-1", V5, "a Malformed Packet or Protocol Error closes the connection", varint_not_minimal),
    R("MQTT-4.13.2-1", V5, "a reason code >= 0x80 in CONNACK/DISCONNECT closes the connection", disconnect_bytes),
    R("MQTT-6.0.0-1", V5, "binary WebSocket frames; a text frame closes", websocket_transport),
    R("MQTT-6.0.0-2", V5, "packets are not aligned on WebSocket frames", websocket_transport),
    NA("MQTT-6.0.0-3", V5, "the client offers the 'mqtt' subprotocol", CLIENT),
    R("MQTT-6.0.0-4", V5, "the server selects 'mqtt'", websocket_transport),
    NA("MQTT-7.0.0-1", V5, "a server that also connects out to servers conforms as a client too",
       "meshd nodes link to each other over their own protocol (CBOR mesh links), not MQTT"),
    R("MQTT-7.0.0-2", V5, "no extension is needed to interoperate", connack_first_and_once),
]

COVERED = [r for r in ROWS if r.scenario is not None]
NOT_APPLICABLE = [r for r in ROWS if r.scenario is None]


def test_table_counts():
    """The numbers for the closing note: one row per statement, each covered or marked."""
    keys = [(r.spec, r.statement) for r in ROWS]
    assert len(keys) == len(set(keys)), "a statement listed twice"
    assert all(bool(r.scenario) != bool(r.not_applicable) for r in ROWS)
    by_spec = {spec: (sum(1 for r in COVERED if r.spec == spec), sum(1 for r in NOT_APPLICABLE if r.spec == spec))
               for spec in (V3, V5)}
    assert by_spec == {V3: (125, 16), V5: (213, 40)}, by_spec


@pytest.mark.parametrize("row", COVERED, ids=lambda r: f"{r.spec}:{r.statement}")
def test_statement(net, row):
    assert row.scenario is not None
    row.scenario(net, 4 if row.spec == V3 else 5)
