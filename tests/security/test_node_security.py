"""Security and limits on a real node with real clients (paho, mosquitto_pub/sub)."""

from __future__ import annotations

import queue
import re
import ssl
import subprocess
import time
import urllib.error
import urllib.request

import pytest
import trustme

from mesh.http_client import request_json
from tests.support import Client, run_cli


def write_passwords(path, **users) -> str:
    for user, password in users.items():
        out = run_cli(["passwd", str(path), user, "--password", password])
        assert out.returncode == 0, out.stderr
    return str(path)


def connack_code(port: int, version: int, **kw) -> int:
    """Connect with a raw socket and return the CONNACK reason code (v5) or the v3.1.1
    return code byte as it is on the wire (paho would translate it to a v5 code)."""
    import socket

    from mqtt import Connect, Decoder, encode

    password = kw.get("password")
    connect = Connect(client_id=kw.get("client_id", "probe"), username=kw.get("username"),
                      password=password.encode() if password is not None else None, protocol_level=version)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(encode(connect, version))
        data = b""
        while len(data) < 4 or (version == 5 and len(data) < 2 + data[1]):
            chunk = s.recv(256)
            if not chunk:
                break
            data += chunk
    if version == 4:
        assert data[:2] == b"\x20\x02", data
        return data[3]
    decoder = Decoder(role="client", protocol_level=5)
    decoder.feed(data)
    return decoder.next_packet().reason_code


@pytest.fixture
def secured(node_factory, tmp_path):
    pw = write_passwords(tmp_path / "passwd", alice="wonderland", bob="builder")
    acl = tmp_path / "acl.toml"
    acl.write_text(
        'acl_nomatch = "deny"\n'
        '[[rule]]\npermission = "allow"\nuser = "alice"\naction = "all"\ntopics = ["alice/#", "shared/#"]\n'
        '[[rule]]\npermission = "allow"\nuser = "bob"\naction = "subscribe"\ntopics = ["shared/#", "%u/inbox"]\n'
        '[[rule]]\npermission = "allow"\nuser = "bob"\naction = "publish"\ntopics = ["bob/#"]\n'
    )
    node = node_factory(allow_anonymous=False, password_file=pw, acl_file=str(acl))
    return node, tmp_path


@pytest.mark.parametrize("version, bad, missing", [(5, 0x86, 0x87), (4, 4, 5)])
def test_credentials_checked(secured, version, bad, missing):
    node, _ = secured
    assert connack_code(node.mqtt_port, version, username="alice", password="wonderland") == 0
    assert connack_code(node.mqtt_port, version, username="alice", password="wrong") == bad
    assert connack_code(node.mqtt_port, version, username="mallory", password="x") == bad
    assert connack_code(node.mqtt_port, version) == missing
    text = urllib.request.urlopen(f"http://127.0.0.1:{node.ports['http']}/metrics", timeout=5).read().decode()
    assert re.search(r'^meshd_auth_total\{outcome="bad_credentials"\} 2$', text, re.M)


def test_mosquitto_clients_with_credentials(secured):
    node, _ = secured
    port = str(node.mqtt_port)
    sub = subprocess.Popen(["mosquitto_sub", "-h", "127.0.0.1", "-p", port, "-u", "alice", "-P", "wonderland",
                            "-t", "alice/#", "-C", "1", "-v", "-W", "15"], stdout=subprocess.PIPE, text=True)
    time.sleep(0.8)
    subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p", port, "-u", "alice", "-P", "wonderland",
                    "-t", "alice/x", "-m", "hi", "-q", "1"], check=True, timeout=15)
    out, _ = sub.communicate(timeout=20)
    assert out.strip() == "alice/x hi"
    refused = subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p", port, "-u", "alice", "-P", "nope",
                              "-t", "alice/x", "-m", "hi"], capture_output=True, text=True, timeout=15)
    assert refused.returncode != 0


def login(node, user, password, version=5, client_id=None):
    c = Client(client_id or f"{user}-{version}-{time.monotonic_ns()}", version=version)
    c.c.username_pw_set(user, password)
    c.connect(node.mqtt_port)
    return c


