"""The registry of hook callbacks: one chain per point, highest priority first.

The hot path pays nothing for a point with no callback: each point's chain is a tuple
in an attribute named after it (`hooks.message_publish`), and the caller tests it
before building anything (`if hooks.message_publish:`). Adding or removing a callback
rebuilds that one tuple.

A callback that raises is logged with its name, counted (`errors`, by name, for
`/metrics`) and skipped: the chain goes on with the value it had. A plugin never takes
the node down.
"""

from __future__ import annotations

import inspect
import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from hooks.points import HookPoint
from session_store.model import Message

log = logging.getLogger("meshd.hooks")

Callback = Callable[..., Any]


@dataclass(frozen=True, slots=True)
class Stop:
    """A callback's answer: end the chain here, with `value` (None: the current value)."""

    value: Any = None


class _Drop:
    __slots__ = ()

    def __repr__(self) -> str:
        return "DROP"


DROP: Any = _Drop()  # message.publish: the message goes nowhere


class HookError(Exception):
    """A callback answered something the point does not take (counted like a raise)."""


@dataclass(frozen=True, slots=True, eq=False)
class Registration:
    """One callback at one point; `Hooks.remove` takes it back."""

    point: HookPoint
    callback: Callback
    priority: int
    name: str
    seq: int = field(default=0)


