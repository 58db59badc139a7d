"""The operator's side of delayed publish (`delayed.service`): the HTTP routes and
the metrics. This node's pending messages (each node keeps those published through it;
`origin` names it):

    GET    /api/v1/delayed          pending messages in due order (?limit=, ?after=ID)
    GET    /api/v1/delayed/{id}     one pending message
    DELETE /api/v1/delayed/{id}     cancel it
"""

from __future__ import annotations

import math
import time
from typing import Awaitable, Callable, Iterable, Protocol

from delayed.records import DelayedEntry
from delayed.service import DelayedStats
from mesh.http_api import HttpError, Request, Response, error_response, json_response
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


def delayed_routes(delayed: OperatedDelayed) -> list[tuple[str, str, Handler]]:
    """The routes above, for `mesh.api.build_router`'s `extra_routes` (guarded like the others)."""
    async def listing(request: Request) -> Response:
        text = request.query.get("limit", str(DEFAULT_LIMIT))
        if not text.isdigit() or not 1 <= int(text) <= MAX_LIMIT:
            raise HttpError(400, f"limit: expected an integer 1..{MAX_LIMIT}, not {text!r}")
        limit = int(text)
        try:
            entries = delayed.page(request.query.get("after") or None, limit)
        except ValueError as exc:
            return error_response(400, str(exc))
        rows = [_with_iso(delayed.row(e)) for e in entries]
        return json_response({"data": rows, "meta": {"count": delayed.pending, "limit": limit,
                                                     "next": entries[-1].id if len(entries) == limit else None},
                              "missing": []})

    async def inspect(request: Request) -> Response:
        entry = delayed.get(request.path_params["id"])
        if entry is None:
            return error_response(404, f"{request.path_params['id']}: no such pending delayed message")
        return json_response(_with_iso(delayed.row(entry)))

    async def cancel(request: Request) -> Response:
        entry = delayed.cancel(request.path_params["id"])
        if entry is None:
            return error_response(404, f"{request.path_params['id']}: no such pending delayed message")
        return json_response({"cancelled": entry.id, **_with_iso(delayed.row(entry))})

    return [("GET", "/api/v1/delayed", listing), ("GET", "/api/v1/delayed/{id}", inspect),
            ("DELETE", "/api/v1/delayed/{id}", cancel)]


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
