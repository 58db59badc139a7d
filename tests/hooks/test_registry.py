"""The hook registry: priority order, pass / change / stop / drop, and a callback that
raises is counted and skipped."""

from __future__ import annotations

import trio

from hooks import DROP, HookPoint, Hooks, Stop
from mqtt import EMPTY_PROPERTIES
from session_store.model import Message


def _msg(payload: bytes = b"x") -> Message:
    return Message("t", payload, 0, False, EMPTY_PROPERTIES)


def test_an_unused_point_is_an_empty_tuple() -> None:
    hooks = Hooks()
    for point in HookPoint:
        assert hooks.chain(point) == ()
    reg = hooks.add(HookPoint.MESSAGE_PUBLISH, lambda m: None, name="p")
    assert hooks.message_publish == (reg,)
    assert hooks.remove(reg)
    assert hooks.message_publish == ()


def test_higher_priority_runs_first_then_order_added() -> None:
    hooks = Hooks()
    seen: list[str] = []
    for name, prio in [("low", 0), ("high", 10), ("low2", 0)]:
        hooks.add(HookPoint.CLIENT_CONNECTED, lambda _v, info, n=name: seen.append(n), priority=prio, name=name)
    hooks.notify(HookPoint.CLIENT_CONNECTED, "info")
    assert seen == ["high", "low", "low2"]


def test_fold_changes_stops_and_survives_a_raise() -> None:
    hooks = Hooks()

    def boom(value: bool, *ctx: object) -> None:
        raise RuntimeError("plugin bug")

    hooks.add(HookPoint.CLIENT_AUTHORIZE, boom, priority=3, name="boom")
    hooks.add(HookPoint.CLIENT_AUTHORIZE, lambda v, *c: False, priority=2, name="deny")
    hooks.add(HookPoint.CLIENT_AUTHORIZE, lambda v, *c: Stop(), priority=1, name="stop")
    hooks.add(HookPoint.CLIENT_AUTHORIZE, lambda v, *c: True, priority=0, name="never")
    assert hooks.fold(HookPoint.CLIENT_AUTHORIZE, True, "client", "publish", "a/b") is False
    assert hooks.errors == {"boom": 1}


def test_a_sync_chain_counts_an_async_callback_as_a_fault() -> None:
    hooks = Hooks()

    async def not_here(value: object, *ctx: object) -> bool:
        return False

    hooks.add(HookPoint.CLIENT_AUTHORIZE, not_here, name="async-authz")
    assert hooks.fold(HookPoint.CLIENT_AUTHORIZE, True, "c", "publish", "t") is True
    assert hooks.errors == {"async-authz": 1}


async def test_run_publish_changes_awaits_and_drops() -> None:
    hooks = Hooks()

    async def slow_upper(msg: Message) -> Message:
        await trio.sleep(0)
        return Message(msg.topic, msg.payload.upper(), msg.qos, msg.retain, msg.properties)

    hooks.add(HookPoint.MESSAGE_PUBLISH, slow_upper, priority=5, name="upper")
    hooks.add(HookPoint.MESSAGE_PUBLISH, lambda m: 42, priority=4, name="wrong-answer")
    out = await hooks.run_publish(_msg(b"abc"))
    assert out is not None and out.payload == b"ABC"
    assert hooks.errors == {"wrong-answer": 1}
    hooks.add(HookPoint.MESSAGE_PUBLISH, lambda m: DROP if m.payload == b"DROP" else None, priority=3, name="drop")
    assert await hooks.run_publish(_msg(b"drop")) is None
    out = await hooks.run_publish(_msg(b"keep"))
    assert out is not None and out.payload == b"KEEP"


async def test_start_publish_awaits_only_from_the_first_callback_that_answers_an_awaitable() -> None:
    from hooks.registry import PendingPublish

    hooks = Hooks()
    order: list[str] = []

    def sync_tag(msg: Message) -> Message:
        order.append("sync")
        return Message(msg.topic, msg.payload + b"+s", msg.qos, msg.retain, msg.properties)

    async def slow(msg: Message) -> Message:
        order.append("async")
        await trio.sleep(0)
        return Message(msg.topic, msg.payload + b"+a", msg.qos, msg.retain, msg.properties)

    def maybe_async(msg: Message) -> object:
        order.append("maybe")
        return None  # answers at once: no await for this one

    hooks.add(HookPoint.MESSAGE_PUBLISH, sync_tag, priority=3, name="sync")
    hooks.add(HookPoint.MESSAGE_PUBLISH, maybe_async, priority=2, name="maybe")
    started = hooks.start_publish(_msg(b"m"))
    assert isinstance(started, Message) and started.payload == b"m+s"  # no awaitable: done synchronously
    hooks.add(HookPoint.MESSAGE_PUBLISH, slow, priority=1, name="async")
    hooks.add(HookPoint.MESSAGE_PUBLISH, sync_tag, priority=0, name="sync-after")
    order.clear()
    pending = hooks.start_publish(_msg(b"m"))
    assert isinstance(pending, PendingPublish) and order == ["sync", "maybe"]  # the coroutine runs when awaited
    out = await hooks.finish_publish(pending)
    assert out is not None and out.payload == b"m+s+a+s" and order == ["sync", "maybe", "async", "sync"]