def test_acl_subscribe_and_publish(secured):
    node, _ = secured
    bob5 = login(node, "bob", "builder")
    codes = [rc.value for rc in bob5.subscribe("shared/news", 1)]
    assert codes == [1]
    assert [rc.value for rc in bob5.subscribe("alice/#", 1)] == [0x87]
    assert [rc.value for rc in bob5.subscribe("bob/inbox", 1)] == [1]  # %u substitution
    bob4 = login(node, "bob", "builder", version=4)
    assert [rc.value for rc in bob4.subscribe("alice/#", 1)] == [0x80]  # v3.1.1 SUBACK failure
    # v5 publish refused with PUBACK 0x87; the message goes nowhere.
    alice = login(node, "alice", "wonderland")
    alice.subscribe("alice/#", 1)
    info = bob5.publish("alice/secret", b"x", qos=1, wait=False)
    info.wait_for_publish(5)
    alice.expect_none(0.3)
    allowed = alice.publish("shared/news", b"ok", qos=1)
    assert allowed.is_published()
    assert bob5.expect(1)[0].payload == b"ok"
    text = urllib.request.urlopen(f"http://127.0.0.1:{node.ports['http']}/metrics", timeout=5).read().decode()
    assert re.search(r'^meshd_acl_denied_total\{action="publish"\} [1-9]', text, re.M)


def test_puback_0x87_for_denied_publish(secured):
    from mqtt import Connect, Puback, Publish
    from tests.mesh.test_broker_raw import Raw

    node, _ = secured
    raw = Raw(node.mqtt_port)
    raw.connect(client_id="bob-raw", username="bob", password=b"builder")
    raw.send(Publish(topic="alice/x", payload=b"no", qos=1, packet_id=3))
    ack = raw.recv()
    assert isinstance(ack, Puback) and ack.reason_code == 0x87


def test_will_on_a_forbidden_topic_is_refused(secured):
    node, _ = secured
    c = Client("bob-will", version=5)
    c.c.username_pw_set("bob", "builder")
    c.c.will_set("alice/will", b"x", 1)
    with pytest.raises(ConnectionError, match="Not authorized"):
        c.connect(node.mqtt_port)


def test_retained_obeys_acl(secured):
    node, _ = secured
    alice = login(node, "alice", "wonderland")
    alice.publish("alice/state", b"private", qos=1, retain=True)
    bob = login(node, "bob", "builder")
    assert [rc.value for rc in bob.subscribe("alice/state", 1)] == [0x87]
    bob.expect_none(0.3)


def test_password_file_reloaded_when_it_changes(secured):
    node, tmp_path = secured
    assert connack_code(node.mqtt_port, 5, username="carol", password="new") == 0x86
    write_passwords(tmp_path / "passwd", carol="new")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if connack_code(node.mqtt_port, 5, username="carol", password="new") == 0:
            return
        time.sleep(0.5)
    raise AssertionError("the new password file was not picked up")


@pytest.fixture(scope="module")
def pki():
    ca = trustme.CA()
    server = ca.issue_cert("localhost", "127.0.0.1")
    client = ca.issue_cert("alice@example", common_name="alice")
    return ca, server, client


def tls_files(tmp_path, pki):
    ca, server, client = pki
    paths = {}
    for name, blob in (("ca.pem", ca.cert_pem), ("cert.pem", server.cert_chain_pems[0]), ("key.pem", server.private_key_pem),
                       ("client.pem", client.cert_chain_pems[0]), ("client.key", client.private_key_pem)):
        path = tmp_path / name
        blob.write_to_path(str(path))
        paths[name] = str(path)
    return paths


