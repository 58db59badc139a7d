"""TLS for the `mqtts` and `wss` listeners: the server context and the peer's name.

`server_context` builds an `ssl.SSLContext` for `trio.SSLStream(..., server_side=True)`:
TLS 1.2 and 1.3 only, forward-secret AEAD ciphers only on 1.2 (1.3's suites are all
modern), no compression, no session tickets (a long-lived ticket key would undo forward
secrecy), no renegotiation.
`accept_tls` is the listener's side: the handshake under a deadline, and a clean close
when it fails. Use it for `wss` too, before handing the stream to trio-websocket
(`trio_websocket.wrap_server_stream`): `serve_websocket(..., ssl_context)` leaves a
TLS 1.3 client whose certificate was refused hanging until its connect timeout,
because the client's side of a 1.3 handshake completes before the server says no.

`cluster_contexts` builds the pair for node-to-node streams (`cluster_tls_*`: mutual
verification against the cluster's CA; the gossip transport's `TlsStreams` uses them).

Every problem with a file raises `TlsConfigError` naming the setting (`tls_cert`,
`tls_key`, `tls_ca`, `cluster_tls_*`), so an operator sees which line of the config to fix.
"""

from __future__ import annotations

import datetime
import logging
import os
import ssl
from typing import Any, TypeVar

import trio

__all__ = ["server_context", "cluster_contexts", "peer_common_name", "accept_tls", "TlsConfigError", "TLS12_CIPHERS"]

log = logging.getLogger(__name__)

S = TypeVar("S", bound=trio.abc.Stream)

# ECDHE key exchange (forward secrecy) with AES-GCM or ChaCha20-Poly1305: Mozilla's
# "intermediate" list, which every client still in use supports.
TLS12_CIPHERS = ":".join([
    "ECDHE-ECDSA-AES128-GCM-SHA256",
    "ECDHE-RSA-AES128-GCM-SHA256",
    "ECDHE-ECDSA-AES256-GCM-SHA384",
    "ECDHE-RSA-AES256-GCM-SHA384",
    "ECDHE-ECDSA-CHACHA20-POLY1305",
    "ECDHE-RSA-CHACHA20-POLY1305",
])


class TlsConfigError(ValueError):
    """A TLS setting points at a missing, unreadable or wrong file."""


def _check_readable(setting: str, path: str) -> None:
    if not path:
        raise TlsConfigError(f"{setting} is empty")
    if not os.path.exists(path):
        raise TlsConfigError(f"{setting} {path}: no such file")
    if os.path.isdir(path):
        raise TlsConfigError(f"{setting} {path}: is a directory, expected a PEM file")
    try:
        with open(path, "rb") as f:
            f.read(1)
    except OSError as e:
        raise TlsConfigError(f"{setting} {path}: cannot read ({e.strerror or e})") from None


def _read_pem(setting: str, path: str, marker: bytes, what: str) -> bytes:
    _check_readable(setting, path)
    with open(path, "rb") as f:
        data = f.read()
    if marker not in data:
        raise TlsConfigError(f"{setting} {path}: no {what} found (expected a PEM file with '{marker.decode()}')")
    return data


def _check_certificate(setting: str, path: str, pem: bytes) -> None:
    try:
        from cryptography import x509
    except ImportError:  # pragma: no cover - cryptography is a dependency
        return
    try:
        cert = x509.load_pem_x509_certificates(pem)[0]
    except ValueError as e:
        raise TlsConfigError(f"{setting} {path}: not a valid PEM certificate ({e})") from None
    now = datetime.datetime.now(datetime.timezone.utc)
    if cert.not_valid_after_utc < now:
        log.warning("%s %s: certificate expired on %s; clients will refuse it",
                    setting, path, cert.not_valid_after_utc.isoformat())
    elif cert.not_valid_before_utc > now:
        log.warning("%s %s: certificate is not valid before %s", setting, path,
                    cert.not_valid_before_utc.isoformat())


def _check_key(setting: str, path: str, pem: bytes) -> None:
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization

    try:
        serialization.load_pem_private_key(pem, password=None)
    except TypeError:
        raise TlsConfigError(f"{setting} {path}: the key is encrypted with a passphrase; meshd needs an "
                             "unencrypted key (protect it with file permissions instead)") from None
    except (ValueError, UnsupportedAlgorithm) as e:
        raise TlsConfigError(f"{setting} {path}: not a usable private key ({e})") from None


def _no_passphrase(*_: object) -> bytes:
    # Called by OpenSSL for an encrypted key; without it, Python would prompt on a tty.
    raise TlsConfigError("encrypted")


