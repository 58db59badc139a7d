"""The rule engine: rules by id, each compiled once (`rules.sql`), fed by the hooks.

A rule whose sources are topic filters reads message.publish: the engine registers
one callback there while at least one such rule exists (none otherwise, so the
publish path pays nothing), finds the rules whose filters match the topic in a trie,
evaluates them and runs their actions before the publisher's acknowledgement (an
action that queues durably, as a bridge's, is then acknowledged only once queued).
Messages a rule republishes go to the broker directly, not through message.publish,
so no rule sees its own output again (no loops).

A rule whose sources are `$events/...` reads that hook point; the events' actions
run in the engine's own task (`run`), in order, from a bounded queue.

Per rule: matched (a message or event came from one of its sources), passed (its
WHERE held), failed (its evaluation raised: the last error is kept), and its
actions' ok / failed. Nothing one rule does stops another.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterable, Mapping, Protocol

import trio

from clock import Clock
from hooks import HookPoint, Hooks, Registration
from hooks.points import ClientInfo
from routing.trie import TopicTrie
from rules.actions import Action, ActionFactory
from rules.record import RuleInput
from rules.sql import RuleQuery, RuleSqlError, compile_rule
from session_store.model import Message

log = logging.getLogger("meshd.rules")

TOPIC_MEMORY = 10_000  # topics whose matching rules are remembered (a cache: cleared when full)
EVENT_QUEUE = 1024  # event outputs waiting for their actions; past it they are counted failed
PRIORITY = -50  # after plugins at message.publish (rules see what they let through), before the bridges' egress (-100)
_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


class RuleError(ValueError):
    """A rule refused (bad table, SQL, or action): the message says which and why."""


@dataclass(frozen=True)
class RuleSpec:
    """One rule as configured: `[[rules]]` in the config, or the API's JSON."""

    id: str
    sql: str
    actions: tuple[Mapping[str, Any], ...]
    description: str = ""

    @classmethod
    def from_table(cls, table: Mapping[str, Any]) -> "RuleSpec":
        if not isinstance(table, Mapping):
            raise RuleError("a rule is a table with id, sql and actions")
        unknown = sorted(set(table) - {"id", "sql", "actions", "description"})
        if unknown:
            raise RuleError(f"rule: unknown key {unknown[0]!r} (keys: id, sql, actions, description)")
        rule_id = table.get("id")
        if not isinstance(rule_id, str) or not rule_id or len(rule_id) > 128 or not set(rule_id) <= _ID_CHARS:
            raise RuleError(f"rule id {rule_id!r}: 1..128 of [A-Za-z0-9_.-] is required")
        sql = table.get("sql")
        if not isinstance(sql, str) or not sql.strip():
            raise RuleError(f"rule {rule_id}: sql is required")
        actions = table.get("actions", [])
        if not isinstance(actions, (list, tuple)) or not all(isinstance(a, Mapping) for a in actions):
            raise RuleError(f"rule {rule_id}: actions is a list of tables ([[rules.actions]])")
        description = table.get("description", "")
        if not isinstance(description, str):
            raise RuleError(f"rule {rule_id}: description is text")
        return cls(rule_id, sql, tuple(dict(a) for a in actions), description)

    def to_table(self) -> dict[str, Any]:
        table: dict[str, Any] = {"id": self.id, "sql": self.sql, "actions": [dict(a) for a in self.actions]}
        if self.description:
            table["description"] = self.description
        return table


@dataclass
class RuleMetrics:
    matched: int = 0
    passed: int = 0
    failed: int = 0
    actions_ok: int = 0
    actions_failed: int = 0
    last_error: str | None = None
    last_error_at: float | None = None  # wall-clock seconds

    def as_dict(self) -> dict[str, Any]:
        return {"matched": self.matched, "passed": self.passed, "failed": self.failed,
                "actions_ok": self.actions_ok, "actions_failed": self.actions_failed,
                "last_error": self.last_error, "last_error_at": self.last_error_at}


