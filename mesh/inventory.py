"""Clients, sessions and subscriptions, cluster-wide: what `GET /api/v1/clients`,
`/api/v1/clients/<id>`, `DELETE /api/v1/sessions/<id>` and `/api/v1/subscriptions`
answer (and `meshd ctl clients|sessions|subscriptions` print).

Each node answers for the sessions it holds (`answer`, the local side). The node that
was asked puts the same question to every other member at once through
`routing.queries` and merges the answers; a member that does not answer (dead,
unreachable, too slow, or of a version without cluster queries) is named in `missing`
with the reason, and the answer is about the others.

Lists are sorted (clients by client id, subscriptions by filter, then client id) and
paged with a cursor: each member returns at most `limit` rows after the cursor, the
asker merges them and keeps the first `limit`; `next` is the cursor of the page after
(None on the last page). A session that exists on two nodes for a moment (a handoff
in flight) is shown once: the connected copy, else the one disconnected last.

The JSON field names are a contract (README, "HTTP API"); they follow EMQX's
/api/v5/clients where the meaning is the same.
"""

from __future__ import annotations

import base64
import bisect
import datetime
import json
import logging
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence, TypeVar

import trio

from clock import Clock
from gossip.events import MemberState
from mesh.client_port import ClientPort
from mqtt import ReasonCode
from mqtt.topics import parse_shared_subscription, topic_matches
from routing.queries import MeshQueries, QueryFailed, UnknownQuery
from session_store.model import Session, SubscriptionOptions

log = logging.getLogger("meshd.inventory")

# One more question a member answers for what it holds: (asking member, arguments) -> result.
Answer = Callable[[str, Mapping[str, Any]], object]

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
DETAIL_ROWS = 100  # inflight and queued messages listed in a client's detail (counts are whole)

# The listener a connection came through, by the connection's transport name: the
# names of the settings that open them (and of /api/v1/status's listeners).
_LISTENER = {"tcp": "mqtt", "mqtts": "mqtts", "ws": "ws", "wss": "wss"}


T = TypeVar("T")

# A row's sort key: (client id,) for clients, (filter, client id) for subscriptions.
RowKey = Callable[[dict[str, Any]], tuple[str, ...]]


class InventoryBroker(Protocol):
    @property
    def sessions(self) -> Mapping[str, Session]: ...

    @property
    def connections(self) -> Mapping[str, ClientPort]: ...

    def end_session_now(self, client_id: str, now: float) -> bool: ...


class Members(Protocol):
    def members(self) -> Sequence[Mapping[str, object]]: ...


class BadQuery(ValueError):
    """A query's arguments are wrong (the API answers 400 with the message)."""


@dataclass(frozen=True, slots=True)
class Missing:
    """A member whose answer is not in the result, and why."""

    node: str
    reason: str


@dataclass(frozen=True, slots=True)
class ClientFilter:
    clientid_prefix: str | None = None
    username: str | None = None
    connected: bool | None = None

    def admits(self, session: Session, username: str | None, connected: bool) -> bool:
        return ((self.clientid_prefix is None or session.client_id.startswith(self.clientid_prefix))
                and (self.username is None or username == self.username)
                and (self.connected is None or connected == self.connected))


@dataclass(frozen=True, slots=True)
class Page:
    """Rows of one page, the whole count, the cursor of the next page, who is missing."""

    rows: list[dict[str, Any]]
    count: int
    next: str | None
    missing: list[Missing]

    def as_json(self, limit: int) -> dict[str, object]:
        return {"data": self.rows, "meta": {"count": self.count, "limit": limit, "next": self.next},
                "missing": [asdict(m) for m in self.missing]}


# -- cursors -------------------------------------------------------------------


def encode_cursor(key: Sequence[str]) -> str:
    """An opaque cursor for a row's sort key (URL-safe)."""
    return base64.urlsafe_b64encode(json.dumps(list(key)).encode("utf-8")).decode("ascii").rstrip("=")


def decode_cursor(cursor: str, size: int) -> list[str]:
    try:
        key = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (ValueError, UnicodeDecodeError):
        raise BadQuery(f"bad cursor {cursor!r} (pass meta.next of the page before)") from None
    if not isinstance(key, list) or len(key) != size or not all(isinstance(k, str) for k in key):
        raise BadQuery(f"bad cursor {cursor!r} (pass meta.next of the page before)")
    return key


def _iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.datetime.fromtimestamp(ts, tz=datetime.timezone.utc).isoformat(timespec="milliseconds")


