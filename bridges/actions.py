"""The rule engine's `webhook` and `bridge` actions (issue 24): factories that take an
action's config table and return an object with `async run(output, message)`.

This package does not import the rule engine: the node's composition hands these
factories to it (`action_factories`). Both actions go through a bridge's durable cache
queue, so `run` returns once the output is queued (on disk for QoS >= 1), and a target
that is down or answering 500 shows in the bridge's status and metrics, not as a
failed action.

    webhook  url, headers, timeout_s   POST the rule's output as JSON
    bridge   bridge, topic, qos        the output as JSON into bridge `bridge`'s queue,
                                       under the topic template (`${field}`, dotted
                                       paths into the output; default `${topic}`)
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable, Mapping, Protocol

from bridges.config import BRIDGE_ID_RE
from mqtt import TopicNameInvalid, validate_topic_name

_PLACEHOLDER = re.compile(r"\$\{([^}]*)\}")


class ActionSink(Protocol):
    def webhook_target(self, url: str, headers: Mapping[str, str], timeout_s: float) -> str: ...
    async def post(self, target: str, body: bytes) -> None: ...
    async def enqueue(self, bridge_id: str, topic: str, payload: bytes, qos: int, retain: bool = False) -> None: ...


def _lookup(output: Mapping[str, Any], path: str) -> Any:
    value: Any = output
    if path in output:
        return output[path]
    for part in path.split("."):
        if isinstance(value, Mapping) and part in value:
            value = value[part]
        else:
            return None
    return value


def render(template: str, output: Mapping[str, Any]) -> str:
    """`${field}` replaced by the output's field (dotted paths go into nested objects);
    a missing field renders empty, an object as JSON."""
    def one(m: re.Match[str]) -> str:
        value = _lookup(output, m.group(1).strip())
        if value is None:
            return ""
        if isinstance(value, (dict, list)):
            return json.dumps(value, separators=(",", ":"))
        if isinstance(value, bytes):
            return value.decode("utf-8", "replace")
        return str(value)
    return _PLACEHOLDER.sub(one, template)


def output_json(output: Mapping[str, Any]) -> bytes:
    def plain(value: object) -> object:
        if isinstance(value, bytes):
            return value.decode("utf-8", "replace")
        return str(value)
    return json.dumps(dict(output), separators=(",", ":"), default=plain).encode()


def _check_keys(table: Mapping[str, Any], allowed: set[str], kind: str) -> None:
    for key in table:
        if key not in allowed and key != "type":
            raise ValueError(f"{key}: unknown setting of a {kind} action (known: {', '.join(sorted(allowed))})")


class WebhookAction:
    def __init__(self, sink: ActionSink, target: str) -> None:
        self.sink = sink
        self.target = target

    async def run(self, output: Mapping[str, Any], message: object) -> None:
        await self.sink.post(self.target, output_json(output))


class BridgeAction:
    def __init__(self, sink: ActionSink, bridge_id: str, topic: str, qos: int | None) -> None:
        self.sink = sink
        self.bridge_id = bridge_id
        self.topic = topic
        self.qos = qos

    async def run(self, output: Mapping[str, Any], message: object) -> None:
        topic = render(self.topic, output)
        try:
            validate_topic_name(topic)
        except TopicNameInvalid as exc:
            raise ValueError(f"topic {self.topic!r} renders to {topic!r}: {exc}") from None
        qos = self.qos if self.qos is not None else int(getattr(message, "qos", 0))
        retain = bool(getattr(message, "retain", False))
        try:
            await self.sink.enqueue(self.bridge_id, topic, output_json(output), qos, retain)
        except KeyError:
            raise ValueError(f"no bridge {self.bridge_id!r} on this node") from None


def webhook_factory(sink: ActionSink) -> Callable[[Mapping[str, Any]], WebhookAction]:
    def make(table: Mapping[str, Any]) -> WebhookAction:
        _check_keys(table, {"url", "headers", "timeout_s"}, "webhook")
        url = table.get("url")
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"url: a webhook needs an http:// or https:// url, not {url!r}")
        headers = table.get("headers", {})
        if not isinstance(headers, Mapping):
            raise ValueError(f"headers: expected a table of strings, not {headers!r}")
        timeout = table.get("timeout_s", 10.0)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ValueError(f"timeout_s: expected seconds > 0, not {timeout!r}")
        return WebhookAction(sink, sink.webhook_target(url, dict(headers), float(timeout)))
    return make


def bridge_factory(sink: ActionSink) -> Callable[[Mapping[str, Any]], BridgeAction]:
    def make(table: Mapping[str, Any]) -> BridgeAction:
        _check_keys(table, {"bridge", "topic", "qos"}, "bridge")
        bridge_id = table.get("bridge")
        if not isinstance(bridge_id, str) or not BRIDGE_ID_RE.fullmatch(bridge_id):
            raise ValueError(f"bridge: expected a bridge id, not {bridge_id!r}")
        topic = table.get("topic", "${topic}")
        if not isinstance(topic, str) or not topic:
            raise ValueError(f"topic: expected a topic template, not {topic!r}")
        qos = table.get("qos")
        if qos is not None and (isinstance(qos, bool) or qos not in (0, 1, 2)):
            raise ValueError(f"qos: expected 0, 1 or 2, not {qos!r}")
        return BridgeAction(sink, bridge_id, topic, qos)
    return make
