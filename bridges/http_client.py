"""A small HTTP/1.1 client on Trio and h11 (already a dependency of the node): one
kept-alive connection, one request at a time, what a bridge's POSTs need."""

from __future__ import annotations

import ssl

import h11
import trio

from bridges.config import BridgeConfig
from bridges.connect import open_stream


class HttpError(Exception):
    """The exchange failed (connection, protocol); the message says why."""


class HttpConnection:
    def __init__(self, config: BridgeConfig, tls: ssl.SSLContext | None) -> None:
        self.config = config
        self.tls = tls
        self._stream: trio.abc.Stream | None = None
        self._h11: h11.Connection | None = None

    async def close(self) -> None:
        stream, self._stream, self._h11 = self._stream, None, None
        if stream is not None:
            await trio.aclose_forcefully(stream)

    async def post(self, body: bytes, headers: tuple[tuple[str, str], ...]) -> tuple[int, bytes]:
        """POST `body` to the url; (status, the answer's first 4 KiB). The caller
        bounds the time; a failed exchange closes the connection (HttpError, OSError)."""
        if self._h11 is not None and self._h11.our_state is h11.MUST_CLOSE:
            await self.close()
        if self._stream is None:
            self._stream = await open_stream(self.config, self.tls)
            self._h11 = h11.Connection(our_role=h11.CLIENT)
        assert self._h11 is not None
        conn, stream = self._h11, self._stream
        cfg = self.config
        host = cfg.host if cfg.port in (80, 443) else f"{cfg.host}:{cfg.port}"
        all_headers = [("Host", host), ("Content-Type", "application/json"), ("Content-Length", str(len(body))),
                       ("User-Agent", "meshd-bridge"), *headers]
        try:
            await stream.send_all(conn.send(h11.Request(method="POST", target=cfg.path, headers=all_headers))
                                  + conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage()))
            status = 0
            answer = bytearray()
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    data = await stream.receive_some(65536)
                    conn.receive_data(bytes(data))
                    if not data and conn.their_state is not h11.DONE:
                        raise HttpError("connection closed before the answer")
                    continue
                if isinstance(event, h11.Response):
                    status = event.status_code
                elif isinstance(event, h11.Data):
                    if len(answer) < 4096:
                        answer += event.data[:4096 - len(answer)]
                elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                    break
            if conn.our_state is h11.DONE and conn.their_state is h11.DONE:
                conn.start_next_cycle()
            else:
                await self.close()
            return status, bytes(answer)
        except h11.ProtocolError as exc:
            await self.close()
            raise HttpError(f"not an HTTP answer: {exc}") from None
        except BaseException:
            await self.close()
            raise
