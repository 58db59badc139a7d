"""End-to-end broker behaviour with real paho-mqtt clients over real sockets."""

from __future__ import annotations

import time

import pytest

from tests.support import Client

VERSIONS = [4, 5]
TRANSPORTS = ["tcp", "websockets"]


def port_for(node, transport: str) -> int:
    return node.ports["mqtt"] if transport == "tcp" else node.ports["ws"]


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("qos", [0, 1, 2])
def test_publish_subscribe_roundtrip(node, version, transport, qos):
    port = port_for(node, transport)
    sub = Client("sub", version=version, transport=transport)
    sub.connect(port)
    assert [int(getattr(rc, "value", rc)) for rc in sub.subscribe("t/+/x", qos)] == [qos]
    pub = Client("pub", version=version, transport=transport)
    pub.connect(port)
    for i in range(20):
        pub.publish(f"t/{i}/x", f"m{i}".encode(), qos=qos)
    got = sub.expect(20)
    assert [m.payload for m in got] == [f"m{i}".encode() for i in range(20)]
    assert {m.qos for m in got} == {qos}
    sub.disconnect()
    pub.disconnect()


def test_qos_downgraded_to_subscription(node):
    sub = Client("s", version=5)
    sub.connect(node.mqtt_port)
    sub.subscribe("a/b", 1)
    pub = Client("p", version=5)
    pub.connect(node.mqtt_port)
    pub.publish("a/b", b"x", qos=2)
    (m,) = sub.expect(1)
    assert m.qos == 1


def test_overlapping_subscriptions_one_copy_highest_qos_all_ids(node):
    """MQTT-3.3.4-2..5: one copy, at the highest granted QoS, with every subscription id."""
    sub = Client("s", version=5)
    sub.connect(node.mqtt_port)
    sub.subscribe("home/+/temp", 0, sub_id=7)
    sub.subscribe("home/#", 2, sub_id=9)
    pub = Client("p", version=5)
    pub.connect(node.mqtt_port)
    pub.publish("home/kitchen/temp", b"21", qos=2)
    (m,) = sub.expect(1)
    sub.expect_none()
    assert m.qos == 2
    assert sorted(m.properties.SubscriptionIdentifier) == [7, 9]


def test_wildcards_and_dollar_topics(node):
    sub = Client("s", version=5)
    sub.connect(node.mqtt_port)
    sub.subscribe("#", 0)
    sub.subscribe("+/monitor/Clients", 0)
    pub = Client("p", version=5)
    pub.connect(node.mqtt_port)
    pub.publish("$SYS/monitor/Clients", b"no")  # '$' topics are not matched by first-level wildcards
    pub.publish("sport/tennis", b"yes")
    (m,) = sub.expect(1)
    assert m.topic == "sport/tennis"
    sub.expect_none()


def test_no_local(node):
    c = Client("self", version=5)
    c.connect(node.mqtt_port)
    c.subscribe("chat", 1, noLocal=True)
    c.subscribe("chat2", 1)
    c.publish("chat", b"mine", qos=1)
    c.publish("chat2", b"echo", qos=1)
    (m,) = c.expect(1)
    assert m.topic == "chat2"
    c.expect_none()


def test_retained_messages(node):
    pub = Client("p", version=5)
    pub.connect(node.mqtt_port)
    pub.publish("r/1", b"one", qos=1, retain=True)
    pub.publish("r/2", b"two", qos=1, retain=True)
    pub.publish("r/2", b"", qos=1, retain=True)  # empty payload clears
    sub = Client("s", version=5)
    sub.connect(node.mqtt_port)
    sub.subscribe("r/#", 1)
    (m,) = sub.expect(1)
    sub.expect_none()
    assert (m.topic, m.payload, m.retain) == ("r/1", b"one", True)
    # Live publishes are delivered with retain=0 unless retain-as-published.
    pub.publish("r/1", b"live", qos=1, retain=True)
    (m,) = sub.expect(1)
    assert m.retain is False


def test_retain_handling_and_retain_as_published(node):
    pub = Client("p", version=5)
    pub.connect(node.mqtt_port)
    pub.publish("rh/x", b"kept", qos=1, retain=True)
    s = Client("s", version=5)
    s.connect(node.mqtt_port)
    s.subscribe("rh/x", 1, retainHandling=2)  # never send retained
    s.expect_none()
    s2 = Client("s2", version=5)
    s2.connect(node.mqtt_port)
    s2.subscribe("rh/x", 1, retainHandling=1)  # only when the subscription is new
    assert s2.expect(1)[0].payload == b"kept"
    s2.subscribe("rh/x", 1, retainHandling=1)
    s2.expect_none()
    s3 = Client("s3", version=5)
    s3.connect(node.mqtt_port)
    s3.subscribe("rh/x", 1, retainHandling=2, retainAsPublished=True)
    pub.publish("rh/x", b"live", qos=1, retain=True)
    assert s3.expect(1)[0].retain is True


