"""Opening a bridge's connection to its target: TCP, and TLS for mqtts:// and https://."""

from __future__ import annotations

import ssl

import trio

from bridges.config import BridgeConfig, BridgeConfigError


def tls_context(config: BridgeConfig) -> ssl.SSLContext | None:
    """The client TLS context for a TLS url (None for plain ones); BridgeConfigError
    naming `tls_ca` when the bundle cannot be read."""
    if not config.tls:
        return None
    try:
        ctx = ssl.create_default_context(cafile=config.tls_ca)
    except (OSError, ssl.SSLError) as exc:
        raise BridgeConfigError("tls_ca", f"cannot load {config.tls_ca}: {exc}") from None
    if config.tls_insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


async def open_stream(config: BridgeConfig, tls: ssl.SSLContext | None) -> trio.abc.Stream:
    """A connected stream to the target (the caller bounds the time); OSError and
    ssl.SSLError (as trio.BrokenResourceError) when it cannot be had."""
    tcp = await trio.open_tcp_stream(config.host, config.port)
    if tls is None:
        return tcp
    stream = trio.SSLStream(tcp, tls, server_hostname=config.host)
    try:
        await stream.do_handshake()
    except BaseException:
        await trio.aclose_forcefully(tcp)
        raise
    return stream


def describe(exc: BaseException) -> str:
    """One line an operator can act on."""
    if isinstance(exc, trio.TooSlowError):
        return "no answer in time"
    if isinstance(exc, OSError):
        text = exc.strerror or str(exc) or type(exc).__name__
        cause = exc.__cause__
        # trio.open_tcp_stream: "all attempts to connect ... failed", the reasons in its cause.
        while isinstance(cause, BaseExceptionGroup):
            cause = cause.exceptions[0]
        if isinstance(cause, OSError) and cause.strerror:
            text += f" ({cause.strerror})"
        return text
    if isinstance(exc, trio.BrokenResourceError) and exc.__cause__ is not None:
        return f"connection broken: {exc.__cause__}"
    return str(exc) or type(exc).__name__
