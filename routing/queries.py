"""Cluster queries: one question to a member, one answer, on a stream of its own.

An operator's question (which clients, which subscriptions, end this session) is put
to every member by the node that was asked: each member answers for what it holds.
A query travels on a short-lived stream to the member's gossip port, not on the mesh
link that carries forwarded publishes, for two reasons:

- an older node does not know the query: on a stream of its own, the node's gossip
  service counts one unknown stream frame (`unknown_stream_type`) and closes the
  stream, which the asker reads as "does not answer queries"; on the mesh link the
  older node would drop the whole link (an unknown link request is malformed there),
  and with it forwards and handoff requests in flight;
- a question never waits behind a long queue of forwarded batches.

Frames (sealed with the cluster key, like the links'):

    -> mesh_query  {c: cluster name, q: query name, a: {arguments}}
    <- query_reply {r: result}  or  {e: "why not"}

A member that does not know the query name answers `e`, so a newer asker can tell an
older-but-querying member from a broken one.
"""

from __future__ import annotations

import logging
from typing import Any, Awaitable, Callable, Mapping, Protocol

import trio

from gossip import wire
from routing.links import FramedStream, LinkGossip

log = logging.getLogger("meshd.queries")

QUERY = "mesh_query"
REPLY = "query_reply"
QUERY_TIMEOUT = 3.0  # per member; members are asked at once, so a whole query waits at most this


class QueryGossip(LinkGossip, Protocol):
    def register_stream_handler(self, frame_type: str,
                                handler: Callable[[trio.abc.Stream, wire.Envelope], Awaitable[None]]) -> None: ...


class QueryFailed(Exception):
    """A member did not answer; `str()` says why, in a few words."""


class QueryUnanswered(QueryFailed):
    """The member closed the query's stream without an answer. Either it is a version
    without cluster queries (which closes every query so), or it died while answering
    (a killed process's socket is closed by its kernel: the asker reads an orderly end,
    not an error). An asker that must tell the two apart asks once more: the older
    version closes the query again, a dead member refuses the connection."""


class UnknownQuery(Exception):
    """Raised by an answerer for a query name it does not know."""


# (asking member, query name, arguments) -> the result (anything CBOR encodes)
Answerer = Callable[[str, str, Mapping[str, Any]], object]
# (asking member, arguments) -> the result: one query name whose answer must await (a read off the Trio thread)
AsyncAnswerer = Callable[[str, Mapping[str, Any]], Awaitable[object]]


class MeshQueries:
    """Asks members (`ask`) and answers them (through the `Answerer` given to `serve`)."""

    def __init__(self, *, node_id: str, cluster_name: str, gossip: QueryGossip) -> None:
        self.node_id = node_id
        self.cluster_name = cluster_name
        self.gossip = gossip
        self._answerer: Answerer | None = None
        self._handlers: dict[str, AsyncAnswerer] = {}
        self.answered = 0
        self.refused = 0
        gossip.register_stream_handler(QUERY, self._serve)

    def serve(self, answerer: Answerer) -> None:
        """Answer queries from peers with `answerer` (one per node)."""
        self._answerer = answerer

    def handle(self, query: str, handler: AsyncAnswerer) -> None:
        """Answer one query name with an async handler (before `serve`'s answerer)."""
        self._handlers[query] = handler

    async def ask(self, peer: str, query: str, args: Mapping[str, object], timeout: float = QUERY_TIMEOUT) -> object:
        """Ask one member; its result, or QueryFailed saying why there is none."""
        with trio.move_on_after(timeout) as scope:
            try:
                stream = await self.gossip.open_member_stream(peer)
            except OSError as exc:
                raise QueryFailed(f"unreachable ({exc.strerror or exc})") from None
            if stream is None:
                raise QueryFailed("address unknown")
            async with stream:
                framed = FramedStream(stream, self.gossip, self.node_id)
                try:
                    await framed.send(QUERY, c=self.cluster_name, q=query, a=dict(args))
                    reply = await framed.receive()
                except EOFError:
                    raise QueryUnanswered("closed the query unanswered (a version without cluster queries?)") from None
                except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    raise QueryFailed(f"connection lost ({exc})") from None
                except wire.WireError as exc:
                    raise QueryFailed(f"bad answer ({exc})") from None
        if scope.cancelled_caught:
            raise QueryFailed(f"no answer within {timeout:g} s")
        if reply.get("t") != REPLY:
            raise QueryFailed(f"answered {reply.get('t')!r}, not {REPLY}")
        if "e" in reply:
            raise QueryFailed(str(reply["e"]))
        return reply.get("r")

    async def _serve(self, stream: trio.abc.Stream, request: wire.Envelope) -> None:
        peer = request["from"]
        framed = FramedStream(stream, self.gossip, self.node_id)
        if request.get("c") != self.cluster_name:
            log.warning("refused a query from %s of cluster %r", peer, request.get("c"))
            return
        query, args = request.get("q"), request.get("a")
        answer: dict[str, object]
        if not isinstance(query, str) or not isinstance(args, dict):
            self.refused += 1
            answer = {"e": "malformed query"}
        elif query in self._handlers:
            try:
                answer = {"r": await self._handlers[query](peer, args)}
                self.answered += 1
            except (KeyError, TypeError, ValueError) as exc:
                self.refused += 1
                answer = {"e": f"bad arguments for {query!r}: {exc}"}
        elif self._answerer is None:
            self.refused += 1
            answer = {"e": "this node answers no queries"}
        else:
            try:
                answer = {"r": self._answerer(peer, query, args)}
                self.answered += 1
            except UnknownQuery:
                self.refused += 1
                answer = {"e": f"unknown query {query!r}"}
            except (KeyError, TypeError, ValueError) as exc:
                self.refused += 1
                answer = {"e": f"bad arguments for {query!r}: {exc}"}
        try:
            with trio.move_on_after(QUERY_TIMEOUT):
                await framed.send(REPLY, **answer)
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            log.debug("query from %s: the answer could not be sent: %s", peer, exc)
