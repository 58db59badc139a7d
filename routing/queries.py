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

**Channels.**  A question asked over and over (session replication sends a batch of
changes to each replica many times a second) can go on one stream kept open instead:
the asker opens a channel, sends questions one after another without waiting, and the
member answers them in order, each once its answer may leave (a `PipelinedAnswerer`
says when: a replica answers once what it applied is on its disk, so one disk sync
answers every question applied before it: group commit).  Frames:

    -> mesh_qchan  {c: cluster name, q: query name}       opens the channel
    -> qchan_req   {a: {arguments}}                        one question, any number
    <- query_reply {r: result}  or  {e: "why not"}          in the questions' order

An older node does not know `mesh_qchan`; the asker opens a channel only to a member
that said it serves one (replication: in its answer to a plain `repl` query), so no
older node is ever sent one.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Awaitable, Callable, Mapping, Protocol

import trio

from gossip import wire
from routing.links import FramedStream, LinkGossip

log = logging.getLogger("meshd.queries")

QUERY = "mesh_query"
REPLY = "query_reply"
CHANNEL = "mesh_qchan"
CHANNEL_REQUEST = "qchan_req"
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


class QueryRefused(Exception):
    """Raised by a handler that cannot do what it is asked now: the asker's
    `QueryFailed` says `str()` of it."""


# (asking member, query name, arguments) -> the result (anything CBOR encodes)
Answerer = Callable[[str, str, Mapping[str, Any]], object]
# (asking member, arguments) -> the result: one query name whose answer must await (a read off the Trio thread)
AsyncAnswerer = Callable[[str, Mapping[str, Any]], Awaitable[object]]
# (asking member, arguments) -> (the result, an event set once it may leave, or None: at
# once): a channel's questions, answered in order, called as each one arrives
PipelinedAnswerer = Callable[[str, Mapping[str, Any]], tuple[object, trio.Event | None]]


class QueryChannel:
    """The asker's end of a channel: `send` questions, `reply` takes their answers in
    the same order (QueryFailed when the channel broke or the member refused one)."""

    def __init__(self, peer: str, stream: trio.abc.Stream, framed: FramedStream) -> None:
        self.peer = peer
        self._stream = stream
        self._framed = framed

    async def send(self, args: Mapping[str, object]) -> None:
        try:
            await self._framed.send(CHANNEL_REQUEST, a=dict(args))
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise QueryFailed(f"connection lost ({exc})") from None

    async def reply(self) -> object:
        try:
            reply = await self._framed.receive()
        except EOFError:
            raise QueryFailed("closed the channel") from None
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise QueryFailed(f"connection lost ({exc})") from None
        except wire.WireError as exc:
            raise QueryFailed(f"bad answer ({exc})") from None
        if reply.get("t") != REPLY:
            raise QueryFailed(f"answered {reply.get('t')!r}, not {REPLY}")
        if "e" in reply:
            raise QueryFailed(str(reply["e"]))
        return reply.get("r")

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            await self._stream.aclose()


class _Answering:
    """One answer being made: `result` records what the handler returned; leaving the
    block on an exception that refuses a question (the handler's QueryRefused, an
    unknown query, arguments it could not use) records the refusal instead.  The one
    place where a question's outcome becomes its reply and is counted."""

    def __init__(self, queries: MeshQueries, query: object) -> None:
        self._queries = queries
        self._query = query
        self.reply: dict[str, object] = {"e": "no answer"}

    def result(self, value: object) -> None:
        self._queries.answered += 1
        self.reply = {"r": value}

    def refuse(self, why: str) -> None:
        self._queries.refused += 1
        self.reply = {"e": why}

    def __enter__(self) -> _Answering:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> bool:
        if isinstance(exc, QueryRefused):
            self.refuse(str(exc))
        elif isinstance(exc, UnknownQuery):
            self.refuse(f"unknown query {self._query!r}")
        elif isinstance(exc, (KeyError, TypeError, ValueError)):
            self.refuse(f"bad arguments for {self._query!r}: {exc}")
        else:
            return False
        return True


