"""Interop: a real paho-mqtt client talks to a tiny codec-driven server over 127.0.0.1.

The server side is nothing but a blocking socket, our Decoder and our encoder, so this
checks both directions against another implementation: what paho encodes we decode,
and what we encode paho accepts (CONNACK, SUBACK, PUBACK, PUBLISH, PUBREL).
"""

from __future__ import annotations

import queue
import socket

import paho.mqtt.client as paho
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties

from mqtt import (
    Connack,
    Connect,
    Disconnect,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
)

from .helpers import TIMEOUT, CodecServer

def _wait(events: queue.Queue, kind: str):
    while True:
        event = events.get(timeout=TIMEOUT)
        if event[0] == kind:
            return event


@pytest.mark.parametrize("level", [3, 4, 5])
def test_paho_client_round_trip(level):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(TIMEOUT)
    port = listener.getsockname()[1]

    events: queue.Queue = queue.Queue()
    client = paho.Client(
        paho.CallbackAPIVersion.VERSION2, client_id="paho-interop",
        protocol={3: paho.MQTTv31, 4: paho.MQTTv311, 5: paho.MQTTv5}[level],
    )
    client.username_pw_set("user", "secret")
    connect_props = will_props = publish_props = None
    if level == 5:
        connect_props = PahoProperties(PacketTypes.CONNECT)
        connect_props.SessionExpiryInterval = 60
        connect_props.UserProperty = ("app", "interop")
        will_props = PahoProperties(PacketTypes.WILLMESSAGE)
        will_props.WillDelayInterval = 5
        publish_props = PahoProperties(PacketTypes.PUBLISH)
        publish_props.MessageExpiryInterval = 30
        publish_props.ContentType = "text/plain"
    client.will_set("will/topic", b"gone", qos=1, retain=True, properties=will_props)
    client.on_connect = lambda c, u, flags, rc, props: events.put(("connect", rc.value))
    client.on_subscribe = lambda c, u, mid, rcs, props: events.put(("subscribe", mid, [r.value for r in rcs]))
    client.on_publish = lambda c, u, mid, rc, props: events.put(("published", mid))
    client.on_message = lambda c, u, msg: events.put(("message", msg.topic, msg.payload, msg.qos))
    try:
        client.connect("127.0.0.1", port, keepalive=30, properties=connect_props)
        client.loop_start()
        server = CodecServer(listener, level)

        connect = server.read(Connect)
        assert (connect.client_id, connect.username, connect.password) == ("paho-interop", "user", b"secret")
        assert (connect.protocol_level, connect.keep_alive, connect.clean_start) == (level, 30, True)
        assert (connect.will.topic, connect.will.payload, connect.will.qos, connect.will.retain) == (
            "will/topic", b"gone", 1, True)
        if level == 5:
            assert connect.properties.session_expiry_interval == 60
            assert connect.properties.user_properties == (("app", "interop"),)
            assert connect.will.properties.will_delay_interval == 5
        server.send(Connack(False, 0, Properties(receive_maximum=10) if level == 5 else Properties()))
        assert _wait(events, "connect") == ("connect", 0)

        _, mid = client.subscribe([("x/#", 2), ("y/+", 1)])
        subscribe = server.read(Subscribe)
        assert subscribe.packet_id == mid
        assert [(s.topic_filter, s.qos) for s in subscribe.subscriptions] == [("x/#", 2), ("y/+", 1)]
        server.send(Suback(mid, (2, 0x80)))
        assert _wait(events, "subscribe") == ("subscribe", mid, [2, 0x80])

        info = client.publish("a/b", b"hello", qos=1, properties=publish_props)
        publish = server.read(Publish)
        assert (publish.topic, publish.payload, publish.qos, publish.packet_id) == ("a/b", b"hello", 1, info.mid)
        if level == 5:
            assert publish.properties.message_expiry_interval == 30
            assert publish.properties.content_type == "text/plain"
        server.send(Puback(info.mid))
        assert _wait(events, "published") == ("published", info.mid)

        out_props = Properties(user_properties=(("k", "v"),)) if level == 5 else Properties()
        server.send(Publish("x/y", b"from-server", qos=1, packet_id=42, properties=out_props))
        assert _wait(events, "message") == ("message", "x/y", b"from-server", 1)
        assert server.read(Puback).packet_id == 42

        server.send(Publish("x/z", b"exactly-once", qos=2, packet_id=43))
        assert server.read(Pubrec).packet_id == 43
        server.send(Pubrel(43))
        assert server.read(Pubcomp).packet_id == 43
        assert _wait(events, "message") == ("message", "x/z", b"exactly-once", 2)

        client.disconnect()
        assert server.read(Disconnect).reason_code == 0
        server.sock.close()
    finally:
        client.loop_stop()
        listener.close()