def server_context(cert: str, key: str, ca: str | None = None,
                   require_client_cert: bool = False) -> ssl.SSLContext:
    """A server-side context: TLS 1.2+, modern ciphers, optional client certificates.

    With `ca`, client certificates signed by it are verified when offered (and their
    CN can name the user); with `require_client_cert` a client without one fails the
    handshake. `require_client_cert` without `ca` is an error: there would be nothing
    to verify against.
    """
    cert_pem = _read_pem("tls_cert", cert, b"-----BEGIN CERTIFICATE-----", "certificate")
    _check_certificate("tls_cert", cert, cert_pem)
    key_pem = _read_pem("tls_key", key, b"PRIVATE KEY-----", "private key")
    _check_key("tls_key", key, key_pem)
    if require_client_cert and not ca:
        raise TlsConfigError("tls_require_client_cert needs tls_ca (the CA that signs client certificates)")

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_ciphers(TLS12_CIPHERS)
    ctx.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE | ssl.OP_NO_TICKET
    ctx.options |= ssl.OP_NO_RENEGOTIATION
    _load_chain(ctx, "tls", cert, key)

    if ca:
        _load_ca(ctx, "tls_ca", ca)
        ctx.verify_mode = ssl.CERT_REQUIRED if require_client_cert else ssl.CERT_OPTIONAL
    else:
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def cluster_contexts(cert: str, key: str, ca: str) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(server, client) contexts for node-to-node streams (`cluster_tls_*`). Nodes
    are peers: both sides present `cert` and require the other's, signed by `ca`.
    TLS 1.3 only (every node is meshd; no old client to wait for). Host names are not
    checked: nodes reach each other at gossip addresses, and a certificate from the
    cluster's CA is what makes a peer a member, so give the cluster a CA of its own."""
    cert_pem = _read_pem("cluster_tls_cert", cert, b"-----BEGIN CERTIFICATE-----", "certificate")
    _check_certificate("cluster_tls_cert", cert, cert_pem)
    key_pem = _read_pem("cluster_tls_key", key, b"PRIVATE KEY-----", "private key")
    _check_key("cluster_tls_key", key, key_pem)
    contexts = []
    for protocol in (ssl.PROTOCOL_TLS_SERVER, ssl.PROTOCOL_TLS_CLIENT):
        ctx = ssl.SSLContext(protocol)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        ctx.options |= ssl.OP_NO_COMPRESSION | ssl.OP_NO_TICKET | ssl.OP_NO_RENEGOTIATION
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_REQUIRED
        _load_chain(ctx, "cluster_tls", cert, key)
        _load_ca(ctx, "cluster_tls_ca", ca)
        contexts.append(ctx)
    return contexts[0], contexts[1]


def _load_chain(ctx: ssl.SSLContext, prefix: str, cert: str, key: str) -> None:
    """Load cert and key; errors name `<prefix>_cert`/`<prefix>_key`."""
    try:
        ctx.load_cert_chain(cert, key, password=_no_passphrase)
    except TlsConfigError:
        raise TlsConfigError(f"{prefix}_key {key}: the key is encrypted with a passphrase") from None
    except ssl.SSLError as e:
        text = f"{e.reason or ''} {e}".upper()
        if "KEY_VALUES_MISMATCH" in text or "X509_CHECK_PRIVATE_KEY" in text:
            raise TlsConfigError(f"{prefix}_key {key} does not belong to the certificate in {prefix}_cert {cert}") from None
        raise TlsConfigError(f"{prefix}_cert {cert} / {prefix}_key {key}: {e.reason or e}") from None
    except OSError as e:
        raise TlsConfigError(f"{prefix}_cert {cert} / {prefix}_key {key}: {e.strerror or e}") from None


def _load_ca(ctx: ssl.SSLContext, setting: str, ca: str) -> None:
    _read_pem(setting, ca, b"-----BEGIN CERTIFICATE-----", "CA certificate")
    try:
        ctx.load_verify_locations(cafile=ca)
    except (ssl.SSLError, OSError) as e:
        raise TlsConfigError(f"{setting} {ca}: {getattr(e, 'reason', None) or e}") from None


def peer_common_name(ssl_object: Any) -> str | None:
    """The CN of the verified client certificate, or None if there is none.

    Takes anything with `getpeercert()`: `ssl.SSLObject`, `ssl.SSLSocket`, or a
    `trio.SSLStream` (which forwards it). Only a certificate that passed verification
    is returned by `getpeercert()`, so the CN can be trusted as a user name. With
    several CNs in the subject, the last (most specific) wins.
    """
    try:
        cert = ssl_object.getpeercert()
    except (ValueError, AttributeError, ssl.SSLError):
        return None  # handshake not done, or not a TLS object
    if not cert:
        return None
    common_name: str | None = None
    for rdn in cert.get("subject", ()):
        for name, value in rdn:
            if name == "commonName":
                common_name = value
    return common_name


async def accept_tls(stream: S, ctx: ssl.SSLContext, timeout: float = 10.0) -> trio.SSLStream[S] | None:
    """Server-side handshake on an accepted stream, within `timeout` seconds.

    Returns the `trio.SSLStream`, or None after closing the connection when the
    handshake fails: a refused or missing client certificate, plain text (say an MQTT
    CONNECT sent to the TLS port), an old protocol version, or a client too slow to
    finish (slowloris). Failures are logged at debug; they are the client's problem.
    """
    tls = trio.SSLStream(stream, ctx, server_side=True)
    failure: str | None = None
    with trio.move_on_after(timeout) as scope:
        try:
            await tls.do_handshake()
        except trio.BrokenResourceError as e:
            cause = e.__cause__
            failure = str(getattr(cause, "reason", None) or cause or e)
        except trio.ClosedResourceError:
            failure = "closed"
    if scope.cancelled_caught:
        failure = f"no handshake within {timeout:g} s"
    if failure is None:
        return tls
    log.debug("TLS handshake from %s failed: %s", _peer(stream), failure)
    with trio.move_on_after(1) as close_scope:
        close_scope.shield = True
        await trio.aclose_forcefully(stream)
    return None


def _peer(stream: trio.abc.Stream) -> str:
    sock = getattr(stream, "socket", None)
    if sock is None:
        return "?"
    try:
        host, port = sock.getpeername()[:2]
    except (AttributeError, OSError, ValueError, TypeError):
        return "?"
    return f"{host}:{port}"