# -- the local side: rows for the sessions this node holds -----------------------


def client_row(node_id: str, session: Session, conn: ClientPort | None) -> dict[str, Any]:
    """One client (connected, or a session kept for it) as `GET /api/v1/clients` lists it."""
    host: str | None = None
    port: int | None = None
    if conn is not None:
        h, _, p = conn.peer.rpartition(":")
        host, port = (h, int(p)) if p.isdigit() else (conn.peer, None)
    return {
        "clientid": session.client_id,
        "username": conn.username if conn is not None else None,
        "node": node_id,
        "connected": conn is not None,
        "ip_address": host,
        "port": port,
        "listener": _LISTENER.get(conn.transport, conn.transport) if conn is not None else None,
        "proto_ver": session.protocol_level,
        "clean_start": session.clean_start,
        "expiry_interval": session.expiry_interval,
        "keepalive": conn.keep_alive if conn is not None else None,
        "connected_at": _iso(session.connected_at) if conn is not None else None,
        "disconnected_at": _iso(session.disconnected_at) if conn is None else None,
        "subscriptions_cnt": session.subscription_count,
        "inflight_cnt": session.inflight_count,
        "mqueue_len": session.queued,
        "mqueue_dropped": session.dropped,
    }


def client_detail(node_id: str, session: Session, conn: ClientPort | None) -> dict[str, Any]:
    """`GET /api/v1/clients/<id>`: the row, its subscriptions with their options, and
    the first inflight and queued messages (topic and QoS; never payloads)."""
    row = client_row(node_id, session, conn)
    row["subscriptions"] = [_subscription_fields(f, o) for f, o in sorted(session.subscriptions.items())]
    row["inflight"] = [
        {"packet_id": pid, "topic": e.delivery.message.topic, "qos": e.delivery.qos, "state": e.state}
        for pid, e in list(session.inflight.items())[:DETAIL_ROWS]
    ]
    queue = session.queue if session.queued else ()
    row["mqueue"] = [{"topic": d.message.topic, "qos": d.qos} for _, d in zip(range(DETAIL_ROWS), queue)]
    return row


def _subscription_fields(topic_filter: str, options: SubscriptionOptions) -> dict[str, Any]:
    return {"topic": topic_filter, "qos": options.qos, "nl": int(options.no_local),
            "rap": int(options.retain_as_published), "rh": options.retain_handling, "subid": options.subscription_id}


def subscription_matches(query: str | None, topic_filter: str) -> bool:
    """`topic` in `GET /api/v1/subscriptions`: a topic name finds the subscriptions
    whose filter matches it (who would get a message published there); a filter (with
    `+` or `#`, or a `$share/...` one) finds the subscriptions with exactly that filter."""
    if query is None:
        return True
    if "+" in query or "#" in query or query.startswith("$share/"):
        return topic_filter == query
    group, real = parse_shared_subscription(topic_filter)
    return topic_matches(real if group is not None else topic_filter, query)


def _page_of(rows: Iterable[tuple[tuple[str, ...], T]], after: Sequence[str] | None, limit: int,
             render: Callable[[T], dict[str, Any]]) -> dict[str, Any]:
    """A member's answer to a list query: the first `limit` rows after the cursor (only
    those are rendered: a node with 100,000 sessions builds one page), how many rows
    match in all, and whether more follow."""
    matched = sorted(rows, key=lambda kr: kr[0])
    start = bisect.bisect_right([k for k, _ in matched], tuple(after)) if after is not None else 0
    page = matched[start:start + limit]
    return {"items": [render(item) for _, item in page], "count": len(matched),
            "more": start + limit < len(matched)}


