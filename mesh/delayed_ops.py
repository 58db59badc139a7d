"""The operator's side of delayed publish (`delayed.service`): the HTTP routes and the
metrics. Each node keeps the delayed messages published through it (`origin`); asked
on any node, the routes answer for the whole cluster, each member for its own (a
cluster query, as `mesh.inventory` puts them; members that did not answer are listed
in `missing`):

    GET    /api/v1/delayed          pending messages in due order (?limit=, ?after=ID, ?node=)
    GET    /api/v1/delayed/{id}     one pending message
    DELETE /api/v1/delayed/{id}     cancel it
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict
from typing import Any, Awaitable, Callable, Iterable, Mapping, Protocol

from delayed.records import DelayedEntry, id_to_key
from delayed.service import DelayedStats
from mesh.http_api import HttpError, Request, Response, error_response, json_response
from mesh.inventory import Answer, Missing
from mesh.metrics import Metrics

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000  # a page is read, decoded and formatted on the event loop: ~40 ms at most


class OperatedDelayed(Protocol):
    """`delayed.service.DelayedMessages` as the API and the metrics see it."""

    @property
    def stats(self) -> DelayedStats: ...
    @property
    def pending(self) -> int: ...
    def page(self, after: str | None, limit: int) -> list[DelayedEntry]: ...
    def get(self, ident: str) -> DelayedEntry | None: ...
    def cancel(self, ident: str) -> DelayedEntry | None: ...
    def row(self, entry: DelayedEntry) -> dict[str, object]: ...


class ClusterAsk(Protocol):
    """`mesh.inventory.Inventory.ask_all`: every member's answer, and who gave none."""

    async def ask_all(self, query: str, args: Mapping[str, Any],
                      node: str | None = None) -> tuple[dict[str, Any], list[Missing]]: ...


Handler = Callable[[Request], Awaitable[Response]]


def _rfc3339(ts: float) -> str:
    """UTC with milliseconds, as `datetime.isoformat` writes it, at a fifth of its cost
    (a page of 1,000 rows is formatted on the event loop)."""
    ms = math.floor(ts * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}+00:00"


def _with_iso(row: dict[str, object]) -> dict[str, object]:
    """`due`, `received_at` and `expires_at` as RFC 3339, with `due_at` the epoch seconds."""
    out = dict(row)
    for name in ("due", "received_at", "expires_at"):
        value = row.get(name)
        if isinstance(value, (int, float)):
            out[name] = _rfc3339(value)
    out["due_at"] = row["due"]
    return out


# -- each member's answers, for what it holds ----------------------------------------------


def delayed_answers(delayed: OperatedDelayed) -> dict[str, Answer]:
    """The cluster queries a node answers about its own delayed messages."""

    def listing(peer: str, args: Mapping[str, Any]) -> object:
        limit = int(args["limit"])
        after = args.get("after")
        entries = delayed.page(str(after) if after else None, limit)
        return {"items": [_with_iso(delayed.row(e)) for e in entries], "count": delayed.pending,
                "more": len(entries) == limit}

    def one(peer: str, args: Mapping[str, Any]) -> object:
        entry = delayed.get(str(args["id"]))
        return {"item": None if entry is None else _with_iso(delayed.row(entry))}

    def cancel(peer: str, args: Mapping[str, Any]) -> object:
        entry = delayed.cancel(str(args["id"]))
        return {"item": None if entry is None else _with_iso(delayed.row(entry))}

    return {"delayed_list": listing, "delayed_get": one, "delayed_cancel": cancel}


# -- the routes: the cluster's answer ---------------------------------------------------------


def _missing(missing: list[Missing]) -> list[dict[str, str]]:
    return [asdict(m) for m in missing]


def _order(row: Mapping[str, Any]) -> tuple[int, int, str]:
    """Due order across nodes: the id is `<due ms>-<message id>`."""
    due, _, msg = str(row["id"]).partition("-")
    return int(due), int(msg), str(row.get("node", ""))


def _well_formed(row: object) -> bool:
    return isinstance(row, dict) and isinstance(row.get("id"), str) and id_to_key(row["id"]) is not None


