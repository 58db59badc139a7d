"""The node's HTTP API (JSON) and `/metrics` (Prometheus text).

    GET  /api/v1/status           node id, version, uptime, clients, listeners
    GET  /api/v1/members          the gossip member list (with `last_contact_s`: seconds since
                                  the member's last datagram reached this node)
    GET  /api/v1/cluster          members, current partitions, unreachable members, history,
                                  `held`: messages held per unreachable member
    GET  /api/v1/routes           the cluster route table (filter -> nodes) and `versions`:
                                  the route-table epoch and version held per origin
    GET  /api/v1/node             this node: clients, sessions, subscriptions, inflight, queued,
                                  counters, RocksDB size on disk, rates over the last 10 minutes
    GET  /api/v1/config           every setting: value in effect, source (default, file, env,
                                  flag, or cluster with its origin node and HLC), and
                                  `cluster_keys`: the settings PUT may change cluster-wide
    GET  /api/v1/config/{key}
    PUT  /api/v1/config/{key}     {"value": ...}: change a cluster-wide setting
    GET  /api/v1/streams          the durable streams, with this node's counters
    POST /api/v1/clients/{client_id}/kick   disconnect a client wherever it is connected (v5: 0x98)
    GET  /api/v1/clients          clients and their sessions, cluster-wide (paged, filtered)
    GET  /api/v1/clients/{client_id}        one client: connection, session, subscriptions
    DELETE /api/v1/sessions/{client_id}     end a session wherever it is
    GET  /api/v1/delayed          pending delayed messages, cluster-wide (`mesh.delayed_ops`,
    GET  /api/v1/delayed/{id}     given as extra routes);  DELETE: cancel one wherever it is
    GET  /api/v1/subscriptions    subscriptions, cluster-wide (?topic= who gets that topic)
    GET  /api/v1/bridges          every bridge on this node: config, status, metrics
    POST /api/v1/bridges          a bridge's table: add or replace it on every node
    GET  /api/v1/bridges/{id}
    DELETE /api/v1/bridges/{id}   remove it on every node
    GET  /metrics
    (and the routes of `mesh.extensions_api`: /api/v1/rules, /api/v1/plugins)
    GET  /                        the dashboard (mesh/web/, `mesh.dashboard`: static files, no data; every
                                  page reads the endpoints above with the token, if one is set)

The cluster-wide answers (`mesh.inventory`) name the members that did not answer in
`missing`.

With `api_token` set, every endpoint needs `Authorization: Bearer <token>`; with
`api_open_reads` the GET endpoints do not.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Mapping, Protocol, Sequence, Sized

from gossip.swim import MemberInfo
from mesh import __version__
from mesh.cluster_config import CLUSTER_KEYS, Register
from mesh.config import ConfigError, Settings
from mesh.config_sync import register_entry, setting_in_effect, settings_in_effect
from mesh.dashboard import add_dashboard_routes
from mesh.http_api import HttpError, Request, Response, Router, error_response, json_response
from mesh.inventory import DEFAULT_LIMIT, MAX_LIMIT, BadQuery, ClientFilter, Missing, Page
from mesh.metrics import CONTENT_TYPE, Metrics
from mesh.node_metrics import RetainedCounts, retained_counts


class ApiSecurity(Protocol):
    def api_allows(self, method: str, authorization: str | None) -> bool: ...


class ApiBroker(Protocol):
    @property
    def sessions(self) -> Sized: ...
    @property
    def retained(self) -> RetainedCounts: ...
    def client_count(self) -> int: ...
    def subscription_count(self) -> int: ...


class ApiMembers(Protocol):
    def members(self) -> list[MemberInfo]: ...
    def contact_ages(self) -> dict[str, float]: ...


class ApiPartitions(Protocol):
    def snapshot(self) -> Mapping[str, object]: ...


class ApiRoutes(Protocol):
    def routes(self) -> Sequence[Mapping[str, object]]: ...
    def route_versions(self) -> Mapping[str, Mapping[str, int]]: ...
    def held_counts(self) -> Mapping[str, int]: ...


class ApiNodeStats(Protocol):
    async def snapshot(self) -> dict[str, object]: ...


class ApiConfig(Protocol):
    def registers(self) -> list[Register]: ...
    def get(self, key: str) -> Register | None: ...
    def set(self, key: str, raw: object) -> Register: ...


class ApiInventory(Protocol):
    async def clients(self, flt: ClientFilter, *, node: str | None = None, after: str | None = None,
                      limit: int = DEFAULT_LIMIT) -> Page: ...
    async def client(self, client_id: str) -> tuple[dict[str, Any] | None, list[Missing]]: ...
    async def discard(self, client_id: str) -> tuple[list[str], list[Missing]]: ...
    async def kick(self, client_id: str) -> tuple[list[str], list[Missing]]: ...
    async def subscriptions(self, *, topic: str | None = None, client_id: str | None = None, node: str | None = None,
                            after: str | None = None, limit: int = DEFAULT_LIMIT) -> Page: ...


class ApiStreams(Protocol):
    def describe(self) -> list[dict[str, object]]: ...


Handler = Callable[[Request], Awaitable[Response]]


def _limit(request: Request) -> int:
    text = request.query.get("limit", str(DEFAULT_LIMIT))
    if not text.isdigit() or not 1 <= int(text) <= MAX_LIMIT:
        raise HttpError(400, f"limit: expected an integer 1..{MAX_LIMIT}, not {text!r}")
    return int(text)


def _connected(request: Request) -> bool | None:
    text = request.query.get("connected")
    if text is None or text == "":
        return None
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise HttpError(400, f"connected: expected true or false, not {text!r}")


def _missing(missing: list[Missing]) -> list[dict[str, str]]:
    return [{"node": m.node, "reason": m.reason} for m in missing]


def build_router(*, node_id: str, settings: Settings, ports: Mapping[str, int], uptime: Callable[[], float],
                 security: ApiSecurity, broker: ApiBroker, gossip: ApiMembers, partitions: ApiPartitions,
                 cluster: ApiRoutes, config_sync: ApiConfig, metrics: Metrics, inventory: ApiInventory,
                 node_stats: ApiNodeStats, extra_routes: Sequence[tuple[str, str, Handler]] = (),
                 streams: ApiStreams | None = None) -> Router:
    """The API's routes; `ports` fills in as the node's listeners bind, `/metrics`
    renders `metrics`. `extra_routes` are (method, path, handler) of other parts
    (`mesh.bridging`), behind the same token check."""
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
            "retained_messages": retained_counts(broker.retained)[0],
            "sys_retained_messages": retained_counts(broker.retained)[1],
            "listeners": listeners,
        })

    def members_with_contact() -> list[dict[str, object]]:
        ages = gossip.contact_ages()
        return [{**m, "last_contact_s": ages.get(m["id"])} for m in gossip.members()]

    async def members(request: Request) -> Response:
        return json_response({"node_id": node_id, "members": members_with_contact()})

    async def cluster_state(request: Request) -> Response:
        return json_response({**partitions.snapshot(), "members": members_with_contact(),
                              "held": cluster.held_counts()})

    async def routes(request: Request) -> Response:
        return json_response({"node_id": node_id, "routes": cluster.routes(), "versions": cluster.route_versions()})

    async def node(request: Request) -> Response:
        return json_response({"node_id": node_id, **(await node_stats.snapshot())})

    async def config_list(request: Request) -> Response:
        # `cluster_keys`: what PUT may change cluster-wide (the dashboard's edit boxes)
        return json_response({"node_id": node_id, "config": settings_in_effect(settings, config_sync.registers()),
                              "cluster_keys": list(CLUSTER_KEYS)})

    async def config_get(request: Request) -> Response:
        key = request.path_params["key"]
        entry = setting_in_effect(settings, config_sync.registers(), key)
        if entry is None:
            return error_response(404, f"{key}: no such setting")
        return json_response(entry)

    async def config_put(request: Request) -> Response:
        key = request.path_params["key"]
        body = request.json()
        if not isinstance(body, dict) or "value" not in body:
            return error_response(400, 'expected a JSON object {"value": ...}')
        try:
            register = config_sync.set(key, body["value"])
        except ConfigError as exc:
            return error_response(400, str(exc))
        return json_response(register_entry(register))

    async def kick(request: Request) -> Response:
        client_id = request.path_params["client_id"]
        nodes, missing = await inventory.kick(client_id)
        if not nodes:
            return json_response({"error": f"{client_id}: not connected to any member that answered",
                                  "missing": _missing(missing)}, 404)
        return json_response({"kicked": client_id, "nodes": nodes, "missing": _missing(missing)})

    async def clients(request: Request) -> Response:
        q = request.query
        flt = ClientFilter(q.get("clientid_prefix") or None, q.get("username") or None, _connected(request))
        limit = _limit(request)
        try:
            page = await inventory.clients(flt, node=q.get("node") or None, after=q.get("after") or None, limit=limit)
        except BadQuery as exc:
            return error_response(400, str(exc))
        return json_response(page.as_json(limit))

    async def client(request: Request) -> Response:
        client_id = request.path_params["client_id"]
        found, missing = await inventory.client(client_id)
        if found is None:
            return json_response({"error": f"{client_id}: no such client on the members that answered",
                                  "missing": _missing(missing)}, 404)
        return json_response({**found, "missing": _missing(missing)})

    async def discard(request: Request) -> Response:
        client_id = request.path_params["client_id"]
        nodes, missing = await inventory.discard(client_id)
        if not nodes:
            return json_response({"error": f"{client_id}: no such session on the members that answered",
                                  "missing": _missing(missing)}, 404)
        return json_response({"deleted": client_id, "nodes": nodes, "missing": _missing(missing)})

    async def subscriptions(request: Request) -> Response:
        q = request.query
        limit = _limit(request)
        try:
            page = await inventory.subscriptions(topic=q.get("topic") or None, client_id=q.get("clientid") or None,
                                                 node=q.get("node") or None, after=q.get("after") or None,
                                                 limit=limit)
        except BadQuery as exc:
            return error_response(400, str(exc))
        return json_response(page.as_json(limit))

    async def stream_list(request: Request) -> Response:
        return json_response({"node_id": node_id, "streams": streams.describe() if streams is not None else []})

    async def prometheus(request: Request) -> Response:
        return Response(200, metrics.render().encode("utf-8"), CONTENT_TYPE)

    add("GET", "/api/v1/status", status)
    add("GET", "/api/v1/members", members)
    add("GET", "/api/v1/cluster", cluster_state)
    add("GET", "/api/v1/routes", routes)
    add("GET", "/api/v1/node", node)
    add("GET", "/api/v1/config", config_list)
    add("GET", "/api/v1/config/{key}", config_get)
    add("PUT", "/api/v1/config/{key}", config_put)
    add("POST", "/api/v1/clients/{client_id}/kick", kick)
    add("GET", "/api/v1/clients", clients)
    add("GET", "/api/v1/clients/{client_id}", client)
    add("DELETE", "/api/v1/sessions/{client_id}", discard)
    add("GET", "/api/v1/subscriptions", subscriptions)
    add("GET", "/api/v1/streams", stream_list)
    add("GET", "/metrics", prometheus)
    for method, path, handler in extra_routes:
        add(method, path, handler)
    # The dashboard's files carry no data and no secret: served without the token, so
    # that the page can ask for it (its login form); everything it shows comes from the
    # guarded endpoints above.
    add_dashboard_routes(router)
    return router