class Inventory:
    """The local answers, and the cluster-wide questions built on them."""

    def __init__(self, *, node_id: str, broker: InventoryBroker, gossip: Members, queries: MeshQueries,
                 clock: Clock, extra_answers: Mapping[str, Answer] | None = None,
                 session_extra: Callable[[str], dict[str, Any] | None] | None = None) -> None:
        self.node_id = node_id
        # More fields of one session's detail, from the node that holds it (its replication).
        self.session_extra = session_extra
        # More questions this node answers for what it holds (delayed messages), by name.
        self.extra_answers = dict(extra_answers or {})
        self.broker = broker
        self.gossip = gossip
        self.queries = queries
        self.clock = clock
        queries.serve(self.answer)

    # ---------------------------------------------------------------- local

    def answer(self, peer: str, query: str, args: Mapping[str, Any]) -> object:
        """This node's answer to a query (from a peer, or from itself)."""
        if query == "clients":
            flt = ClientFilter(_opt_str(args, "clientid_prefix"), _opt_str(args, "username"),
                               _opt_bool(args, "connected"))
            return self._clients(flt, _opt_key(args), _limit(args))
        if query == "client":
            return {"item": self._client(str(args["clientid"]))}
        if query == "subscriptions":
            return self._subscriptions(_opt_str(args, "topic"), _opt_str(args, "clientid"), _opt_key(args),
                                       _limit(args))
        if query == "kick":
            conn = self.broker.connections.get(str(args["clientid"]))
            if conn is not None:
                conn.close(ReasonCode.ADMINISTRATIVE_ACTION)
            return {"kicked": conn is not None}
        if query == "discard":
            client_id = str(args["clientid"])
            deleted = self.broker.end_session_now(client_id, self.clock.wall())
            if deleted:
                log.info("session %s discarded (asked by %s)", client_id, peer)
            return {"deleted": deleted}
        extra = self.extra_answers.get(query)
        if extra is not None:
            return extra(peer, args)
        raise UnknownQuery(query)

    def _clients(self, flt: ClientFilter, after: Sequence[str] | None, limit: int) -> dict[str, Any]:
        connections = self.broker.connections
        rows = []
        for client_id, session in self.broker.sessions.items():
            conn = connections.get(client_id)
            if flt.admits(session, conn.username if conn is not None else None, conn is not None):
                rows.append(((client_id,), (session, conn)))
        return _page_of(rows, after, limit, lambda item: client_row(self.node_id, *item))

    def _client(self, client_id: str) -> dict[str, Any] | None:
        session = self.broker.sessions.get(client_id)
        if session is None:
            return None
        detail = client_detail(self.node_id, session, self.broker.connections.get(client_id))
        extra = self.session_extra(client_id) if self.session_extra is not None else None
        if extra:
            detail["replication"] = extra
        return detail

    def _subscriptions(self, topic: str | None, client_id: str | None, after: Sequence[str] | None,
                       limit: int) -> dict[str, Any]:
        rows = []
        sessions = self.broker.sessions
        chosen: Iterable[Session] = sessions.values()
        if client_id is not None:
            one = sessions.get(client_id)
            chosen = [one] if one is not None else []
        for session in chosen:
            for topic_filter, options in session.subscriptions.items():
                if subscription_matches(topic, topic_filter):
                    rows.append(((topic_filter, session.client_id), (session.client_id, topic_filter, options)))
        return _page_of(rows, after, limit, self._subscription_row)

    def _subscription_row(self, item: tuple[str, str, SubscriptionOptions]) -> dict[str, Any]:
        client_id, topic_filter, options = item
        return {"clientid": client_id, "node": self.node_id, **_subscription_fields(topic_filter, options)}

    # ---------------------------------------------------------------- cluster-wide

    async def ask_all(self, query: str, args: Mapping[str, Any],
                      node: str | None = None) -> tuple[dict[str, Any], list[Missing]]:
        """Every member's answer (this node's too), by node, and the members that gave none.
        `node` asks that member only."""
        answers: dict[str, Any] = {}
        missing: list[Missing] = []
        peers: list[str] = []
        members = {str(m["id"]): str(m["state"]) for m in self.gossip.members()}
        members[self.node_id] = MemberState.ALIVE
        for member, state in sorted(members.items()):
            if node is not None and member != node:
                continue
            if member == self.node_id:
                answers[member] = self.answer(self.node_id, query, args)
            elif state == MemberState.LEFT:
                continue  # not a member any more: nothing of it is missing
            elif state == MemberState.DEAD:
                missing.append(Missing(member, "dead"))
            else:
                peers.append(member)
        if node is not None and node not in members:
            missing.append(Missing(node, "not a member"))

        async def ask(peer: str) -> None:
            try:
                answers[peer] = await self.queries.ask(peer, query, args)
            except QueryFailed as exc:
                missing.append(Missing(peer, str(exc)))

        async with trio.open_nursery() as nursery:
            for peer in peers:
                nursery.start_soon(ask, peer)
        missing.sort(key=lambda m: m.node)
        return answers, missing

    async def clients(self, flt: ClientFilter, *, node: str | None = None, after: str | None = None,
                      limit: int = DEFAULT_LIMIT) -> Page:
        args: dict[str, object] = {"limit": limit, **{k: v for k, v in asdict(flt).items() if v is not None}}
        if after is not None:
            args["after"] = decode_cursor(after, 1)
        answers, missing = await self.ask_all("clients", args, node)
        return self._merge(answers, missing, limit, lambda r: (r["clientid"],), _dedupe_clients)

    async def client(self, client_id: str) -> tuple[dict[str, Any] | None, list[Missing]]:
        answers, missing = await self.ask_all("client", {"clientid": client_id})
        found = []
        for peer, answer in answers.items():
            item = answer.get("item") if isinstance(answer, dict) else None
            if isinstance(item, dict) and item.get("clientid") == client_id:
                found.append(item)
            elif item is not None:
                missing.append(Missing(peer, "bad answer"))
        best = _dedupe_clients(found)
        return (best[0] if best else None), missing

    async def discard(self, client_id: str) -> tuple[list[str], list[Missing]]:
        """End the session wherever it is; the nodes that had it, and who did not answer."""
        answers, missing = await self.ask_all("discard", {"clientid": client_id})
        deleted = sorted(peer for peer, a in answers.items() if isinstance(a, dict) and a.get("deleted"))
        return deleted, missing

    async def kick(self, client_id: str) -> tuple[list[str], list[Missing]]:
        """Disconnect the client wherever it is connected (v5: 0x98); its session stays.
        The nodes it was connected to, and who did not answer."""
        answers, missing = await self.ask_all("kick", {"clientid": client_id})
        kicked = sorted(peer for peer, a in answers.items() if isinstance(a, dict) and a.get("kicked"))
        return kicked, missing

    async def subscriptions(self, *, topic: str | None = None, client_id: str | None = None, node: str | None = None,
                            after: str | None = None, limit: int = DEFAULT_LIMIT) -> Page:
        args: dict[str, object] = {"limit": limit}
        if topic is not None:
            args["topic"] = topic
        if client_id is not None:
            args["clientid"] = client_id
        if after is not None:
            args["after"] = decode_cursor(after, 2)
        answers, missing = await self.ask_all("subscriptions", args, node)
        return self._merge(answers, missing, limit, lambda r: (r["topic"], r["clientid"]), lambda rows: rows)

    @staticmethod
    def _merge(answers: Mapping[str, Any], missing: list[Missing], limit: int, key: RowKey,
               dedupe: Callable[[list[dict[str, Any]]], list[dict[str, Any]]]) -> Page:
        """One page from the members' pages: their rows merged in order, the first
        `limit` kept; a member whose answer is not a page is missing."""
        rows: list[dict[str, Any]] = []
        count = 0
        more = False
        for peer, answer in sorted(answers.items()):
            try:
                items = answer["items"]
                count += int(answer["count"])
                more = more or bool(answer["more"])
                rows.extend(r for r in items if isinstance(r, dict) and _has_key(r, key))
            except (KeyError, TypeError, ValueError):
                missing.append(Missing(peer, "bad answer"))
        merged = sorted(dedupe(rows), key=key)
        page = merged[:limit]
        more = more or len(merged) > limit
        return Page(page, count, encode_cursor(key(page[-1])) if more and page else None, missing)


