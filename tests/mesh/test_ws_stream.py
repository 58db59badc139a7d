"""MQTT over WebSocket: only a close ends the stream, never an empty message
(issue 21, item 1; MQTT-6.0.0-2: a control packet may span any number of messages)."""

from __future__ import annotations

import trio
from trio_websocket import open_websocket_url

from mqtt import Connect, Pingreq, encode


async def _session(port: int) -> list[bytes]:
    """CONNECT, an empty binary message, a PINGREQ split over two messages: the replies."""
    replies = []
    async with open_websocket_url(f"ws://127.0.0.1:{port}/mqtt", subprotocols=["mqtt"]) as ws:
        await ws.send_message(encode(Connect(client_id="ws-empty", clean_start=True, keep_alive=60, protocol_level=4), 4))
        replies.append(await ws.get_message())
        await ws.send_message(b"")  # what MQTT.js sends, clearing a retained message
        ping = encode(Pingreq(), 4)
        await ws.send_message(ping[:1])
        await ws.send_message(b"")
        await ws.send_message(ping[1:])
        with trio.fail_after(5):
            replies.append(await ws.get_message())
    return replies


def test_an_empty_websocket_message_does_not_end_the_connection(node):
    replies = trio.run(_session, node.ports["ws"])
    assert replies == [b"\x20\x02\x00\x00", b"\xd0\x00"]


async def _handshake(port: int, subprotocol: str) -> str | None:
    async with open_websocket_url(f"ws://127.0.0.1:{port}/mqtt", subprotocols=[subprotocol]) as ws:
        return ws.subprotocol


def test_mqtt31_clients_get_their_websocket_subprotocol(node):
    """MQTT 3.1 clients (MQTT.js with protocolVersion 3, Paho JS) ask for `mqttv3.1`."""
    assert trio.run(_handshake, node.ports["ws"], "mqttv3.1") == "mqttv3.1"
    assert trio.run(_handshake, node.ports["ws"], "mqtt") == "mqtt"
