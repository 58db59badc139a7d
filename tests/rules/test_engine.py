"""The rule engine in process: which rules a topic reaches is remembered per topic and
forgotten when the rules change; a rule's failure is counted on it alone; the engine
keeps a message.publish callback only while some rule reads messages."""

from __future__ import annotations

from typing import Any, Mapping

from clock import ManualClock
from hooks import HookPoint, Hooks
from mqtt import EMPTY_PROPERTIES
from rules.engine import RuleEngine, RuleSpec
from rules.record import RuleInput
from session_store.model import Message


class Recorder:
    def __init__(self, config: Mapping[str, Any]) -> None:
        self.name = config["name"]

    async def run(self, output: Mapping[str, Any], message: RuleInput) -> None:
        SEEN.append((self.name, dict(output)))


SEEN: list[tuple[str, dict[str, Any]]] = []


def engine() -> tuple[RuleEngine, Hooks]:
    hooks = Hooks()
    return RuleEngine(node_id="n1", clock=ManualClock(), hooks=hooks, action_factories={"record": Recorder}), hooks


def rule(rule_id: str, sql: str) -> RuleSpec:
    return RuleSpec.from_table({"id": rule_id, "sql": sql, "actions": [{"type": "record", "name": rule_id}]})


async def publish(hooks: Hooks, topic: str, payload: bytes) -> None:
    await hooks.run_publish(Message(topic, payload, 0, False, EMPTY_PROPERTIES, None, "c1", 1, "n1"))


async def test_rules_added_later_reach_topics_already_seen() -> None:
    SEEN.clear()
    eng, hooks = engine()
    assert hooks.message_publish == ()
    eng.install(eng.build(rule("a", 'SELECT topic FROM "a/#"')))
    assert len(hooks.message_publish) == 1
    await publish(hooks, "a/x", b"{}")
    eng.install(eng.build(rule("b", 'SELECT topic, payload.n AS n FROM "a/+", "a/#"')))
    await publish(hooks, "a/x", b'{"n": 1}')
    assert SEEN == [("a", {"topic": "a/x"}), ("a", {"topic": "a/x"}), ("b", {"topic": "a/x", "n": 1})]
    eng.remove("a")
    await publish(hooks, "a/x", b"not json")  # b fails (payload.n of a payload that is not JSON): counted on b
    assert eng.rules["b"].metrics.failed == 1 and eng.rules["b"].metrics.last_error == "the payload is not JSON"
    eng.remove("b")
    assert hooks.message_publish == () and hooks.chain(HookPoint.CLIENT_CONNECTED) == ()
