"""TLS server contexts (mesh/tls.py): clear errors, and real handshakes on 127.0.0.1."""

from __future__ import annotations

import datetime
import logging
import ssl
from dataclasses import dataclass, field
from typing import Any
from pathlib import Path

import pytest
import trio
import trustme
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from mesh.tls import TLS12_CIPHERS, TlsConfigError, accept_tls, peer_common_name, server_context


@dataclass
class Pki:
    ca: trustme.CA
    cert: str
    key: str
    ca_file: str
    client: trustme.LeafCert  # CN "alice", signed by `ca`
    tmp: Path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    tmp = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    cert, key, ca_file = tmp / "server.pem", tmp / "server.key", tmp / "ca.pem"
    server.cert_chain_pems[0].write_to_path(str(cert))
    for extra in server.cert_chain_pems[1:]:
        extra.write_to_path(str(cert), append=True)
    server.private_key_pem.write_to_path(str(key))
    ca.cert_pem.write_to_path(str(ca_file))
    client = ca.issue_cert("alice@example.org", common_name="alice")
    return Pki(ca, str(cert), str(key), str(ca_file), client, tmp)


# --- the context ------------------------------------------------------------------


def test_context_is_tls12_plus_with_modern_ciphers(pki: Pki) -> None:
    ctx = server_context(pki.cert, pki.key, None, False)
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2
    assert ctx.verify_mode == ssl.CERT_NONE
    names = {c["name"] for c in ctx.get_ciphers()}
    tls12 = {c["name"] for c in ctx.get_ciphers() if c["protocol"] == "TLSv1.2"}
    assert tls12 and tls12 <= set(TLS12_CIPHERS.split(":"))
    assert not any("CBC" in n or "RC4" in n or "3DES" in n or n.startswith("AES") for n in tls12)
    assert "TLS_AES_128_GCM_SHA256" in names or "TLS_AES_256_GCM_SHA384" in names
    assert ctx.options & ssl.OP_NO_COMPRESSION


def test_verify_modes(pki: Pki) -> None:
    assert server_context(pki.cert, pki.key, pki.ca_file, False).verify_mode == ssl.CERT_OPTIONAL
    assert server_context(pki.cert, pki.key, pki.ca_file, True).verify_mode == ssl.CERT_REQUIRED


def _write(pki: Pki, name: str, data: bytes | str) -> str:
    path = pki.tmp / name
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return str(path)


def test_errors_name_the_setting(pki: Pki) -> None:
    other_key = _write(pki, "other.key", trustme.CA().issue_cert("x").private_key_pem.bytes())
    garbage_key = _write(pki, "garbage.key", "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
    garbage_cert = _write(pki, "garbage.pem", "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
    cases = [
        ((str(pki.tmp / "missing.pem"), pki.key, None, False), r"^tls_cert .*missing\.pem: no such file"),
        ((pki.cert, str(pki.tmp / "missing.key"), None, False), r"^tls_key .*: no such file"),
        ((pki.key, pki.key, None, False), r"^tls_cert .*: no certificate found"),
        ((pki.cert, pki.cert, None, False), r"^tls_key .*: no private key found"),
        ((garbage_cert, pki.key, None, False), r"^tls_cert .*: not a valid PEM certificate"),
        ((pki.cert, garbage_key, None, False), r"^tls_key .*: not a usable private key"),
        ((pki.cert, other_key, None, False), r"^tls_key .* does not belong to the certificate in tls_cert"),
        ((pki.cert, pki.key, None, True), r"^tls_require_client_cert needs tls_ca"),
        ((pki.cert, pki.key, str(pki.tmp / "nope.pem"), False), r"^tls_ca .*: no such file"),
        ((pki.cert, pki.key, pki.key, False), r"^tls_ca .*: no CA certificate found"),
        ((str(pki.tmp), pki.key, None, False), r"^tls_cert .*: is a directory"),
        (("", pki.key, None, False), r"^tls_cert is empty"),
    ]
    for args, message in cases:
        with pytest.raises(TlsConfigError, match=message):
            server_context(*args)


def test_encrypted_key_is_refused_without_prompting(pki: Pki) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"passphrase"),
    )
    path = _write(pki, "encrypted.key", pem)
    with pytest.raises(TlsConfigError, match=r"^tls_key .*encrypted"):
        server_context(pki.cert, path)


