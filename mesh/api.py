"""The node's HTTP API: `GET /api/v1/status` and `GET /metrics` (Prometheus text)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mesh import __version__
from mesh.config import ConfigError
from mesh.http_api import Request, Response, Router, error_response, json_response
from mesh.metrics import add_metrics_route
from mesh.node_metrics import node_metrics

if TYPE_CHECKING:
    from mesh.node import Node


def build_router(node: "Node") -> Router:
    router = Router()
    metrics = node_metrics(node)

    async def status(request: Request) -> Response:
        s = node.settings
        listeners = {
            name: {"address": f"{getattr(s, name).host}:{port}"}
            for name, port in node.ports.items()
        }
        if "ws" in listeners:
            listeners["ws"]["path"] = s.ws_path
        return json_response({
            "node_id": node.node_id,
            "version": __version__,
            "uptime_s": round(node.uptime(), 3),
            "connected_clients": node.broker.client_count(),
            "sessions": len(node.broker.sessions),
            "subscriptions": node.broker.subscription_count(),
            "retained_messages": len(node.broker.retained),
            "listeners": listeners,
        })

    async def members(request: Request) -> Response:
        return json_response({"node_id": node.node_id, "members": node.gossip.members()})

    async def routes(request: Request) -> Response:
        return json_response({"node_id": node.node_id, "routes": node.cluster.routes()})

    async def config_list(request: Request) -> Response:
        return json_response({"node_id": node.node_id, "config": [r.as_dict() for r in node.config_sync.registers()]})

    async def config_get(request: Request) -> Response:
        key = request.path_params["key"]
        register = node.config_sync.config.get(key)
        if register is None:
            return error_response(404, f"{key}: not set cluster-wide")
        return json_response(register.as_dict())

    async def config_put(request: Request) -> Response:
        key = request.path_params["key"]
        body = request.json()
        if not isinstance(body, dict) or "value" not in body:
            return error_response(400, 'expected a JSON object {"value": ...}')
        try:
            register = node.config_sync.set(key, body["value"])
        except ConfigError as exc:
            return error_response(400, str(exc))
        return json_response(register.as_dict())

    router.add("GET", "/api/v1/routes", routes)
    router.add("GET", "/api/v1/config", config_list)
    router.add("GET", "/api/v1/config/{key}", config_get)
    router.add("PUT", "/api/v1/config/{key}", config_put)
    router.add("GET", "/api/v1/status", status)
    router.add("GET", "/api/v1/members", members)
    add_metrics_route(router, metrics)
    return router