@dataclass
class Rule:
    spec: RuleSpec
    query: RuleQuery
    actions: list[tuple[str, Action]]
    source: str  # "file" (this node's config) or "cluster" (the API, on every node)
    metrics: RuleMetrics = field(default_factory=RuleMetrics)

    @property
    def id(self) -> str:
        return self.spec.id

    def as_dict(self) -> dict[str, Any]:
        return {**self.spec.to_table(), "source": self.source, "from": list(self.query.topic_filters)
                + [f"$events/{e.replace('.', '_')}" for e in self.query.events], "metrics": self.metrics.as_dict()}


class Usernames(Protocol):
    def __call__(self, client_id: str) -> str | None: ...


# The hook points an event source follows, and how its callback's context becomes an input.
_EVENT_POINTS: dict[str, HookPoint] = {p.value: p for p in (
    HookPoint.CLIENT_CONNECTED, HookPoint.CLIENT_DISCONNECTED, HookPoint.SESSION_SUBSCRIBED,
    HookPoint.SESSION_UNSUBSCRIBED, HookPoint.MESSAGE_DELIVERED, HookPoint.MESSAGE_ACKED, HookPoint.MESSAGE_DROPPED)}


class RuleEngine:
    def __init__(self, *, node_id: str, clock: Clock, hooks: Hooks, action_factories: Mapping[str, ActionFactory],
                 usernames: Usernames | None = None) -> None:
        self.node_id = node_id
        self.clock = clock
        self.hooks = hooks
        self.action_factories = dict(action_factories)
        self._usernames = usernames
        self.rules: dict[str, Rule] = {}
        self.refused: dict[str, str] = {}  # rule id -> why a cluster rule cannot run here
        self._file_rules: dict[str, Rule] = {}  # this node's [[rules]], by id
        self._by_filter: TopicTrie[str] = TopicTrie()
        self._rules_by_topic: dict[str, tuple[Rule, ...]] = {}  # topic -> its rules (`_match`), until a change
        self._publish_hook: Registration | None = None
        self._event_hooks: dict[str, Registration] = {}
        self._events_send, self._events_receive = trio.open_memory_channel[tuple[Rule, dict[str, Any], RuleInput]](EVENT_QUEUE)

    # ------------------------------------------------------------------ rules

    def build(self, spec: RuleSpec, source: str = "cluster") -> Rule:
        """Compile a rule and make its actions; RuleError says what is wrong (the SQL's
        parse error with its position, an unknown function, an action type that is not
        available). Nothing running changes."""
        try:
            query = compile_rule(spec.sql)
        except RuleSqlError as exc:
            raise RuleError(f"rule {spec.id}: {exc}") from None
        actions: list[tuple[str, Action]] = []
        for i, config in enumerate(spec.actions):
            kind = config.get("type")
            if not isinstance(kind, str):
                raise RuleError(f"rule {spec.id}: action {i + 1} has no type (types: {', '.join(sorted(self.action_factories))})")
            factory = self.action_factories.get(kind)
            if factory is None:
                raise RuleError(f"rule {spec.id}: action type {kind!r} is not available"
                                f" (available: {', '.join(sorted(self.action_factories))})")
            try:
                actions.append((kind, factory(config)))
            except ValueError as exc:
                raise RuleError(f"rule {spec.id}: action {i + 1} ({kind}): {exc}") from None
        return Rule(spec, query, actions, source)

    def install(self, rule: Rule) -> None:
        """Put a built rule in place (replacing one with the same id)."""
        self._unindex(rule.id)
        self.rules[rule.id] = rule
        for topic_filter in rule.query.topic_filters:
            self._by_filter.add(topic_filter, rule.id)
        self._rewire()

    def remove(self, rule_id: str) -> bool:
        if rule_id not in self.rules:
            return False
        self._unindex(rule_id)
        del self.rules[rule_id]
        self._rewire()
        return True

    def load(self, tables: Iterable[Mapping[str, Any]]) -> None:
        """This node's `[[rules]]`: all or nothing (RuleError for the first bad one)."""
        built = [self.build(RuleSpec.from_table(t), "file") for t in tables]
        ids = [r.id for r in built]
        duplicate = next((i for i in ids if ids.count(i) > 1), None)
        if duplicate is not None:
            raise RuleError(f"rule id {duplicate!r} is configured twice")
        for rule in built:
            self._file_rules[rule.id] = rule
            self.install(rule)

    def get(self, rule_id: str) -> Rule | None:
        return self.rules.get(rule_id)

    def _unindex(self, rule_id: str) -> None:
        old = self.rules.get(rule_id)
        if old is not None:
            for topic_filter in old.query.topic_filters:
                self._by_filter.remove(topic_filter, rule_id)

    def _rewire(self) -> None:
        """Keep a callback at exactly the hook points some rule reads."""
        self._rules_by_topic.clear()
        wants_messages = any(r.query.topic_filters for r in self.rules.values())
        if wants_messages and self._publish_hook is None:
            self._publish_hook = self.hooks.add(HookPoint.MESSAGE_PUBLISH, self._on_publish, PRIORITY, "rules")
        elif not wants_messages and self._publish_hook is not None:
            self.hooks.remove(self._publish_hook)
            self._publish_hook = None
        wanted = {e for r in self.rules.values() for e in r.query.events}
        for event in wanted - self._event_hooks.keys():
            self._event_hooks[event] = self.hooks.add(_EVENT_POINTS[event], self._event_callback(event), PRIORITY,
                                                      f"rules:{event}")
        for event in set(self._event_hooks) - wanted:
            self.hooks.remove(self._event_hooks.pop(event))

    # ------------------------------------------------------------------ messages

    def _now_ms(self) -> int:
        return int(self.clock.wall() * 1000)

    def _on_publish(self, msg: Message) -> Awaitable[None] | None:
        """message.publish: evaluate the matching rules now; a coroutine that runs their
        actions when some rule passed (awaited before the PUBACK), else None."""
        rules = self._rules_by_topic.get(msg.topic)
        if rules is None:
            rules = self._match(msg.topic)
        if not rules:
            return None
        publisher = msg.publisher
        source = RuleInput.of_message(msg, event="message.publish", node=self.node_id, timestamp=self._now_ms(),
                                      username=self._usernames(publisher) if self._usernames and publisher else None)
        outputs = None
        for rule in rules:
            out = self._evaluate(rule, source)
            if out is not None:
                outputs = [out] if outputs is None else outputs + [out]
        return self._run_all(outputs, source) if outputs else None

    def _match(self, topic: str) -> tuple[Rule, ...]:
        """The rules whose filters match `topic` (each once, in the order the rules were
        put in place, whatever the trie's order), remembered per topic until the rules
        change; the memory is bounded (cleared when full)."""
        matched = {i for _, ids in self._by_filter.match_filters(topic) for i in ids}
        rules = tuple(r for r in self.rules.values() if r.id in matched)  # in the order they were put in place
        if len(self._rules_by_topic) >= TOPIC_MEMORY:
            self._rules_by_topic.clear()
        self._rules_by_topic[topic] = rules
        return rules

    def _evaluate(self, rule: Rule, source: RuleInput) -> tuple[Rule, dict[str, Any]] | None:
        metrics = rule.metrics
        metrics.matched += 1
        try:
            output = rule.query.evaluate(source)
        except Exception as exc:
            self._failed(rule, f"{type(exc).__name__}: {exc}" if not isinstance(exc, ValueError) else str(exc))
            return None
        if output is None:
            return None
        metrics.passed += 1
        if not rule.actions:
            return None
        return rule, output

    def _failed(self, rule: Rule, error: str) -> None:
        metrics = rule.metrics
        metrics.failed += 1
        metrics.last_error = error
        metrics.last_error_at = self.clock.wall()
        if metrics.failed == 1 or metrics.failed % 1000 == 0:
            log.warning("rule %s failed (%d so far): %s", rule.id, metrics.failed, error)

    async def _run_all(self, outputs: list[tuple[Rule, dict[str, Any]]], source: RuleInput) -> None:
        for rule, output in outputs:
            await self._run_actions(rule, output, source)

    async def _run_actions(self, rule: Rule, output: dict[str, Any], source: RuleInput) -> None:
        metrics = rule.metrics
        for kind, action in rule.actions:
            try:
                await action.run(output, source)
            except Exception as exc:
                metrics.actions_failed += 1
                metrics.last_error = f"{kind} action: {type(exc).__name__}: {exc}"
                metrics.last_error_at = self.clock.wall()
                if metrics.actions_failed == 1 or metrics.actions_failed % 1000 == 0:
                    log.warning("rule %s: %s action failed (%d so far): %s", rule.id, kind, metrics.actions_failed, exc)
            else:
                metrics.actions_ok += 1

    # ------------------------------------------------------------------ events

    def _event_callback(self, event: str) -> Callable[..., None]:
        def on_event(_value: object, *context: Any) -> None:
            source = self._event_input(event, context)
            for rule in self.rules.values():
                if event not in rule.query.events:
                    continue
                out = self._evaluate(rule, source)
                if out is None:
                    continue
                try:
                    self._events_send.send_nowait((out[0], out[1], source))
                except trio.WouldBlock:
                    rule.metrics.actions_failed += len(rule.actions)
                    rule.metrics.last_error = f"event actions queue full ({EVENT_QUEUE}): an output was dropped"
                    rule.metrics.last_error_at = self.clock.wall()
        return on_event

    def _event_input(self, event: str, context: tuple[Any, ...]) -> RuleInput:
        now = self._now_ms()
        if event in ("client.connected", "client.disconnected"):
            info: ClientInfo = context[0]
            return RuleInput(event, node=self.node_id, timestamp=now, clientid=info.client_id, username=info.username,
                             peer=info.peer, protocol=info.protocol_level,
                             reason=str(context[1]) if len(context) > 1 else None)
        if event in ("session.subscribed", "session.unsubscribed"):
            return RuleInput(event, node=self.node_id, timestamp=now, clientid=context[0], topic=context[1],
                             qos=context[2] if len(context) > 2 else None,
                             username=self._usernames(context[0]) if self._usernames else None)
        if event == "message.dropped":
            msg, reason = context[0], str(context[1])
            return RuleInput.of_message(msg, event=event, node=self.node_id, timestamp=now, reason=reason)
        # message.delivered / message.acked: (client id of the subscriber, message)
        client_id, msg = context[0], context[1]
        return RuleInput.of_message(msg, event=event, node=self.node_id, timestamp=now, clientid=client_id,
                                    username=self._usernames(client_id) if self._usernames else None)

    async def run(self) -> None:
        """Run the actions of event rules, in order (a task of the node)."""
        async with self._events_receive:
            async for rule, output, source in self._events_receive:
                await self._run_actions(rule, output, source)

    # ------------------------------------------------------------------ cluster

    def apply_cluster(self, rule_id: str, table_json: str) -> None:
        """A rule added (JSON of its table) or deleted ("") through the API on some
        node, as config sync delivers it: installed here unless this node cannot run
        it (refused, logged, listed in `refused`)."""
        self.refused.pop(rule_id, None)
        if not table_json:
            current = self.rules.get(rule_id)
            if current is not None and current.source == "cluster":
                self.remove(rule_id)
                file_rule = self._file_rules.get(rule_id)
                if file_rule is not None:  # the cluster's rule had replaced this node's own
                    self.install(file_rule)
            return
        try:
            spec = RuleSpec.from_table(json.loads(table_json))
            if spec.id != rule_id:
                raise RuleError(f"rule {rule_id}: the cluster value names rule {spec.id!r}")
            rule = self.build(spec, "cluster")
        except (RuleError, ValueError) as exc:
            self.refused[rule_id] = str(exc)
            log.error("rule %s from the cluster cannot run on this node: %s", rule_id, exc)
            return
        self.install(rule)

    # ------------------------------------------------------------------ reading

    def listing(self) -> list[dict[str, Any]]:
        return [rule.as_dict() for rule in self.rules.values()]


def cluster_rule_key(rule_id: str) -> str:
    """The cluster config key of a rule added through the API."""
    return f"rule/{rule_id}"