def test_expired_certificate_is_logged(pki: Pki, caplog: pytest.LogCaptureFixture) -> None:
    past = datetime.datetime(2020, 1, 1, tzinfo=datetime.timezone.utc)
    old = pki.ca.issue_cert("localhost", not_before=past, not_after=past + datetime.timedelta(days=1))
    cert = _write(pki, "old.pem", old.cert_chain_pems[0].bytes())
    key = _write(pki, "old.key", old.private_key_pem.bytes())
    caplog.set_level(logging.WARNING, logger="mesh.tls")
    server_context(cert, key)
    assert "tls_cert" in caplog.text and "expired" in caplog.text


def test_peer_common_name_without_a_certificate() -> None:
    class NoCert:
        def getpeercert(self) -> dict:
            return {}

    class NotYet:
        def getpeercert(self) -> dict:
            raise ValueError("handshake not done")

    assert peer_common_name(NoCert()) is None
    assert peer_common_name(NotYet()) is None
    assert peer_common_name(object()) is None


def test_peer_common_name_takes_the_last_cn() -> None:
    class Cert:
        def getpeercert(self) -> dict:
            return {"subject": ((("organizationName", "x"),), (("commonName", "first"),), (("commonName", "last"),))}

    assert peer_common_name(Cert()) == "last"


# --- real handshakes --------------------------------------------------------------


@dataclass
class Seen:
    cn: str | None = None
    version: str | None = None
    cipher: str | None = None
    echoed: bytes = b""
    error: BaseException | None = None


async def _serve_once(ctx: ssl.SSLContext, seen: Seen, task_status=trio.TASK_STATUS_IGNORED) -> None:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    task_status.started(port)
    stream = await listeners[0].accept()
    tls = trio.SSLStream(stream, ctx, server_side=True)
    try:
        with trio.fail_after(5):
            await tls.do_handshake()
            seen.cn = peer_common_name(tls)
            seen.version = tls.version()
            seen.cipher = tls.cipher()[0]
            data = await tls.receive_some(100)
            seen.echoed = data
            await tls.send_all(data.upper())
            await tls.aclose()
    except (trio.BrokenResourceError, trio.ClosedResourceError) as e:
        seen.error = e
        await stream.aclose()
    finally:
        for listener in listeners:
            await listener.aclose()


