"""The node's HTTP API (JSON) and `/metrics` (Prometheus text).

    GET  /api/v1/status           node id, version, uptime, clients, listeners
    GET  /api/v1/members          the gossip member list
    GET  /api/v1/cluster          members, current partitions, unreachable members, history
    GET  /api/v1/routes           the cluster route table (filter -> nodes)
    GET  /api/v1/config           cluster-wide settings (value, origin, HLC)
    GET  /api/v1/config/{key}
    PUT  /api/v1/config/{key}     {"value": ...}: change a cluster-wide setting
    POST /api/v1/clients/{client_id}/kick   disconnect a client (v5: 0x98)
    GET  /metrics

With `api_token` set, every endpoint needs `Authorization: Bearer <token>`; with
`api_open_reads` the GET endpoints do not.
"""

from __future__ import annotations

from typing import Awaitable, Callable, Mapping, Protocol, Sequence, Sized

from gossip.swim import MemberInfo
from mesh import __version__
from mesh.cluster_config import Register
from mesh.config import ConfigError, Settings
from mesh.http_api import Request, Response, Router, error_response, json_response
from mesh.metrics import CONTENT_TYPE, Metrics
from mqtt import ReasonCode


class ApiSecurity(Protocol):
    def api_allows(self, method: str, authorization: str | None) -> bool: ...


class Kickable(Protocol):
    def close(self, reason: int) -> None: ...


class ApiBroker(Protocol):
    @property
    def sessions(self) -> Sized: ...
    @property
    def retained(self) -> Sized: ...
    @property
    def connections(self) -> Mapping[str, Kickable]: ...
    def client_count(self) -> int: ...
    def subscription_count(self) -> int: ...


class ApiMembers(Protocol):
    def members(self) -> list[MemberInfo]: ...


class ApiPartitions(Protocol):
    def snapshot(self) -> Mapping[str, object]: ...


class ApiRoutes(Protocol):
    def routes(self) -> Sequence[Mapping[str, object]]: ...


class ApiConfig(Protocol):
    def registers(self) -> list[Register]: ...
    def get(self, key: str) -> Register | None: ...
    def set(self, key: str, raw: object) -> Register: ...


Handler = Callable[[Request], Awaitable[Response]]


def build_router(*, node_id: str, settings: Settings, ports: Mapping[str, int], uptime: Callable[[], float],
                 security: ApiSecurity, broker: ApiBroker, gossip: ApiMembers, partitions: ApiPartitions,
                 cluster: ApiRoutes, config_sync: ApiConfig, metrics: Metrics) -> Router:
    """The API's routes; `ports` fills in as the node's listeners bind, `/metrics`
    renders `metrics`."""
    router = Router()

    def add(method: str, path: str, handler: Handler) -> None:
        async def guarded(request: Request) -> Response:
            if not security.api_allows(request.method, request.headers.get("authorization")):
                response = error_response(401, "missing or wrong bearer token")
                response.headers["WWW-Authenticate"] = 'Bearer realm="meshd"'
                return response
            return await handler(request)

        router.add(method, path, guarded)

    async def status(request: Request) -> Response:
        s = settings
        listeners = {
            name: {"address": f"{getattr(s, name).host}:{port}"}
            for name, port in ports.items()
        }
        for name in ("ws", "wss"):
            if name in listeners:
                listeners[name]["path"] = s.ws_path
        return json_response({
            "node_id": node_id,
            "version": __version__,
            "uptime_s": round(uptime(), 3),
            "connected_clients": broker.client_count(),
            "sessions": len(broker.sessions),
            "subscriptions": broker.subscription_count(),
            "retained_messages": len(broker.retained),
            "listeners": listeners,
        })

    async def members(request: Request) -> Response:
        return json_response({"node_id": node_id, "members": gossip.members()})

    async def cluster_state(request: Request) -> Response:
        return json_response(partitions.snapshot())

    async def routes(request: Request) -> Response:
        return json_response({"node_id": node_id, "routes": cluster.routes()})

    async def config_list(request: Request) -> Response:
        return json_response({"node_id": node_id, "config": [r.as_dict() for r in config_sync.registers()]})

    async def config_get(request: Request) -> Response:
        key = request.path_params["key"]
        register = config_sync.get(key)
        if register is None:
            return error_response(404, f"{key}: not set cluster-wide")
        return json_response(register.as_dict())

    async def config_put(request: Request) -> Response:
        key = request.path_params["key"]
        body = request.json()
        if not isinstance(body, dict) or "value" not in body:
            return error_response(400, 'expected a JSON object {"value": ...}')
        try:
            register = config_sync.set(key, body["value"])
        except ConfigError as exc:
            return error_response(400, str(exc))
        return json_response(register.as_dict())

    async def kick(request: Request) -> Response:
        client_id = request.path_params["client_id"]
        conn = broker.connections.get(client_id)
        if conn is None:
            return error_response(404, f"{client_id}: not connected to this node")
        conn.close(ReasonCode.ADMINISTRATIVE_ACTION)
        return json_response({"kicked": client_id})

    async def prometheus(request: Request) -> Response:
        return Response(200, metrics.render().encode("utf-8"), CONTENT_TYPE)

    add("GET", "/api/v1/status", status)
    add("GET", "/api/v1/members", members)
    add("GET", "/api/v1/cluster", cluster_state)
    add("GET", "/api/v1/routes", routes)
    add("GET", "/api/v1/config", config_list)
    add("GET", "/api/v1/config/{key}", config_get)
    add("PUT", "/api/v1/config/{key}", config_put)
    add("POST", "/api/v1/clients/{client_id}/kick", kick)
    add("GET", "/metrics", prometheus)
    return router
