"""Interop with the mosquitto command-line clients (libmosquitto, a C implementation).

mosquitto_pub publishes to, and mosquitto_sub subscribes at, a codec-driven server on
127.0.0.1; each exits on its own once the exchange is complete.
"""

from __future__ import annotations

import socket
import subprocess

import pytest

from mqtt import (
    Connack,
    Connect,
    Disconnect,
    Puback,
    Publish,
    Suback,
    Subscribe,
)

from .helpers import TIMEOUT, CodecServer

VERSIONS = {3: "mqttv31", 4: "mqttv311", 5: "mqttv5"}


def _listener() -> tuple[socket.socket, int]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(TIMEOUT)
    return listener, listener.getsockname()[1]


@pytest.mark.parametrize("level", [3, 4, 5])
def test_mosquitto_pub(level):
    listener, port = _listener()
    cmd = ["mosquitto_pub", "-h", "127.0.0.1", "-p", str(port), "-V", VERSIONS[level],
           "-i", "mosq-pub", "-u", "who", "-P", "pw", "-t", "m/q", "-m", "payload", "-q", "1", "-r"]
    if level == 5:
        cmd += ["-D", "publish", "user-property", "k", "v", "-D", "connect", "session-expiry-interval", "7"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        server = CodecServer(listener, level)
        connect = server.read(Connect)
        assert (connect.client_id, connect.username, connect.password, connect.protocol_level) == (
            "mosq-pub", "who", b"pw", level)
        assert connect.protocol_name == ("MQIsdp" if level == 3 else "MQTT")
        if level == 5:
            assert connect.properties.session_expiry_interval == 7
        server.send(Connack())
        publish = server.read(Publish)
        assert (publish.topic, publish.payload, publish.qos, publish.retain) == ("m/q", b"payload", 1, True)
        if level == 5:
            assert publish.properties.user_properties == (("k", "v"),)
        server.send(Puback(publish.packet_id))
        server.read(Disconnect)
        assert proc.wait(timeout=TIMEOUT) == 0, proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()
        listener.close()


@pytest.mark.parametrize("level", [3, 4, 5])
def test_mosquitto_sub(level):
    listener, port = _listener()
    cmd = ["mosquitto_sub", "-h", "127.0.0.1", "-p", str(port), "-V", VERSIONS[level],
           "-i", "mosq-sub", "-t", "s/#", "-q", "2", "-C", "2", "-v"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        server = CodecServer(listener, level)
        assert server.read(Connect).client_id == "mosq-sub"
        server.send(Connack())
        subscribe = server.read(Subscribe)
        assert [(s.topic_filter, s.qos) for s in subscribe.subscriptions] == [("s/#", 2)]
        server.send(Suback(subscribe.packet_id, (1,)))
        server.send(Publish("s/one", b"first"))
        server.send(Publish("s/two/ü", "zweite".encode(), qos=1, packet_id=9))
        assert server.read(Puback).packet_id == 9
        out, err = proc.communicate(timeout=TIMEOUT)
        assert out.splitlines() == ["s/one first", "s/two/ü zweite"], err
    finally:
        proc.kill()
        proc.wait()
        listener.close()