class Hooks:
    """Every point's chain. Built once by the composition; plugins, the rule engine and
    the built-in users (password file, ACL, $SYS) add to it."""

    __slots__ = (
        "client_connect", "client_authenticate", "client_authorize", "client_connected", "client_disconnected",
        "session_created", "session_subscribed", "session_unsubscribed", "session_terminated",
        "message_publish", "message_delivered", "message_acked", "message_dropped",
        "_entries", "_seq", "errors",
    )
    # One chain per point, named after it (`HookPoint.attr`): () while nothing is registered.
    client_connect: tuple[Registration, ...]
    client_authenticate: tuple[Registration, ...]
    client_authorize: tuple[Registration, ...]
    client_connected: tuple[Registration, ...]
    client_disconnected: tuple[Registration, ...]
    session_created: tuple[Registration, ...]
    session_subscribed: tuple[Registration, ...]
    session_unsubscribed: tuple[Registration, ...]
    session_terminated: tuple[Registration, ...]
    message_publish: tuple[Registration, ...]
    message_delivered: tuple[Registration, ...]
    message_acked: tuple[Registration, ...]
    message_dropped: tuple[Registration, ...]

    def __init__(self) -> None:
        self._entries: dict[HookPoint, list[Registration]] = {point: [] for point in HookPoint}
        self._seq = 0
        self.errors: Counter[str] = Counter()  # callback name -> raises (and bad answers)
        for point in HookPoint:
            setattr(self, point.attr, ())

    # ------------------------------------------------------------------ registry

    def add(self, point: HookPoint, callback: Callback, priority: int = 0, name: str = "") -> Registration:
        """Add `callback` at `point`. Higher `priority` runs first; equal ones in the
        order added. `name` is what logs and metrics call it (default: its qualname)."""
        self._seq += 1
        reg = Registration(point, callback, priority, name or getattr(callback, "__qualname__", repr(callback)), self._seq)
        entries = self._entries[point]
        entries.append(reg)
        entries.sort(key=lambda r: (-r.priority, r.seq))
        self._rebuild(point)
        return reg

    def remove(self, reg: Registration) -> bool:
        entries = self._entries[reg.point]
        if reg not in entries:
            return False
        entries.remove(reg)
        self._rebuild(reg.point)
        return True

    def _rebuild(self, point: HookPoint) -> None:
        setattr(self, point.attr, tuple(self._entries[point]))

    def registrations(self, point: HookPoint | None = None) -> list[Registration]:
        """What is registered (at `point`, or everywhere), in chain order."""
        points = [point] if point is not None else list(HookPoint)
        return [reg for p in points for reg in self._entries[p]]

    def chain(self, point: HookPoint) -> tuple[Registration, ...]:
        chain: tuple[Registration, ...] = getattr(self, point.attr)
        return chain

    # ------------------------------------------------------------------ running

    def failed(self, reg: Registration, exc: BaseException) -> None:
        """A callback raised: logged with its name, counted, skipped."""
        self.errors[reg.name] += 1
        log.error("hook %s at %s raised %s: %s (skipped)", reg.name, reg.point.value, type(exc).__name__, exc,
                  exc_info=exc if not isinstance(exc, HookError) else None)

    def fold(self, point: HookPoint, value: Any, *context: Any) -> Any:
        """Run a synchronous chain over `value` and return the value it ends with (a
        callback that answers an awaitable there is a bug of that callback: counted)."""
        chain: tuple[Registration, ...] = getattr(self, point.attr)  # `chain`, inline: per CONNECT
        for reg in chain:
            try:
                answer = reg.callback(value, *context)
            except Exception as exc:
                self.failed(reg, exc)
                continue
            if answer is None:
                continue
            if inspect.isawaitable(answer):
                _close(answer)
                self.failed(reg, HookError(f"an async callback at {point.value}, which runs synchronously"))
                continue
            if isinstance(answer, Stop):
                return value if answer.value is None else answer.value
            value = answer
        return value

    def notify(self, point: HookPoint, *context: Any) -> None:
        """A notification point: every callback sees it; what they answer is ignored
        except Stop, which ends the chain."""
        chain: tuple[Registration, ...] = getattr(self, point.attr)  # `chain`, inline: per CONNECT
        for reg in chain:
            try:
                answer = reg.callback(None, *context)
            except Exception as exc:
                self.failed(reg, exc)
                continue
            if answer is not None and inspect.isawaitable(answer):
                _close(answer)
                self.failed(reg, HookError(f"an async callback at {point.value}, which runs synchronously"))
            elif isinstance(answer, Stop):
                return

    async def run_publish(self, message: Message) -> Message | None:
        """message.publish: each callback may pass, stop the chain, answer a changed
        message or DROP it (None then). Callbacks may be async (a bridge awaits its
        durable enqueue before the publisher's acknowledgement)."""
        started = self.start_publish(message)
        return await self.finish_publish(started) if isinstance(started, PendingPublish) else started

    def start_publish(self, message: Message) -> "Message | None | PendingPublish":
        """The synchronous part of `run_publish`: the chain runs here until a callback
        answers an awaitable; then a `PendingPublish` for `finish_publish` to await.
        A chain of callbacks that answer at once never awaits (the reader keeps
        reading)."""
        return self._continue_publish(message, self.message_publish, 0)

    async def finish_publish(self, pending: "PendingPublish") -> Message | None:
        """Await what `start_publish` left, then the rest of the chain."""
        while True:
            reg = pending.chain[pending.index]
            try:
                answer = await pending.awaitable
            except Exception as exc:
                self.failed(reg, exc)
                answer = None
            step = self._answer(pending.message, answer, reg)
            if step is None:
                return None
            if isinstance(step, _Stopped):
                return step.message
            after = self._continue_publish(step, pending.chain, pending.index + 1)
            if not isinstance(after, PendingPublish):
                return after
            pending = after

    def _continue_publish(self, message: Message, chain: tuple[Registration, ...],
                          start: int) -> "Message | None | PendingPublish":
        for index in range(start, len(chain)):
            reg = chain[index]
            try:
                answer = reg.callback(message)
            except Exception as exc:
                self.failed(reg, exc)
                continue
            if answer is None:
                continue
            if inspect.isawaitable(answer):
                return PendingPublish(answer, chain, index, message)
            step = self._answer(message, answer, reg)
            if step is None:
                return None
            if isinstance(step, _Stopped):
                return step.message
            message = step
        return message

    def _answer(self, current: Message, answer: Any, reg: Registration) -> Any:
        """One callback's answer: the message to go on with, None (dropped), or
        `_Stopped` (the chain ends with its message)."""
        if answer is None:
            return current
        if answer is DROP:
            return None
        if isinstance(answer, Stop):
            stopped = current if answer.value is None else answer.value
            return None if stopped is DROP else _Stopped(_checked(stopped, current, reg, self))
        return _checked(answer, current, reg, self)


@dataclass(frozen=True, slots=True)
class _Stopped:
    message: Message


class PendingPublish:
    """A message.publish chain waiting on one callback's awaitable (`finish_publish`)."""

    __slots__ = ("awaitable", "chain", "index", "message")

    def __init__(self, awaitable: Awaitable[Any], chain: tuple[Registration, ...], index: int, message: Message) -> None:
        self.awaitable = awaitable
        self.chain = chain
        self.index = index
        self.message = message


def _checked(answer: Any, current: Message, reg: Registration, hooks: Hooks) -> Message:
    if isinstance(answer, Message):
        return answer
    hooks.failed(reg, HookError(f"answered {type(answer).__name__}, not a Message, DROP or Stop"))
    return current


def _close(awaitable: Awaitable[Any]) -> None:
    """Close a coroutine that will never be awaited (no 'never awaited' warning)."""
    close = getattr(awaitable, "close", None)
    if close is not None:
        close()