def _client_ctx(pki: Pki, *, with_cert: trustme.LeafCert | None = None, max_version: ssl.TLSVersion | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    pki.ca.configure_trust(ctx)
    if with_cert is not None:
        with_cert.configure_cert(ctx)
    if max_version is not None:
        ctx.maximum_version = max_version
    return ctx


async def _client(port: int, ctx: ssl.SSLContext) -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    tls = trio.SSLStream(stream, ctx, server_hostname="localhost")
    try:
        with trio.fail_after(5):
            await tls.send_all(b"hello mqtts")
            return await tls.receive_some(100)
    finally:
        with trio.move_on_after(1):
            await tls.aclose()


async def test_handshake_with_client_certificate_gives_the_cn(pki: Pki) -> None:
    seen = Seen()
    ctx = server_context(pki.cert, pki.key, pki.ca_file, require_client_cert=True)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(_serve_once, ctx, seen)
        reply = await _client(port, _client_ctx(pki, with_cert=pki.client))
    assert reply == b"HELLO MQTTS"
    assert seen.error is None
    assert seen.cn == "alice"
    assert seen.version in ("TLSv1.2", "TLSv1.3")


async def test_tls12_client_gets_a_modern_cipher(pki: Pki) -> None:
    seen = Seen()
    ctx = server_context(pki.cert, pki.key)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(_serve_once, ctx, seen)
        reply = await _client(port, _client_ctx(pki, max_version=ssl.TLSVersion.TLSv1_2))
    assert reply == b"HELLO MQTTS"
    assert seen.version == "TLSv1.2"
    assert seen.cipher in TLS12_CIPHERS.split(":")
    assert seen.cn is None  # no client certificate asked for


async def test_optional_client_certificate(pki: Pki) -> None:
    seen = Seen()
    ctx = server_context(pki.cert, pki.key, pki.ca_file, require_client_cert=False)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(_serve_once, ctx, seen)
        reply = await _client(port, _client_ctx(pki))
    assert reply == b"HELLO MQTTS"
    assert seen.cn is None


async def _expect_refused(ctx: ssl.SSLContext, client_ctx: ssl.SSLContext) -> Seen:
    seen = Seen()
    async with trio.open_nursery() as nursery:
        port = await nursery.start(_serve_once, ctx, seen)
        with pytest.raises((trio.BrokenResourceError, ssl.SSLError)):
            await _client(port, client_ctx)
    assert isinstance(seen.error, trio.BrokenResourceError)
    assert seen.cn is None and seen.echoed == b""
    return seen


async def test_missing_client_certificate_is_refused(pki: Pki) -> None:
    await _expect_refused(server_context(pki.cert, pki.key, pki.ca_file, True), _client_ctx(pki))


async def test_client_certificate_from_another_ca_is_refused(pki: Pki) -> None:
    stranger = trustme.CA().issue_cert("mallory@example.org", common_name="alice")
    await _expect_refused(server_context(pki.cert, pki.key, pki.ca_file, True), _client_ctx(pki, with_cert=stranger))


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1:DeprecationWarning")
async def test_tls11_client_is_refused(pki: Pki) -> None:
    client = _client_ctx(pki, max_version=ssl.TLSVersion.TLSv1_1)
    try:
        client.minimum_version = ssl.TLSVersion.TLSv1
    except ValueError:
        pass
    await _expect_refused(server_context(pki.cert, pki.key), client)


async def test_plain_text_on_a_tls_port_closes_cleanly(pki: Pki) -> None:
    """An MQTT CONNECT sent in the clear: the server's handshake fails, no hang, no crash."""
    seen = Seen()
    ctx = server_context(pki.cert, pki.key)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(_serve_once, ctx, seen)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"\x10\x10\x00\x04MQTT\x04\x02\x00\x3c\x00\x04test")
        with trio.fail_after(5):
            reply = b""
            try:
                while chunk := await stream.receive_some(1000):
                    reply += chunk
            except trio.BrokenResourceError:
                pass  # a reset is a clean close too
        await stream.aclose()
    assert isinstance(seen.error, trio.BrokenResourceError)
    assert b"MQTT" not in reply



# --- accept_tls: the listener's handshake ----------------------------------------


@dataclass
class Accepted:
    streams: list[trio.SSLStream[Any]] = field(default_factory=list)
    refused: int = 0


async def _accept_loop(ctx: ssl.SSLContext, result: Accepted, timeout: float = 5.0,
                       task_status=trio.TASK_STATUS_IGNORED) -> None:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    task_status.started(listeners[0].socket.getsockname()[1])

    async def handle(stream: trio.SocketStream) -> None:
        tls = await accept_tls(stream, ctx, timeout=timeout)
        if tls is None:
            result.refused += 1
            return
        result.streams.append(tls)
        data = await tls.receive_some(100)
        await tls.send_all(data.upper())
        await tls.aclose()

    await trio.serve_listeners(handle, listeners)


async def test_accept_tls_good_client(pki: Pki) -> None:
    result = Accepted()
    async with trio.open_nursery() as nursery:
        port = await nursery.start(_accept_loop, server_context(pki.cert, pki.key, pki.ca_file, True), result)
        assert await _client(port, _client_ctx(pki, with_cert=pki.client)) == b"HELLO MQTTS"
        nursery.cancel_scope.cancel()
    assert result.refused == 0 and peer_common_name(result.streams[0]) == "alice"


async def _read_until_closed(stream: trio.abc.Stream) -> bytes:
    data = b""
    try:
        while chunk := await stream.receive_some(1000):
            data += chunk
    except trio.BrokenResourceError:
        pass  # a reset is a close too
    return data