@pytest.mark.parametrize("version", VERSIONS)
def test_will_published_on_abnormal_close(node, version):
    watcher = Client("w", version=version)
    watcher.connect(node.mqtt_port)
    watcher.subscribe("wills/#", 1)
    dying = Client("dying", version=version)
    dying.connect(node.mqtt_port, will=("wills/dying", b"gone", 1, False))
    dying.drop()
    (m,) = watcher.expect(1)
    assert (m.topic, m.payload) == ("wills/dying", b"gone")


def test_will_not_published_on_normal_disconnect_but_on_0x04(node):
    watcher = Client("w", version=5)
    watcher.connect(node.mqtt_port)
    watcher.subscribe("wills/#", 1)
    a = Client("a", version=5)
    a.connect(node.mqtt_port, will=("wills/a", b"a", 1, False))
    a.disconnect()
    watcher.expect_none(0.5)
    b = Client("b", version=5)
    b.connect(node.mqtt_port, will=("wills/b", b"b", 1, False))
    b.disconnect(reason=0x04)
    assert watcher.expect(1)[0].topic == "wills/b"


def test_will_delay_cancelled_by_reconnect_and_sent_after_delay(node):
    watcher = Client("w", version=5)
    watcher.connect(node.mqtt_port)
    watcher.subscribe("wills/#", 1)
    c = Client("delayed", version=5, clean=False)
    c.connect(node.mqtt_port, expiry=60, will=("wills/delayed", b"late", 1, False, {"WillDelayInterval": 1}))
    c.drop()
    c2 = Client("delayed", version=5, clean=False)
    c2.connect(node.mqtt_port, expiry=60)  # reconnect within the delay cancels the will
    watcher.expect_none(1.5)
    c2.disconnect()
    c3 = Client("delayed2", version=5, clean=False)
    c3.connect(node.mqtt_port, expiry=60, will=("wills/delayed2", b"late", 1, False, {"WillDelayInterval": 1}))
    t0 = time.monotonic()
    c3.drop()
    (m,) = watcher.expect(1, timeout=5)
    assert m.topic == "wills/delayed2"
    assert time.monotonic() - t0 >= 0.8


def test_will_sent_when_session_ends_before_delay(node):
    """A will whose delay outlives the session goes out when the session ends."""
    watcher = Client("w", version=5)
    watcher.connect(node.mqtt_port)
    watcher.subscribe("wills/#", 1)
    c = Client("short", version=5, clean=False)
    c.connect(node.mqtt_port, expiry=1, will=("wills/short", b"bye", 1, False, {"WillDelayInterval": 30}))
    t0 = time.monotonic()
    c.drop()
    (m,) = watcher.expect(1, timeout=5)
    assert m.topic == "wills/short"
    assert time.monotonic() - t0 < 10


def test_shared_subscription_one_member_each(node):
    a = Client("a", version=5)
    a.connect(node.mqtt_port)
    a.subscribe("$share/g/jobs/#", 1)
    b = Client("b", version=5)
    b.connect(node.mqtt_port)
    b.subscribe("$share/g/jobs/#", 1)
    pub = Client("p", version=5)
    pub.connect(node.mqtt_port)
    for i in range(10):
        pub.publish(f"jobs/{i}", str(i).encode(), qos=1)
    time.sleep(0.5)
    got_a = [m.payload for m in a.expect(a.messages.qsize(), timeout=1)]
    got_b = [m.payload for m in b.expect(b.messages.qsize(), timeout=1)]
    assert sorted(got_a + got_b, key=int) == [str(i).encode() for i in range(10)]
    assert len(got_a) == 5 and len(got_b) == 5  # round-robin


def test_unsubscribe(node):
    c = Client("c", version=5)
    c.connect(node.mqtt_port)
    c.subscribe("u/1", 1)
    rcs = c.unsubscribe("u/1")
    assert [int(getattr(rc, "value", rc)) for rc in rcs] == [0]
    rcs = c.unsubscribe("u/1")
    assert [int(getattr(rc, "value", rc)) for rc in rcs] == [0x11]  # no subscription existed
    c.publish("u/1", b"x", qos=1)
    c.expect_none()


