"""message.publish on a real node, with real paho clients: an async callback changes the
message before it is routed and acknowledged, another drops it; with nothing registered
the publish path does not stop at all."""

from __future__ import annotations

from typing import Any

import trio

from hooks import DROP, HookPoint
from session_store.model import Message
from tests.support import Client, RunningNode


def test_an_async_hook_changes_and_drops_messages(node: RunningNode) -> None:
    assert node.node is not None
    hooks = node.node.broker.hooks
    seen: list[tuple[str, int]] = []

    async def tag(msg: Message) -> Any:
        await trio.sleep(0.01)  # as a durable enqueue would: the PUBACK waits for it
        seen.append((msg.topic, msg.qos))
        if msg.topic == "drop/me":
            return DROP
        return Message(msg.topic, b"tagged:" + msg.payload, msg.qos, msg.retain, msg.properties,
                       msg.expires_at, msg.publisher, msg.msg_id, msg.origin)

    node.call(lambda: hooks.add(HookPoint.MESSAGE_PUBLISH, tag, name="tag"))
    sub = Client("sub")
    sub.connect(node.mqtt_port)
    sub.subscribe("#", qos=1)
    pub = Client("pub")
    pub.connect(node.mqtt_port)
    for i in range(5):
        pub.publish("a/b", f"m{i}", qos=1)
    pub.publish("drop/me", "gone", qos=1)
    pub.publish("a/b", "last", qos=0)
    got = [m.payload for m in sub.expect(6)]
    assert got == [b"tagged:m0", b"tagged:m1", b"tagged:m2", b"tagged:m3", b"tagged:m4", b"tagged:last"]
    sub.expect_none()
    assert ("drop/me", 1) in seen
    pub.disconnect()
    sub.disconnect()
