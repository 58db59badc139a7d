"""The API of the node's extensions: rules (cluster-wide, through config sync) and
plugins (this node's).

    GET    /api/v1/rules          every rule here, with its metrics
    POST   /api/v1/rules          {"id", "sql", "actions": [...]}: add (or replace) a rule on every node
    GET    /api/v1/rules/{id}     one rule, with its metrics
    DELETE /api/v1/rules/{id}     remove a rule added through the API, on every node
    GET    /api/v1/plugins        this node's plugins and every hook callback, with errors
"""

from __future__ import annotations

import json
from typing import Any, Awaitable, Callable, Protocol

from hooks import Hooks
from hooks.plugins import Plugin
from mesh.cluster_config import Register
from mesh.config import ConfigError
from mesh.http_api import Request, Response, error_response, json_response
from rules.engine import Rule, RuleError, RuleSpec

Handler = Callable[[Request], Awaitable[Response]]
Route = tuple[str, str, Handler]  # (method, path, handler), as `build_router(extra_routes=...)` takes them


class ApiRules(Protocol):
    def build(self, spec: RuleSpec, source: str = ...) -> Rule: ...
    def get(self, rule_id: str) -> Rule | None: ...
    def listing(self) -> list[dict[str, Any]]: ...
    @property
    def refused(self) -> dict[str, str]: ...


class ApiConfigSet(Protocol):
    def set(self, key: str, raw: object) -> Register: ...


def rule_key(rule_id: str) -> str:
    """The cluster config register of a rule added through the API (family `rule`)."""
    return f"rule/{rule_id}"


def rule_routes(*, node_id: str, rules: ApiRules, config_sync: ApiConfigSet) -> list[Route]:
    async def listing(request: Request) -> Response:
        return json_response({"node_id": node_id, "rules": rules.listing(), "refused": rules.refused})

    async def create(request: Request) -> Response:
        body = request.json()
        try:
            if not isinstance(body, dict):
                raise RuleError('expected a JSON object {"id": ..., "sql": ..., "actions": [...]}')
            spec = RuleSpec.from_table(body)
            rules.build(spec)  # refused here, with the reason, before anything changes
        except RuleError as exc:
            return error_response(400, str(exc))
        current = rules.get(spec.id)
        if current is not None and current.source == "file":
            return error_response(409, f"rule {spec.id} comes from this node's config file; choose another id")
        try:
            config_sync.set(rule_key(spec.id), json.dumps(spec.to_table(), sort_keys=True))
        except ConfigError as exc:
            return error_response(400, str(exc))
        rule = rules.get(spec.id)
        if rule is None:  # built above, so it installs; only a refusal logged by apply gets here
            return error_response(500, rules.refused.get(spec.id, f"rule {spec.id} did not install"))
        return json_response(rule.as_dict(), 200 if current is not None else 201)

    async def show(request: Request) -> Response:
        rule_id = request.path_params["rule_id"]
        rule = rules.get(rule_id)
        if rule is None:
            if rule_id in rules.refused:
                return json_response({"error": f"rule {rule_id} cannot run on this node: {rules.refused[rule_id]}"}, 404)
            return error_response(404, f"{rule_id}: no such rule")
        return json_response(rule.as_dict())

    async def delete(request: Request) -> Response:
        rule_id = request.path_params["rule_id"]
        rule = rules.get(rule_id)
        if rule is None and rule_id not in rules.refused:
            return error_response(404, f"{rule_id}: no such rule")
        if rule is not None and rule.source == "file":
            return error_response(409, f"rule {rule_id} comes from this node's config file; remove it there")
        config_sync.set(rule_key(rule_id), "")
        return json_response({"deleted": rule_id})

    return [("GET", "/api/v1/rules", listing), ("POST", "/api/v1/rules", create),
            ("GET", "/api/v1/rules/{rule_id}", show), ("DELETE", "/api/v1/rules/{rule_id}", delete)]


def plugin_routes(*, node_id: str, plugins: list[Plugin], hooks: Hooks) -> list[Route]:
    async def listing(request: Request) -> Response:
        return json_response({
            "node_id": node_id,
            "plugins": [p.as_dict(hooks) for p in plugins],
            "hooks": [{"point": r.point.value, "callback": r.name, "priority": r.priority,
                       "errors": hooks.errors.get(r.name, 0)} for r in hooks.registrations()],
        })
    return [("GET", "/api/v1/plugins", listing)]