def test_mqtts_and_wss(node_factory, tmp_path, pki):
    f = tls_files(tmp_path, pki)
    node = node_factory(mqtts="127.0.0.1:0", wss="127.0.0.1:0", tls_cert=f["cert.pem"], tls_key=f["key.pem"])
    for transport, port in (("tcp", node.ports["mqtts"]), ("websockets", node.ports["wss"])):
        sub = Client(f"tls-sub-{transport}", version=5, transport=transport)
        sub.c.tls_set(ca_certs=f["ca.pem"])
        sub.connect(port, host="localhost")
        sub.subscribe("secure/#", 1)
        out = subprocess.run(["mosquitto_pub", "-h", "localhost", "-p", str(node.ports["mqtts"]), "--cafile", f["ca.pem"],
                              "-t", "secure/x", "-m", transport, "-q", "1"], capture_output=True, text=True, timeout=15)
        assert out.returncode == 0, out.stderr
        assert sub.expect(1)[0].payload == transport.encode()
    # Plain MQTT on the TLS port is closed cleanly; the node keeps serving.
    import socket

    from mqtt import Connect, encode

    # The handshake fails on the first byte: the node closes the socket without a
    # word (no CONNACK, no TLS alert). A reset instead of a FIN is a close too: the
    # kernel sends one when the node closes with our bytes still unread.
    with socket.create_connection(("127.0.0.1", node.ports["mqtts"]), timeout=5) as s:
        s.sendall(encode(Connect(client_id="plain"), 4))
        try:
            answer = s.recv(100)
        except ConnectionResetError:
            answer = b""
        assert answer == b""
    again = Client("after-plain", version=5)
    again.c.tls_set(ca_certs=f["ca.pem"])
    again.connect(node.ports["mqtts"], host="localhost")


def test_client_certificate_cn_is_the_user_name(node_factory, tmp_path, pki):
    f = tls_files(tmp_path, pki)
    acl = tmp_path / "acl.toml"
    acl.write_text('acl_nomatch = "deny"\n[[rule]]\npermission = "allow"\nuser = "alice"\ntopics = ["alice/#"]\n')
    node = node_factory(mqtts="127.0.0.1:0", tls_cert=f["cert.pem"], tls_key=f["key.pem"], tls_ca=f["ca.pem"],
                        tls_require_client_cert=True, tls_cn_as_username=True, acl_file=str(acl), allow_anonymous=False)
    c = Client("cert-client", version=5)
    c.c.tls_set(ca_certs=f["ca.pem"], certfile=f["client.pem"], keyfile=f["client.key"])
    c.connect(node.ports["mqtts"], host="localhost")
    assert [rc.value for rc in c.subscribe("alice/#", 1)] == [1]
    assert [rc.value for rc in c.subscribe("other/#", 1)] == [0x87]
    nocert = Client("no-cert", version=5)
    nocert.c.tls_set(ca_certs=f["ca.pem"])
    # TLS 1.3: the refusal may surface at connect or as a connection that never gets
    # a CONNACK; either way no session is opened without a certificate.
    with pytest.raises((ssl.SSLError, OSError, ConnectionError, queue.Empty)):
        nocert.connect(node.ports["mqtts"], host="localhost")
    assert node.call(lambda: "no-cert" in node.node.broker.connections) is False


def test_limits(node_factory):
    node = node_factory(max_connections=2, max_subscriptions_per_client=2, max_topic_levels=4)
    a = Client("a", version=5)
    a.connect(node.mqtt_port)
    b = Client("b", version=5)
    b.connect(node.mqtt_port)
    assert connack_code(node.mqtt_port, 5, client_id="c") == 0x97
    codes = [rc.value for rc in a.subscribe("x/1", 0)] + [rc.value for rc in a.subscribe("x/2", 0)] + [rc.value for rc in a.subscribe("x/3", 0)]
    assert codes == [0, 0, 0x97]
    assert [rc.value for rc in b.subscribe("1/2/3/4/5", 0)] == [0x8F]
    text = urllib.request.urlopen(f"http://127.0.0.1:{node.ports['http']}/metrics", timeout=5).read().decode()
    for limit in ("max_connections", "max_subscriptions_per_client", "max_topic_levels"):
        assert re.search(rf'^meshd_limits_hit_total\{{limit="{limit}"\}} 1$', text, re.M), limit


def test_connection_rate_and_memory_guard(node_factory):
    node = node_factory(connection_rate=1)
    assert connack_code(node.mqtt_port, 5, client_id="r1") == 0
    assert connack_code(node.mqtt_port, 5, client_id="r2") == 0x9F
    node2 = node_factory(memory_limit=1)
    assert connack_code(node2.mqtt_port, 5, client_id="m1") == 0x89


