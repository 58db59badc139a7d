"""The node's extensions, composed: plugins on the hook points, the rule engine with
its actions, and what the API and `/metrics` show of them. `mesh.compose` calls these;
the logic lives in `hooks/` and `rules/`."""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping, Protocol

from clock import Clock
from hooks import Hooks
from hooks.plugins import Plugin, load_plugins
from mesh.config import ConfigError
from mesh.metrics import Metrics
from mqtt import EMPTY_PROPERTIES, Properties
from rules.actions import ActionFactory, log_factory, republish_factory
from rules.engine import RuleEngine, RuleError
from session_store.model import Message


class PublishingBroker(Protocol):
    """The broker, as republish and the rules' usernames see it."""

    def make_message(self, topic: str, payload: bytes, qos: int, retain: bool, properties: Properties,
                     publisher: str | None, now: float) -> Message: ...
    def publish(self, msg: Message, now: float, *, internal: bool = False) -> int: ...


class BrokerRepublisher:
    """republish's way into the broker: a message from the node itself (no publisher),
    routed and forwarded like a client's, but not through message.publish (so a rule
    never sees its own output)."""

    def __init__(self, broker: PublishingBroker, clock: Clock) -> None:
        self.broker = broker
        self.clock = clock

    def republish(self, topic: str, payload: bytes, qos: int, retain: bool) -> None:
        now = self.clock.wall()
        self.broker.publish(self.broker.make_message(topic, payload, qos, retain, EMPTY_PROPERTIES, None, now), now)


class UsernameSource(Protocol):
    @property
    def connections(self) -> Mapping[str, Any]: ...


def build_rule_engine(tables: Iterable[Mapping[str, Any]], *, node_id: str, clock: Clock, hooks: Hooks,
                      broker: PublishingBroker, connections: UsernameSource,
                      more_actions: Mapping[str, ActionFactory] | None = None) -> RuleEngine:
    """The engine with the actions this node has (republish, log, and what other
    packages give: the bridges' webhook and bridge), and this node's `[[rules]]`.
    A bad rule in the config refuses the start (ConfigError naming `rules`)."""
    factories: dict[str, ActionFactory] = {"republish": republish_factory(BrokerRepublisher(broker, clock)),
                                           "log": log_factory}
    factories.update(more_actions or {})

    def username(client_id: str) -> str | None:
        conn = connections.connections.get(client_id)
        name = getattr(conn, "username", None)
        return name if isinstance(name, str) else None

    engine = RuleEngine(node_id=node_id, clock=clock, hooks=hooks, action_factories=factories, usernames=username)
    try:
        engine.load(tables)
    except RuleError as exc:
        raise ConfigError("rules", str(exc)) from None
    return engine


def load_node_plugins(names: Iterable[str], hooks: Hooks, node_id: str) -> list[Plugin]:
    return load_plugins(names, hooks, node_id=node_id)


def add_extension_metrics(metrics: Metrics, *, hooks: Hooks, plugins: list[Plugin], rules: RuleEngine) -> None:
    """Per-rule counters and hook failures in `/metrics` (read at scrape time)."""
    def per_rule(field: str) -> dict[str, int]:
        return {rule.id: getattr(rule.metrics, field) for rule in rules.rules.values()}

    def reader(field: str) -> Callable[[], dict[str, int]]:
        return lambda: per_rule(field)

    for field, name, help in (
        ("matched", "meshd_rule_matched_total", "messages and events that came from one of the rule's sources"),
        ("passed", "meshd_rule_passed_total", "of those, the ones its WHERE held for"),
        ("failed", "meshd_rule_failed_total", "evaluations of the rule that raised (the API shows the last error)"),
        ("actions_ok", "meshd_rule_actions_ok_total", "actions of the rule that ran"),
        ("actions_failed", "meshd_rule_actions_failed_total", "actions of the rule that raised or could not run"),
    ):
        metrics.counter_callback(name, help, reader(field), ("rule",))
    metrics.counter_callback("meshd_hook_errors_total", "hook callbacks that raised (logged with the callback's name, skipped)",
                             lambda: dict(hooks.errors), ("callback",))
    metrics.counter_callback("meshd_plugin_errors_total", "callbacks of a plugin that raised",
                             lambda: {p.name: p.errors(hooks) for p in plugins}, ("plugin",))
    metrics.gauge_callback("meshd_plugins_loaded", "plugins enabled on this node that loaded",
                           lambda: sum(1 for p in plugins if p.status == "loaded"))