async def test_accept_tls_refused_certificate_closes_instead_of_hanging(pki: Pki) -> None:
    """TLS 1.3: the client's handshake succeeds before the server refuses it; the
    server must still close, so the client sees an error or EOF, not silence."""
    result = Accepted()
    async with trio.open_nursery() as nursery:
        port = await nursery.start(_accept_loop, server_context(pki.cert, pki.key, pki.ca_file, True), result)
        tcp = await trio.open_tcp_stream("127.0.0.1", port)
        tls = trio.SSLStream(tcp, _client_ctx(pki), server_hostname="localhost")
        with trio.fail_after(5):
            try:
                await tls.do_handshake()
                await tls.send_all(b"GET /mqtt HTTP/1.1\r\n\r\n")
                assert await _read_until_closed(tls) == b""
            except trio.BrokenResourceError:
                pass
        nursery.cancel_scope.cancel()
    assert result.refused == 1 and result.streams == []


async def test_accept_tls_plain_text_is_closed(pki: Pki) -> None:
    result = Accepted()
    async with trio.open_nursery() as nursery:
        port = await nursery.start(_accept_loop, server_context(pki.cert, pki.key), result)
        tcp = await trio.open_tcp_stream("127.0.0.1", port)
        await tcp.send_all(b"\x10\x10\x00\x04MQTT\x04\x02\x00\x3c\x00\x04test")
        with trio.fail_after(5):
            reply = await _read_until_closed(tcp)
        nursery.cancel_scope.cancel()
    assert b"MQTT" not in reply
    assert result.refused == 1


async def test_accept_tls_slowloris_times_out(pki: Pki) -> None:
    result = Accepted()
    async with trio.open_nursery() as nursery:
        port = await nursery.start(_accept_loop, server_context(pki.cert, pki.key), result, 0.3)
        tcp = await trio.open_tcp_stream("127.0.0.1", port)
        await tcp.send_all(b"\x16\x03\x01")  # the first bytes of a ClientHello, then nothing
        with trio.fail_after(5):
            assert await _read_until_closed(tcp) == b""
        nursery.cancel_scope.cancel()
    assert result.refused == 1


async def test_wss_listener_with_the_same_context(pki: Pki) -> None:
    """The `wss` listener: accept_tls, then trio-websocket on the TLS stream."""
    from trio_websocket import open_websocket, wrap_server_stream

    seen = Seen()
    ctx = server_context(pki.cert, pki.key, pki.ca_file, require_client_cert=True)
    refused = 0

    async def handle(stream: trio.SocketStream) -> None:
        nonlocal refused
        tls = await accept_tls(stream, ctx, timeout=5)
        if tls is None:
            refused += 1
            return
        seen.cn = peer_common_name(tls)
        async with trio.open_nursery() as nursery:
            request = await wrap_server_stream(nursery, tls)
            ws = await request.accept(subprotocol="mqtt")
            message = await ws.get_message()
            seen.echoed = message
            await ws.send_message(message[::-1])
            await ws.aclose()

    async with trio.open_nursery() as nursery:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        nursery.start_soon(trio.serve_listeners, handle, listeners)
        with trio.fail_after(5):
            async with open_websocket("localhost", port, "/mqtt", use_ssl=_client_ctx(pki, with_cert=pki.client),
                                      subprotocols=["mqtt"]) as ws:
                assert ws.subprotocol == "mqtt"
                await ws.send_message(b"\x10\x00")
                assert await ws.get_message() == b"\x00\x10"
        # Without a client certificate the server refuses and closes at once (see
        # test_accept_tls_refused_certificate_closes_instead_of_hanging); trio-websocket's
        # client only notices at its connect timeout, so keep that short here.
        with trio.fail_after(5):
            with pytest.raises(Exception):
                async with open_websocket("localhost", port, "/mqtt", use_ssl=_client_ctx(pki),
                                          subprotocols=["mqtt"], connect_timeout=0.5) as ws:
                    await ws.get_message()
        nursery.cancel_scope.cancel()
    assert seen.echoed == b"\x10\x00" and seen.cn == "alice"
    assert refused == 1
