"""An example meshd plugin: one callback at each of the 13 hook points.

It records what it saw in `SEEN` (point -> list of short descriptions, for the tests,
which run the node in the same process), and shows what a callback can do:

- client.connect refuses the client id `plugin-refused` (0x87 not authorized);
- client.authenticate refuses the user `plugin-denied` (0x86 bad user name or password);
- client.authorize forbids publishing to `plugin/forbidden`;
- message.publish (async) upper-cases payloads on `plugin/upper`, drops `plugin/drop`
  and raises on `plugin/boom` (the node logs it, counts it and delivers the message).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import trio

from hooks import DROP, HookPoint, Stop
from hooks.plugins import PluginContext
from hooks.points import AuthVerdict, ClientInfo, ConnectInfo
from session_store.model import Message

SEEN: dict[str, list[str]] = defaultdict(list)


def setup(context: PluginContext) -> None:
    def note(point: HookPoint, what: str) -> None:
        SEEN[point.value].append(what)

    def on_connect(code: int, info: ConnectInfo) -> int | None:
        note(HookPoint.CLIENT_CONNECT, info.client.client_id)
        return 0x87 if info.client.client_id == "plugin-refused" else None

    def on_authenticate(verdict: AuthVerdict, info: ConnectInfo) -> Any:
        note(HookPoint.CLIENT_AUTHENTICATE, f"{info.client.client_id}:{verdict.ok}")
        if info.client.username == "plugin-denied":
            return Stop(AuthVerdict(False, 0x86, "the example plugin refuses plugin-denied"))
        return None

    def on_authorize(allowed: bool, client: ClientInfo, action: str, topic: str) -> bool | None:
        note(HookPoint.CLIENT_AUTHORIZE, f"{client.client_id}:{action}:{topic}")
        return False if topic == "plugin/forbidden" else None

    async def on_publish(msg: Message) -> Any:
        note(HookPoint.MESSAGE_PUBLISH, msg.topic)
        await trio.sleep(0)  # async, as a durable enqueue would be
        if msg.topic == "plugin/boom":
            raise RuntimeError("the example plugin fails on plugin/boom")
        if msg.topic == "plugin/drop":
            return DROP
        if msg.topic == "plugin/upper":
            return Message(msg.topic, msg.payload.upper(), msg.qos, msg.retain, msg.properties, msg.expires_at,
                           msg.publisher, msg.msg_id, msg.origin)
        return None

    def notify(point: HookPoint) -> Any:
        def callback(_value: None, *context: Any) -> None:
            parts = [c.client_id if isinstance(c, ClientInfo) else c.topic if isinstance(c, Message) else str(c)
                     for c in context]
            note(point, ":".join(parts))
        callback.__name__ = point.attr
        return callback

    context.add(HookPoint.CLIENT_CONNECT, on_connect)
    context.add(HookPoint.CLIENT_AUTHENTICATE, on_authenticate)
    context.add(HookPoint.CLIENT_AUTHORIZE, on_authorize)
    context.add(HookPoint.MESSAGE_PUBLISH, on_publish, priority=10)
    for point in (HookPoint.CLIENT_CONNECTED, HookPoint.CLIENT_DISCONNECTED, HookPoint.SESSION_CREATED,
                  HookPoint.SESSION_SUBSCRIBED, HookPoint.SESSION_UNSUBSCRIBED, HookPoint.SESSION_TERMINATED,
                  HookPoint.MESSAGE_DELIVERED, HookPoint.MESSAGE_ACKED, HookPoint.MESSAGE_DROPPED):
        context.add(point, notify(point))