def delayed_routes(cluster: ClusterAsk) -> list[tuple[str, str, Handler]]:
    """The routes above, for `mesh.api.build_router`'s `extra_routes` (guarded like the others)."""

    async def listing(request: Request) -> Response:
        q = request.query
        text = q.get("limit", str(DEFAULT_LIMIT))
        if not text.isdigit() or not 1 <= int(text) <= MAX_LIMIT:
            raise HttpError(400, f"limit: expected an integer 1..{MAX_LIMIT}, not {text!r}")
        limit = int(text)
        args: dict[str, object] = {"limit": limit}
        after = q.get("after") or None
        if after is not None:
            if id_to_key(after) is None:
                return error_response(400, f"after: {after!r} is not a delayed message id")
            args["after"] = after
        answers, missing = await cluster.ask_all("delayed_list", args, q.get("node") or None)
        rows: list[dict[str, Any]] = []
        count = 0
        more = False
        for peer, answer in sorted(answers.items()):
            try:
                rows.extend(r for r in answer["items"] if _well_formed(r))
                count += int(answer["count"])
                more = more or bool(answer["more"])
            except (KeyError, TypeError, ValueError):
                missing.append(Missing(peer, "bad answer"))
        rows.sort(key=_order)
        page = rows[:limit]
        more = more or len(rows) > limit
        return json_response({"data": page, "meta": {"count": count, "limit": limit,
                                                     "next": page[-1]["id"] if more and page else None},
                              "missing": _missing(missing)})

    async def found(query: str, ident: str) -> tuple[list[tuple[str, dict[str, Any]]], list[Missing]]:
        answers, missing = await cluster.ask_all(query, {"id": ident})
        hits = [(peer, a["item"]) for peer, a in sorted(answers.items())
                if isinstance(a, dict) and isinstance(a.get("item"), dict)]
        return hits, missing

    async def inspect(request: Request) -> Response:
        ident = request.path_params["id"]
        hits, missing = await found("delayed_get", ident)
        if not hits:
            return json_response({"error": f"{ident}: no such pending delayed message on the members that answered",
                                  "missing": _missing(missing)}, 404)
        return json_response({**hits[0][1], "missing": _missing(missing)})

    async def cancel(request: Request) -> Response:
        ident = request.path_params["id"]
        hits, missing = await found("delayed_cancel", ident)
        if not hits:
            return json_response({"error": f"{ident}: no such pending delayed message on the members that answered",
                                  "missing": _missing(missing)}, 404)
        return json_response({"cancelled": ident, "nodes": [peer for peer, _ in hits], **hits[0][1],
                              "missing": _missing(missing)})

    return [("GET", "/api/v1/delayed", listing), ("GET", "/api/v1/delayed/{id}", inspect),
            ("DELETE", "/api/v1/delayed/{id}", cancel)]


# -- metrics ----------------------------------------------------------------------------------


def _quantiles(values: Iterable[float]) -> dict[str, float]:
    ordered = sorted(values)
    if not ordered:
        return {}
    return {q: round(ordered[min(len(ordered) - 1, int(float(q) * len(ordered)))], 3) for q in ("0.5", "0.99", "1")}


def delayed_metrics(m: Metrics, delayed: OperatedDelayed) -> None:
    stats = delayed.stats
    m.gauge_callback("meshd_delayed_pending", "delayed messages kept for later ($delayed/...)",
                     lambda: delayed.pending)
    m.counter_callback("meshd_delayed_fired_total", "delayed messages published at their time (late ones too)",
                       lambda: stats.fired)
    m.counter_callback("meshd_delayed_late_total",
                       "delayed messages published after a restart, their time having passed while the node was down",
                       lambda: stats.late)
    m.gauge_callback("meshd_delayed_lateness_ms",
                     "how long after its due time a delayed message was published (the last 1000 on time), by quantile",
                     lambda: _quantiles(stats.lateness_ms), ("quantile",))
    m.counter_callback("meshd_delayed_cancelled_total", "delayed messages cancelled (API, meshd ctl)",
                       lambda: stats.cancelled)
    m.counter_callback("meshd_delayed_expired_total", "delayed messages whose message expiry passed before their time",
                       lambda: stats.expired)
    m.counter_callback("meshd_delayed_refused_total", "$delayed/... PUBLISHes refused: bad delay or target topic",
                       lambda: stats.refused)
