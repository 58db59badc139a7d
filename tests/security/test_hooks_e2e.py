"""The security modules composed the way the broker's hooks use them, driven by real
clients (mosquitto_pub/mosquitto_sub and paho) over TLS on 127.0.0.1.

`Gatekeeper` is a test double for the connection layer, a few lines per hook: TLS
handshake (mesh.tls), CONNECT -> Authenticator (mesh.auth, in a worker thread), PUBLISH
and SUBSCRIBE -> Acl (mesh.acl), a per-client publish TokenBucket (mesh.limits). It
proves the pieces interoperate with real clients: certificates, ciphers, and the
reason codes those clients report.
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
import threading
from dataclasses import dataclass, field

import paho.mqtt.client as mqtt
import pytest
import trio
import trustme
from paho.mqtt.enums import CallbackAPIVersion

from mesh.acl import Acl
from mesh.auth import Authenticator, ScryptParams, hash_password
from mesh.limits import TokenBucket
from mqtt import Decoder, RemoteProtocolError, encode
from mqtt.packets import Connack, Connect, Disconnect, Pingreq, Pingresp, Puback, Publish, Suback, Subscribe
from mqtt.reason_codes import ReasonCode
from mesh.tls import accept_tls, peer_common_name, server_context

FAST = ScryptParams(n=2**10, r=8, p=1)
ACL = """
acl_nomatch = "deny"
[[rule]]
permission = "allow"
action = "publish"
topics = ["users/%u/#"]
[[rule]]
permission = "allow"
action = "subscribe"
topics = ["public/#", "users/%u/#"]
"""


@dataclass
class Log:
    connacks: list[tuple[str | None, int]] = field(default_factory=list)
    published: list[tuple[str | None, str]] = field(default_factory=list)
    denied: list[tuple[str | None, str]] = field(default_factory=list)
    subacks: list[tuple[str, int]] = field(default_factory=list)


class Gatekeeper:
    def __init__(self, ctx: ssl.SSLContext, authn: Authenticator, acl: Acl, cn_as_username: bool = False,
                 publish_rate: tuple[float, float] = (1000, 1000)) -> None:
        self.ctx, self.authn, self.acl = ctx, authn, acl
        self.cn_as_username = cn_as_username
        self.publish_rate = publish_rate
        self.log = Log()

    async def handle(self, tcp: trio.SocketStream) -> None:
        ip = tcp.socket.getpeername()[0]
        stream = await accept_tls(tcp, self.ctx, timeout=10)  # the listener hook
        if stream is None:
            return  # bad certificate, plain text, too slow: already closed
        try:
            with trio.fail_after(10):
                await self._session(stream, ip)
        except (trio.BrokenResourceError, trio.TooSlowError, RemoteProtocolError):
            pass
        finally:
            with trio.move_on_after(1):
                await stream.aclose()

    async def _session(self, stream: trio.SSLStream, ip: str) -> None:
        decoder = Decoder(role="server")
        connect: Connect | None = None
        user: str | None = None
        bucket = TokenBucket(*self.publish_rate)
        while True:
            data = await stream.receive_some(65536)
            if not data:
                return
            decoder.feed(data)
            for packet in decoder:
                if isinstance(packet, Connect):
                    # The CONNECT hook.
                    if self.cn_as_username:
                        result = self.authn.accept_certificate(peer_common_name(stream), ip)
                    else:
                        result = await trio.to_thread.run_sync(
                            self.authn.check, packet.username, packet.password, ip, trio.current_time())
                    self.log.connacks.append((packet.username, result.reason_code))
                    await stream.send_all(encode(Connack(reason_code=result.reason_code), packet.protocol_level))
                    if not result.ok:
                        return
                    connect = packet
                    user = result.username
                elif isinstance(packet, Publish):
                    assert connect is not None
                    # The PUBLISH hook: rate, then ACL.
                    if not bucket.take(trio.current_time()):
                        code = ReasonCode.QUOTA_EXCEEDED
                    elif not self.acl.check("publish", packet.topic, username=user,
                                            client_id=connect.client_id, ip=ip):
                        code = ReasonCode.NOT_AUTHORIZED
                    else:
                        code = ReasonCode.SUCCESS
                    (self.log.published if code == 0 else self.log.denied).append((user, packet.topic))
                    if packet.qos == 1:
                        await stream.send_all(encode(Puback(packet.packet_id, code), connect.protocol_level))
                elif isinstance(packet, Subscribe):
                    assert connect is not None
                    # The SUBSCRIBE hook: one reason code per filter.
                    codes = []
                    for s in packet.subscriptions:
                        ok = self.acl.check("subscribe", s.topic_filter, username=user,
                                            client_id=connect.client_id, ip=ip)
                        codes.append(s.qos if ok else ReasonCode.NOT_AUTHORIZED)
                        self.log.subacks.append((s.topic_filter, codes[-1]))
                    await stream.send_all(encode(Suback(packet.packet_id, tuple(codes)), connect.protocol_level))
                elif isinstance(packet, Pingreq):
                    await stream.send_all(encode(Pingresp(), connect.protocol_level if connect else 4))
                elif isinstance(packet, Disconnect):
                    return


@dataclass
class Setup:
    port: int
    gate: Gatekeeper
    ca_file: str
    client_cert: str
    client_key: str


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    tmp = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("alice@example.org", common_name="alice")
    paths = {name: str(tmp / f"{name}.pem") for name in ("ca", "cert", "key", "client_cert", "client_key")}
    ca.cert_pem.write_to_path(paths["ca"])
    server.cert_chain_pems[0].write_to_path(paths["cert"])
    server.private_key_pem.write_to_path(paths["key"])
    client.cert_chain_pems[0].write_to_path(paths["client_cert"])
    client.private_key_pem.write_to_path(paths["client_key"])
    passwd = tmp / "passwd"
    passwd.write_text(f"alice:{hash_password('alice-pw', FAST)}\n")
    paths["passwd"] = str(passwd)
    return paths


@pytest.fixture
def gate_factory(pki: dict[str, str]):
    """Run a Gatekeeper on 127.0.0.1 in its own thread (blocking clients drive it)."""
    stops: list[tuple[trio.lowlevel.TrioToken, trio.CancelScope, threading.Thread]] = []

    def start(require_client_cert: bool = False, cn_as_username: bool = False, **kw) -> Setup:
        ctx = server_context(pki["cert"], pki["key"], pki["ca"], require_client_cert)
        authn = Authenticator(allow_anonymous=False, password_file=pki["passwd"], fail_rate=0.01, fail_burst=2)
        gate = Gatekeeper(ctx, authn, Acl.from_toml_text(ACL), cn_as_username, **kw)
        ready = threading.Event()
        box: dict = {}

        async def main() -> None:
            with trio.CancelScope() as scope:
                box["scope"], box["token"] = scope, trio.lowlevel.current_trio_token()
                listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
                box["port"] = listeners[0].socket.getsockname()[1]
                ready.set()
                await trio.serve_listeners(gate.handle, listeners)

        thread = threading.Thread(target=trio.run, args=(main,), daemon=True)
        thread.start()
        assert ready.wait(10)
        stops.append((box["token"], box["scope"], thread))
        return Setup(box["port"], gate, pki["ca"], pki["client_cert"], pki["client_key"])

    yield start
    for token, scope, thread in stops:
        trio.from_thread.run_sync(scope.cancel, trio_token=token)
        thread.join(10)


needs_mosquitto = pytest.mark.skipif(shutil.which("mosquitto_pub") is None, reason="mosquitto-clients not installed")


def mosquitto_pub(setup: Setup, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["mosquitto_pub", "-h", "localhost", "-p", str(setup.port), "--cafile", setup.ca_file, "-i", "pubber", *args],
        capture_output=True, text=True, timeout=20,
    )


@needs_mosquitto
@pytest.mark.parametrize("version", ["mqttv311", "mqttv5"])
def test_mosquitto_pub_over_tls_with_password(gate_factory, version: str) -> None:
    setup = gate_factory()
    proc = mosquitto_pub(setup, "-V", version, "-u", "alice", "-P", "alice-pw", "-t", "users/alice/x", "-m", "hi", "-q", "1")
    assert proc.returncode == 0, proc.stderr
    assert setup.gate.log.connacks == [("alice", 0)]
    assert setup.gate.log.published == [("alice", "users/alice/x")]


@needs_mosquitto
@pytest.mark.parametrize(("version", "needle"), [("mqttv311", "bad user name or password"), ("mqttv5", "bad user name or password")])
def test_mosquitto_pub_wrong_password_is_refused(gate_factory, version: str, needle: str) -> None:
    setup = gate_factory()
    proc = mosquitto_pub(setup, "-V", version, "-u", "alice", "-P", "nope", "-t", "users/alice/x", "-m", "hi")
    assert proc.returncode != 0
    assert needle in proc.stderr.lower()
    assert setup.gate.log.connacks == [("alice", 0x86)]
    assert setup.gate.log.published == []


@needs_mosquitto
def test_mosquitto_pub_without_credentials_is_not_authorized(gate_factory) -> None:
    setup = gate_factory()
    proc = mosquitto_pub(setup, "-V", "mqttv311", "-t", "users/alice/x", "-m", "hi")
    assert proc.returncode != 0
    assert "not authori" in proc.stderr.lower()
    assert setup.gate.log.connacks == [(None, 0x87)]


@needs_mosquitto
def test_mosquitto_pub_denied_topic_gets_0x87_puback(gate_factory) -> None:
    setup = gate_factory()
    proc = mosquitto_pub(setup, "-V", "mqttv5", "-u", "alice", "-P", "alice-pw", "-t", "users/bob/x", "-m", "hi", "-q", "1", "-d")
    # mosquitto_pub reports the PUBACK's reason code (0x87 = 135) in its debug output.
    assert "received PUBACK (Mid: 1, RC:135)" in proc.stdout, proc.stdout
    assert setup.gate.log.denied == [("alice", "users/bob/x")]


@needs_mosquitto
def test_mosquitto_pub_with_client_certificate_cn_as_username(gate_factory) -> None:
    setup = gate_factory(require_client_cert=True, cn_as_username=True)
    proc = mosquitto_pub(setup, "-V", "mqttv5", "--cert", setup.client_cert, "--key", setup.client_key,
                         "-t", "users/alice/cert", "-m", "hi", "-q", "1")
    assert proc.returncode == 0, proc.stderr
    assert setup.gate.log.published == [("alice", "users/alice/cert")]
    # Without the certificate, the handshake fails and nothing reaches MQTT.
    proc = mosquitto_pub(setup, "-V", "mqttv5", "-t", "users/alice/cert", "-m", "hi")
    assert proc.returncode != 0
    assert len(setup.gate.log.connacks) == 1


@needs_mosquitto
@pytest.mark.parametrize("version", ["mqttv311", "mqttv5"])
def test_mosquitto_sub_denied_subscription(gate_factory, version: str) -> None:
    setup = gate_factory()
    proc = subprocess.run(
        ["mosquitto_sub", "-h", "localhost", "-p", str(setup.port), "--cafile", setup.ca_file, "-V", version,
         "-u", "alice", "-P", "alice-pw", "-t", "users/bob/#", "-W", "5"],
        capture_output=True, text=True, timeout=20,
    )
    # mosquitto_sub gives up at once (exit status 0) with this message.
    assert "all subscription requests were denied" in proc.stderr.lower()
    assert setup.gate.log.subacks == [("users/bob/#", 0x87)]


def _paho(setup: Setup, protocol: int, cert: bool = False) -> mqtt.Client:
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="paho-sec", protocol=protocol)
    client.tls_set(ca_certs=setup.ca_file,
                   certfile=setup.client_cert if cert else None,
                   keyfile=setup.client_key if cert else None)
    return client


@pytest.mark.parametrize("protocol", [mqtt.MQTTv311, mqtt.MQTTv5])
def test_paho_subscribe_acl_over_tls(gate_factory, protocol: int) -> None:
    setup = gate_factory()
    client = _paho(setup, protocol)
    client.username_pw_set("alice", "alice-pw")
    granted: list = []
    done = threading.Event()

    def on_subscribe(client, userdata, mid, reason_codes, properties) -> None:  # noqa: ANN001
        granted.extend(int(getattr(rc, "value", rc)) for rc in reason_codes)
        done.set()

    client.on_subscribe = on_subscribe
    client.connect("localhost", setup.port)
    client.loop_start()
    try:
        client.subscribe([("public/#", 1), ("#", 0), ("users/alice/+", 0), ("users/bob/#", 0)])
        assert done.wait(10)
    finally:
        client.disconnect()
        client.loop_stop()
    denied = 0x87 if protocol == mqtt.MQTTv5 else 0x80
    assert granted == [1, denied, 0, denied]
    assert [code for _, code in setup.gate.log.subacks] == [1, 0x87, 0, 0x87]


def test_paho_bad_password_reason_codes(gate_factory) -> None:
    setup = gate_factory()
    results: dict[int, int] = {}
    for protocol in (mqtt.MQTTv311, mqtt.MQTTv5):
        client = _paho(setup, protocol)
        client.username_pw_set("alice", "wrong")
        connected = threading.Event()

        def on_connect(client, userdata, flags, reason_code, properties, protocol=protocol) -> None:  # noqa: ANN001
            results[protocol] = reason_code.value
            connected.set()

        client.on_connect = on_connect
        client.connect("localhost", setup.port)
        client.loop_start()
        try:
            assert connected.wait(10)
        finally:
            client.disconnect()
            client.loop_stop()
    # paho reports v3 return code 4 as the v5 code 0x86 too (its ReasonCode mapping).
    assert results[mqtt.MQTTv5] == 0x86
    assert results[mqtt.MQTTv311] in (4, 0x86)
    assert setup.gate.log.connacks == [("alice", 0x86), ("alice", 0x86)]


def test_failure_budget_then_rate_limited(gate_factory) -> None:
    """fail_burst=2: the third attempt from 127.0.0.1 is refused before hashing (0x9F)."""
    setup = gate_factory()
    codes = []
    for password in ("a", "b", "alice-pw"):
        client = _paho(setup, mqtt.MQTTv5)
        client.username_pw_set("alice", password)
        got = threading.Event()
        client.on_connect = lambda c, u, f, rc, p: (codes.append(rc.value), got.set())  # noqa: ARG005
        client.connect("localhost", setup.port)
        client.loop_start()
        try:
            assert got.wait(10)
        finally:
            client.disconnect()
            client.loop_stop()
    assert codes == [0x86, 0x86, 0x9F]


def test_plain_mqtt_on_the_tls_port_is_closed(gate_factory) -> None:
    setup = gate_factory()
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="plain", protocol=mqtt.MQTTv311)
    client.username_pw_set("alice", "alice-pw")
    try:
        client.connect("localhost", setup.port, keepalive=5)
        for _ in range(50):
            client.loop(0.1)
    except Exception:
        pass
    assert not client.is_connected()
    assert setup.gate.log.connacks == []


def test_publish_rate_limit_hook(gate_factory) -> None:
    setup = gate_factory(publish_rate=(0.001, 3))
    client = _paho(setup, mqtt.MQTTv5)
    client.username_pw_set("alice", "alice-pw")
    acks: list[int] = []
    five = threading.Event()

    def on_publish(client, userdata, mid, reason_code, properties) -> None:  # noqa: ANN001
        acks.append(reason_code.value)
        if len(acks) == 5:
            five.set()

    client.on_publish = on_publish
    client.connect("localhost", setup.port)
    client.loop_start()
    try:
        for i in range(5):
            client.publish(f"users/alice/{i}", b"x", qos=1)
        assert five.wait(10)
    finally:
        client.disconnect()
        client.loop_stop()
    assert len(setup.gate.log.published) == 3  # the burst; then the bucket is empty
    assert sorted(acks) == [0, 0, 0, 0x97, 0x97]
