"""What a rule does with its output: the `Action` interface, and the two actions the
rule engine itself provides, `republish` and `log`. Other packages (the bridges) give
theirs to the engine as factories; the engine never imports them.

An `ActionFactory` turns one `[[rules.actions]]` table into an `Action`, refusing a bad
table with a ValueError that names the key."""

from __future__ import annotations

import json
import logging
from typing import Any, Callable, Mapping, Protocol

from rules.functions import _text
from rules.record import RuleInput
from rules.template import compile_template

log = logging.getLogger("meshd.rules")


class Action(Protocol):
    async def run(self, output: Mapping[str, Any], message: RuleInput) -> None:
        """Do the action for one output of the rule; raise to count it failed."""


ActionFactory = Callable[[Mapping[str, Any]], Action]


class Republisher(Protocol):
    """The node's broker, as republish sees it: publish a message as the node."""

    def republish(self, topic: str, payload: bytes, qos: int, retain: bool) -> None: ...


def _check_keys(config: Mapping[str, Any], allowed: set[str], kind: str) -> None:
    unknown = sorted(set(config) - allowed - {"type"})
    if unknown:
        raise ValueError(f"{kind} action: unknown key {unknown[0]!r} (keys: {', '.join(sorted(allowed))})")


class RepublishAction:
    """Publish the output again: `topic` and `payload` are `${field}` templates
    (payload default: the output as JSON), `qos` 0..2, `retain`."""

    def __init__(self, config: Mapping[str, Any], publisher: Republisher) -> None:
        _check_keys(config, {"topic", "payload", "qos", "retain"}, "republish")
        topic = config.get("topic")
        if not isinstance(topic, str) or not topic:
            raise ValueError("republish action: topic is required (a topic template, e.g. \"alerts/${clientid}\")")
        if "+" in topic or "#" in topic:
            raise ValueError(f"republish action: topic {topic!r} has a wildcard")
        payload = config.get("payload")
        if payload is not None and not isinstance(payload, str):
            raise ValueError("republish action: payload is a template string")
        qos = config.get("qos", 0)
        if not isinstance(qos, int) or isinstance(qos, bool) or qos not in (0, 1, 2):
            raise ValueError(f"republish action: qos is 0, 1 or 2, not {qos!r}")
        retain = config.get("retain", False)
        if not isinstance(retain, bool):
            raise ValueError(f"republish action: retain is true or false, not {retain!r}")
        self.topic = compile_template(topic, key="republish topic")
        self.payload = compile_template(payload, key="republish payload") if payload is not None else None
        self.qos = qos
        self.retain = retain
        self.publisher = publisher

    async def run(self, output: Mapping[str, Any], message: RuleInput) -> None:
        topic = self.topic(output, message)
        if not topic or "+" in topic or "#" in topic:
            raise ValueError(f"republish: the topic template gave {topic!r}, not a topic name")
        body = self.payload(output, message) if self.payload is not None else json.dumps(
            dict(output), separators=(",", ":"), default=_text)
        self.publisher.republish(topic, body.encode(), self.qos, self.retain)


def republish_factory(publisher: Republisher) -> ActionFactory:
    def make(config: Mapping[str, Any]) -> Action:
        return RepublishAction(config, publisher)
    return make


class LogAction:
    """One log line per output (logger `meshd.rules`): the rule's id and the output as JSON."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        _check_keys(config, {"level"}, "log")
        level = config.get("level", "info")
        if level not in ("debug", "info", "warning", "error"):
            raise ValueError(f"log action: level is debug, info, warning or error, not {level!r}")
        self.level = logging.getLevelName(str(level).upper())

    async def run(self, output: Mapping[str, Any], message: RuleInput) -> None:
        log.log(self.level, "rule output from %s on %s: %s", message.clientid, message.topic or message.event,
                json.dumps(dict(output), separators=(",", ":"), default=_text))


def log_factory(config: Mapping[str, Any]) -> Action:
    return LogAction(config)