def _has_key(row: dict[str, Any], key: RowKey) -> bool:
    try:
        return all(isinstance(k, str) for k in key(row))
    except KeyError:
        return False


def _dedupe_clients(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per client id: the connected copy, else the one disconnected last."""
    best: dict[str, dict[str, Any]] = {}
    for row in rows:
        current = best.get(row["clientid"])
        if current is None or _recency(row) > _recency(current):
            best[row["clientid"]] = row
    return list(best.values())


def _recency(row: Mapping[str, Any]) -> tuple[bool, str]:
    return bool(row.get("connected")), str(row.get("connected_at") or row.get("disconnected_at") or "")


# -- arguments, as they arrive from a peer ----------------------------------------


def _opt_str(args: Mapping[str, Any], name: str) -> str | None:
    value = args.get(name)
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{name} must be text")
    return value


def _opt_bool(args: Mapping[str, Any], name: str) -> bool | None:
    value = args.get(name)
    if value is not None and not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false")
    return value


def _opt_key(args: Mapping[str, Any]) -> list[str] | None:
    value = args.get("after")
    if value is not None and (not isinstance(value, list) or not all(isinstance(v, str) for v in value)):
        raise ValueError("after must be a list of text")
    return value


def _limit(args: Mapping[str, Any]) -> int:
    value = args.get("limit", DEFAULT_LIMIT)
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_LIMIT:
        raise ValueError(f"limit must be 1..{MAX_LIMIT}")
    return value