class MeshQueries:
    """Asks members (`ask`) and answers them (through the `Answerer` given to `serve`)."""

    def __init__(self, *, node_id: str, cluster_name: str, gossip: QueryGossip) -> None:
        self.node_id = node_id
        self.cluster_name = cluster_name
        self.gossip = gossip
        self._answerer: Answerer | None = None
        self._handlers: dict[str, AsyncAnswerer] = {}
        self._pipelined: dict[str, PipelinedAnswerer] = {}
        self.answered = 0
        self.refused = 0
        gossip.register_stream_handler(QUERY, self._serve)
        gossip.register_stream_handler(CHANNEL, self._serve_channel)

    def serve(self, answerer: Answerer) -> None:
        """Answer queries from peers with `answerer` (one per node)."""
        self._answerer = answerer

    def handle(self, query: str, handler: AsyncAnswerer) -> None:
        """Answer one query name with an async handler (before `serve`'s answerer)."""
        self._handlers[query] = handler

    def handle_pipelined(self, query: str, handler: PipelinedAnswerer) -> None:
        """Answer one query name's channels (`open_channel`) with `handler`."""
        self._pipelined[query] = handler

    async def open_channel(self, peer: str, query: str, timeout: float = QUERY_TIMEOUT) -> QueryChannel:
        """A channel to `peer` for `query`: only to a member known to serve it (an
        older node closes the stream, which the first `reply` reports)."""
        with trio.move_on_after(timeout):
            try:
                stream = await self.gossip.open_member_stream(peer)
            except OSError as exc:
                raise QueryFailed(f"unreachable ({exc.strerror or exc})") from None
            if stream is None:
                raise QueryFailed("address unknown")
            framed = FramedStream(stream, self.gossip, self.node_id)
            try:
                await framed.send(CHANNEL, c=self.cluster_name, q=query)
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                await stream.aclose()
                raise QueryFailed(f"connection lost ({exc})") from None
            return QueryChannel(peer, stream, framed)
        raise QueryFailed(f"no connection within {timeout:g} s")

    async def _serve_channel(self, stream: trio.abc.Stream, opening: wire.Envelope) -> None:
        peer = opening["from"]
        framed = FramedStream(stream, self.gossip, self.node_id)
        if opening.get("c") != self.cluster_name:
            log.warning("refused a query channel from %s of cluster %r", peer, opening.get("c"))
            return
        query = opening.get("q")
        handler = self._pipelined.get(query) if isinstance(query, str) else None
        if handler is None:
            self.refused += 1
            with trio.move_on_after(QUERY_TIMEOUT):
                await framed.send(REPLY, e=f"no channel for query {query!r}")
            return
        # Unbounded: the asker bounds how many questions it has unanswered.
        answers_in, answers_out = trio.open_memory_channel[tuple[dict[str, object], trio.Event | None]](math.inf)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._send_answers, framed, answers_out, peer)
            try:
                while True:
                    request = await framed.receive()
                    args = request.get("a")
                    ready: trio.Event | None = None
                    with _Answering(self, query) as answer:
                        if request.get("t") != CHANNEL_REQUEST or not isinstance(args, dict):
                            answer.refuse("malformed question")
                        else:
                            result, ready = handler(peer, args)
                            answer.result(result)
                    answers_in.send_nowait((answer.reply, ready))
            except (EOFError, OSError, trio.BrokenResourceError, trio.ClosedResourceError, wire.WireError) as exc:
                log.debug("query channel from %s closed: %s", peer, exc or type(exc).__name__)
            nursery.cancel_scope.cancel()  # the asker is gone: its answers with it

    async def _send_answers(self, framed: FramedStream,
                            answers: trio.MemoryReceiveChannel[tuple[dict[str, object], trio.Event | None]],
                            peer: str) -> None:
        try:
            async for answer, ready in answers:
                if ready is not None:
                    await ready.wait()
                await framed.send(REPLY, **answer)
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            log.debug("query channel to %s: an answer could not be sent: %s", peer, exc)

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
        with _Answering(self, query) as answer:
            if not isinstance(query, str) or not isinstance(args, dict):
                answer.refuse("malformed query")
            elif query in self._handlers:
                answer.result(await self._handlers[query](peer, args))
            elif self._answerer is None:
                answer.refuse("this node answers no queries")
            else:
                answer.result(self._answerer(peer, query, args))
        try:
            with trio.move_on_after(QUERY_TIMEOUT):
                await framed.send(REPLY, **answer.reply)
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            log.debug("query from %s: the answer could not be sent: %s", peer, exc)