def test_publish_rate_slows_the_client_down(node_factory):
    node = node_factory(publish_rate=20)
    sub = Client("s", version=5)
    sub.connect(node.mqtt_port)
    sub.subscribe("rate", 0)
    pub = Client("p", version=5)
    pub.connect(node.mqtt_port)
    t0 = time.monotonic()
    for i in range(30):
        pub.publish("rate", b"x", qos=1)
    assert len(sub.expect(30)) == 30  # nothing is lost, it is only slowed
    assert time.monotonic() - t0 >= 0.4  # 30 messages at 20/s after a burst of 20
    hits = node.call(lambda: node.node.security.limits_hit["publish_rate"])
    assert hits >= 5


def test_api_token(node_factory):
    node = node_factory(api_token="s3cret")
    addr = f"127.0.0.1:{node.ports['http']}"
    status, _ = request_json(addr, "PUT", "/api/v1/config/max_inflight", {"value": 5})
    assert status == 401
    status, _ = request_json(addr, "GET", "/api/v1/status")
    assert status == 401
    status, body = request_json(addr, "PUT", "/api/v1/config/max_inflight", {"value": 5}, token="s3cret")
    assert status == 200 and body["value"] == 5
    out = run_cli(["ctl", "--http", addr, "--token", "s3cret", "config", "get", "max_inflight"])
    assert out.returncode == 0 and "max_inflight" in out.stdout
    open_reads = node_factory(api_token="s3cret", api_open_reads=True)
    status, _ = request_json(f"127.0.0.1:{open_reads.ports['http']}", "GET", "/api/v1/status")
    assert status == 200


def test_sighup_reloads_the_acl(tmp_path):
    import signal

    from tests.support import MeshdProcess

    acl = tmp_path / "acl.toml"
    acl.write_text('[[rule]]\npermission = "deny"\naction = "subscribe"\ntopics = ["a/#"]\n')
    with MeshdProcess(str(tmp_path / "d"), "--acl-file", str(acl)) as node:
        c = Client("hup", version=5)
        c.connect(node.port)
        assert [rc.value for rc in c.subscribe("a/1", 0)] == [0x87]
        acl.write_text('[[rule]]\npermission = "deny"\naction = "subscribe"\ntopics = ["b/#"]\n')
        node.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if [rc.value for rc in c.subscribe("a/1", 0)] == [0]:
                break
            time.sleep(0.2)
        assert [rc.value for rc in c.subscribe("a/1", 0)] == [0]  # the live connection sees the new rules
        assert [rc.value for rc in c.subscribe("b/1", 0)] == [0x87]
        assert node.proc.poll() is None  # SIGHUP does not stop the node


def test_protocol_limits_are_counted(node_factory):
    from mqtt import Properties, Publish
    from tests.mesh.test_broker_raw import Raw, recv_until_close

    node = node_factory(max_packet_size=256, topic_alias_maximum=1, max_inflight=1)
    raw = Raw(node.mqtt_port)
    raw.connect(client_id="big")
    raw.send(Publish(topic="t", payload=b"x" * 1000))
    assert recv_until_close(raw)[-1].reason_code == 0x95
    raw = Raw(node.mqtt_port)
    raw.connect(client_id="alias")
    raw.send(Publish(topic="t", payload=b"x", properties=Properties(topic_alias=2)))
    assert recv_until_close(raw)[-1].reason_code == 0x94
    sub = Client("window", version=5)
    sub.connect(node.mqtt_port)
    sub.subscribe("w", 1)
    pub = Client("p", version=5)
    pub.connect(node.mqtt_port)
    for i in range(5):
        pub.publish("w", b"x", qos=1, wait=False)
    sub.expect(5)
    text = urllib.request.urlopen(f"http://127.0.0.1:{node.ports['http']}/metrics", timeout=5).read().decode()
    for limit in ("max_packet_size", "topic_alias_maximum"):
        assert re.search(rf'^meshd_limits_hit_total\{{limit="{limit}"\}} 1$', text, re.M), limit
    assert re.search(r'^meshd_limits_hit_total\{limit="max_inflight"\} [1-9]', text, re.M)
