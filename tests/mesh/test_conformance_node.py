"""Issue 21's items that live in the node, not in the machine: a clean session taken
over, reserved topics, the connection limit, and a message too large for its
subscriber. Each plays raw MQTT bytes against a real node (`tests.support`)."""

from __future__ import annotations

import re
import socket
import urllib.request

import pytest

from mqtt import (
    Connack,
    Connect,
    Decoder,
    Disconnect,
    Packet,
    Properties,
    Puback,
    Publish,
    Pubcomp,
    Pubrec,
    Suback,
    Subscribe,
    Subscription,
    encode,
)

TIMEOUT = 10.0


class Raw:
    """One MQTT connection driven by hand: packets out, decoded packets in."""

    def __init__(self, port: int, level: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
        self.level = level
        self.decoder = Decoder(role="client", protocol_level=level)
        self.pending: list[Packet] = []

    def send(self, *packets: Packet) -> None:
        self.sock.sendall(b"".join(encode(p, self.level) for p in packets))

    def read(self) -> Packet:
        while not self.pending:
            data = self.sock.recv(65536)
            assert data, "the server closed the connection"
            self.decoder.feed(data)
            self.pending.extend(self.decoder)
        return self.pending.pop(0)

    def connect(self, client_id: str, *, clean_start: bool = True, properties: Properties = Properties()) -> Connack:
        self.send(Connect(client_id=client_id, clean_start=clean_start, keep_alive=60, protocol_level=self.level,
                          properties=properties))
        connack = self.read()
        assert isinstance(connack, Connack), connack
        return connack

    def subscribe(self, topic_filter: str, qos: int, packet_id: int = 1) -> Suback:
        self.send(Subscribe(packet_id=packet_id, subscriptions=(Subscription(topic_filter, qos),)))
        suback = self.read()
        assert isinstance(suback, Suback), suback
        return suback

    def closed_by_server(self) -> bool:
        """True once the server closed the connection (what it sent before is dropped)."""
        while True:
            data = self.sock.recv(65536)
            if not data:
                return True

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def raw(node):
    opened: list[Raw] = []

    def open_raw(level: int = 5, port: int | None = None) -> Raw:
        r = Raw(port or node.mqtt_port, level)
        opened.append(r)
        return r

    yield open_raw
    for r in opened:
        r.close()


# ------------------------------------------------ item 2: a clean session taken over


@pytest.mark.parametrize("level", [4, 5])
def test_a_clean_session_ends_with_its_connection_when_taken_over(raw, level):
    """MQTT-3.1.2-6 (3.1.1) and 3.1.2.11.2 (5.0): a session that lasts only as long as
    its network connection ends with it, also when a persistent CONNECT takes the id."""
    a = raw(level)
    a.connect("takeover", clean_start=True)
    a.subscribe("old/topic", 0)
    b = raw(level)
    expiry = Properties(session_expiry_interval=300) if level == 5 else Properties()
    connack = b.connect("takeover", clean_start=False, properties=expiry)
    assert connack.session_present is False
    b.subscribe("new/topic", 0)
    publisher = raw(level)
    publisher.connect("publisher")
    publisher.send(Publish("old/topic", b"must not arrive", qos=1, packet_id=1),
                   Publish("new/topic", b"arrives", qos=1, packet_id=2))
    # Same publisher, same connection: the first would arrive before the second.
    got = b.read()
    assert isinstance(got, Publish) and (got.topic, got.payload) == ("new/topic", b"arrives")


def test_a_persistent_session_taken_over_is_still_present(raw):
    a = raw(4)
    a.connect("keeps", clean_start=False)
    a.subscribe("kept/topic", 0)
    b = raw(4)
    assert b.connect("keeps", clean_start=False).session_present is True


# ------------------------------------------------ item 5: reserved topics


@pytest.mark.parametrize("topic", ["$SYS/broker/fake", "$share/group/t"])
def test_publishes_to_reserved_topics_are_refused_on_v5_and_dropped(node, raw, topic):
    watcher = raw(5)
    watcher.connect("watcher")
    watcher.subscribe(topic if topic.startswith("$SYS") else "t", 0)
    watcher.subscribe("marker", 0, packet_id=2)
    v5 = raw(5)
    v5.connect("pub5")
    v5.send(Publish(topic, b"0", qos=0), Publish(topic, b"1", qos=1, packet_id=1),
            Publish(topic, b"2", qos=2, packet_id=2))
    assert v5.read() == Puback(1, 0x87)  # not authorized, as Mosquitto 2.0 answers
    assert v5.read() == Pubrec(2, 0x87)
    v311 = raw(4)
    v311.connect("pub311")
    v311.send(Publish(topic, b"3", qos=0), Publish(topic, b"4", qos=1, packet_id=1),
              Publish(topic, b"5", qos=2, packet_id=2))
    assert v311.read() == Puback(1)  # 3.1.1 cannot refuse: acknowledged, then dropped
    assert v311.read() == Pubrec(2)
    v311.send(Publish("marker", b"after", qos=1, packet_id=3))
    assert v311.read() == Puback(3)
    # Nothing of the six reached the subscriber: the marker, sent after them, is first.
    got = watcher.read()
    assert isinstance(got, Publish) and got.topic == "marker", got
    text = urllib.request.urlopen(f"http://127.0.0.1:{node.ports['http']}/metrics", timeout=5).read().decode()
    assert re.search(r'^meshd_messages_dropped_total\{reason="reserved_topic"\} 6$', text, re.M), text


# ------------------------------------------------ item 7: too large for its subscriber


@pytest.mark.parametrize("qos", [1, 2])
def test_a_message_too_large_for_the_subscriber_is_skipped_and_the_next_arrives(node, raw, qos):
    """MQTT-3.1.2-25: discard it "and then behave as if it had completed sending that
    Application Message": its place in the window is free, it is counted as dropped."""
    before = node.call(lambda: node.node.broker.stats.dropped_too_large)
    sub = raw(5)
    # One topic for both sizes, and topic aliases allowed: the alias the large one would
    # have set must not be taken for set (the client never saw it).
    sub.connect("small-sub", properties=Properties(maximum_packet_size=20, receive_maximum=1, topic_alias_maximum=5))
    sub.subscribe("s/#", qos)
    pub = raw(5)
    pub.connect("big-pub")
    for n in range(3):
        pub.send(Publish("s/1", b"x" * 100, qos=1, packet_id=1 + 2 * n),
                 Publish("s/1", bytes([n]), qos=1, packet_id=2 + 2 * n))
    for n in range(3):
        got = sub.read()
        assert isinstance(got, Publish) and got.payload == bytes([n]), got
        assert got.topic == ("s/1" if n == 0 else "") and got.properties.topic_alias == 1, got
        sub.send(Puback(got.packet_id) if qos == 1 else Pubrec(got.packet_id))
        if qos == 2:
            sub.read()  # PUBREL
            sub.send(Pubcomp(got.packet_id))
    assert node.call(lambda: node.node.broker.stats.dropped_too_large) - before == 3
    assert node.call(lambda: len(node.node.broker.sessions["small-sub"].inflight)) == 0


# ------------------------------------------------ item 6: the connection limit, exact


LIMIT = 4


def test_clients_that_disconnect_and_reconnect_at_once_are_never_refused_under_the_limit(node_factory):
    """Each round: LIMIT clients connect, then each sends DISCONNECT and closes its
    socket and the next round starts at once. The client was never over the limit, so
    it is never refused, whichever of its two sockets the node reads first."""
    node = node_factory(max_connections=LIMIT)
    for round_ in range(25):
        clients = [Raw(node.mqtt_port, 4) for _ in range(LIMIT)]
        for n, c in enumerate(clients):
            assert c.connect(f"c{n}").reason_code == 0, f"round {round_}, client {n} refused"
        for c in clients:
            c.send(Disconnect())
            c.close()
    extra = [Raw(node.mqtt_port, 4) for _ in range(LIMIT + 1)]
    try:
        codes = [c.connect(f"x{n}").reason_code for n, c in enumerate(extra)]
    finally:
        for c in extra:
            c.close()
    # And the limit still holds: quota exceeded is 3.1.1's return code 3 (read as 0x88).
    assert codes == [0] * LIMIT + [0x88]


def test_connects_being_authenticated_at_once_are_never_admitted_over_the_limit(node_factory, tmp_path):
    """Password checks run in threads, so many CONNECTs are in their handshake at once:
    each holds a slot from its admission on, and no more than the limit get in."""
    from mesh.passwd import set_password

    path = tmp_path / "passwd"
    set_password(str(path), "u", "pw")
    node = node_factory(max_connections=LIMIT, allow_anonymous=False, password_file=str(path))
    clients = [Raw(node.mqtt_port, 5) for _ in range(2 * LIMIT)]
    try:
        for n, c in enumerate(clients):
            c.send(Connect(client_id=f"a{n}", clean_start=True, keep_alive=60, protocol_level=5, username="u",
                           password=b"pw"))
        codes = []
        for c in clients:
            connack = c.read()
            assert isinstance(connack, Connack)
            codes.append(connack.reason_code)
    finally:
        for c in clients:
            c.close()
    assert sorted(codes) == [0] * LIMIT + [0x97] * LIMIT
