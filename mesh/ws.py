"""MQTT over WebSocket: one binary WebSocket message stream seen as a byte stream.

MQTT 5 section 6: the client sends MQTT bytes in binary frames (a packet may span
frames and a frame may hold several packets, so the decoder just sees bytes); a text
frame closes the connection; the subprotocol is `mqtt` (`mqttv3.1` for 3.1 clients).
"""

from __future__ import annotations

import logging

import trio
from trio_websocket import ConnectionClosed, WebSocketConnection, WebSocketRequest

log = logging.getLogger("meshd.ws")

SUBPROTOCOL = "mqtt"
SUBPROTOCOL_V31 = "mqttv3.1"  # what MQTT 3.1 clients ask for (MQTT.js, Paho JS); Mosquitto takes it too


class WebSocketByteStream:
    """Adapts a trio-websocket connection to the `receive_some`/`send_all` stream API."""

    __slots__ = ("ws",)

    def __init__(self, ws: WebSocketConnection) -> None:
        self.ws = ws

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        """The next non-empty binary message; b"" only when the stream ends (a WebSocket
        close, a closed socket, or a text frame). A control packet may span any number
        of messages [MQTT-6.0.0-2], so an empty one is no end: MQTT.js sends one."""
        while True:
            try:
                message = await self.ws.get_message()
            except ConnectionClosed:
                return b""
            if isinstance(message, str):
                log.info("%s: text WebSocket frame; MQTT needs binary frames, closing", self.ws.remote)
                return b""
            if message:
                return message

    async def send_all(self, data: bytes) -> None:
        try:
            await self.ws.send_message(data)
        except ConnectionClosed as exc:
            raise trio.BrokenResourceError("WebSocket closed") from exc

    async def aclose(self) -> None:
        await self.ws.aclose()


async def accept_mqtt(request: WebSocketRequest, path: str) -> WebSocketConnection | None:
    """Accept a WebSocket handshake for MQTT on `path`, or reject it (404 / 400)."""
    if request.path.split("?", 1)[0] != path:
        await request.reject(404, body=b"not an MQTT endpoint\n")
        return None
    proposed = request.proposed_subprotocols
    chosen = next((p for p in (SUBPROTOCOL, SUBPROTOCOL_V31) if p in proposed), None)
    if proposed and chosen is None:
        await request.reject(400, body=b"subprotocol 'mqtt' required\n")
        return None
    return await request.accept(subprotocol=chosen)