@pytest.mark.parametrize("version", VERSIONS)
def test_persistent_session_queues_offline_and_resumes(node, version):
    sub = Client("persist", version=version, clean=False)
    flags, _, _ = sub.connect(node.mqtt_port, expiry=3600)
    assert flags.session_present is False
    sub.subscribe("q/#", 1)
    sub.disconnect()
    pub = Client("p", version=version)
    pub.connect(node.mqtt_port)
    for i in range(50):
        pub.publish(f"q/{i}", str(i).encode(), qos=1)
    sub2 = Client("persist", version=version, clean=False)
    flags, _, _ = sub2.connect(node.mqtt_port, expiry=3600)
    assert flags.session_present is True
    got = sub2.expect(50)
    assert [m.payload for m in got] == [str(i).encode() for i in range(50)]


def test_clean_start_discards_session(node):
    c = Client("cs", version=5, clean=False)
    c.connect(node.mqtt_port, expiry=3600)
    c.subscribe("cs/#", 1)
    c.disconnect()
    c2 = Client("cs", version=5, clean=True)
    flags, _, _ = c2.connect(node.mqtt_port)
    assert flags.session_present is False
    pub = Client("p", version=5)
    pub.connect(node.mqtt_port)
    pub.publish("cs/x", b"x", qos=1)
    c2.expect_none()


def test_session_expiry(node):
    c = Client("exp", version=5, clean=False)
    c.connect(node.mqtt_port, expiry=1)
    c.subscribe("e/#", 1)
    c.disconnect()
    time.sleep(1.6)
    c2 = Client("exp", version=5, clean=False)
    flags, _, _ = c2.connect(node.mqtt_port, expiry=1)
    assert flags.session_present is False


def test_takeover_sends_0x8e_to_old_connection(node):
    first = Client("dup", version=5)
    first.connect(node.mqtt_port)
    second = Client("dup", version=5)
    second.connect(node.mqtt_port)
    rc, _ = first.disconnects.get(timeout=5)
    assert rc.value == 0x8E


def test_assigned_client_id_and_connack_properties(node):
    c = Client("", version=5)
    _, rc, props = c.connect(node.mqtt_port, properties={"RequestResponseInformation": 1})
    assert props.AssignedClientIdentifier.startswith("auto-")
    assert props.ReceiveMaximum == 1024
    assert props.MaximumPacketSize == 1048576
    assert props.TopicAliasMaximum == 64
    assert props.ResponseInformation


def test_server_keep_alive_from_max_keepalive(node_factory):
    node = node_factory(max_keepalive=30)
    c = Client("ka", version=5)
    _, _, props = c.connect(node.mqtt_port, keepalive=120)
    assert props.ServerKeepAlive == 30


def test_message_expiry(node):
    sub = Client("me", version=5, clean=False)
    sub.connect(node.mqtt_port, expiry=60)
    sub.subscribe("me/#", 1)
    sub.disconnect()
    pub = Client("p", version=5)
    pub.connect(node.mqtt_port)
    pub.publish("me/short", b"gone", qos=1, properties={"MessageExpiryInterval": 1})
    pub.publish("me/long", b"kept", qos=1, properties={"MessageExpiryInterval": 100})
    time.sleep(1.5)
    sub2 = Client("me", version=5, clean=False)
    sub2.connect(node.mqtt_port, expiry=60)
    (m,) = sub2.expect(1)
    assert m.topic == "me/long"
    assert 95 <= m.properties.MessageExpiryInterval <= 100
    sub2.expect_none()


def test_properties_passed_through(node):
    sub = Client("s", version=5)
    sub.connect(node.mqtt_port)
    sub.subscribe("req", 1)
    pub = Client("p", version=5)
    pub.connect(node.mqtt_port)
    pub.publish("req", b"{}", qos=1, properties={
        "ResponseTopic": "resp/1", "CorrelationData": b"\x01\x02", "UserProperty": [("k", "v")],
        "PayloadFormatIndicator": 1, "ContentType": "application/json",
    })
    (m,) = sub.expect(1)
    p = m.properties
    assert p.ResponseTopic == "resp/1"
    assert p.CorrelationData == b"\x01\x02"
    assert p.UserProperty == [("k", "v")]
    assert p.PayloadFormatIndicator == 1
    assert p.ContentType == "application/json"


def test_topic_alias_inbound(node):
    sub = Client("s", version=5)
    sub.connect(node.mqtt_port)
    sub.subscribe("alias/topic", 0)
    pub = Client("p", version=5)
    pub.connect(node.mqtt_port)
    pub.publish("alias/topic", b"1", properties={"TopicAlias": 3})
    pub.publish("", b"2", properties={"TopicAlias": 3})
    got = sub.expect(2)
    assert [(m.topic, m.payload) for m in got] == [("alias/topic", b"1"), ("alias/topic", b"2")]
