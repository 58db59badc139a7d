"""Cluster queries over a stream pair: answers, errors that come back as reasons, an
older node that closes the stream, a member of another cluster, a member too slow."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from gossip import wire
from gossip.service import read_frame
from routing.queries import CHANNEL, QUERY, QUERY_TIMEOUT, MeshQueries, QueryFailed, UnknownQuery


class PairedGossip:
    """Two nodes' gossip in one: a stream to a member is one end of a memory stream pair,
    whose other end goes to the handler registered for its first frame (as the gossip
    service does), or is closed unanswered when none is (as an older node does)."""

    def __init__(self, nursery: trio.Nursery, peer: "PairedGossip | None" = None) -> None:
        self.nursery = nursery
        self.handlers: dict[str, object] = {}
        self.peer = peer if peer is not None else self  # whose handlers serve our streams
        self.silent = False  # the member reads the question and never answers

    def register_stream_handler(self, frame_type, handler) -> None:
        self.handlers[frame_type] = handler

    def seal_frame(self, body: bytes) -> bytes:
        return wire.frame(body)

    def open_frame(self, body: bytes) -> bytes:
        return body

    async def open_member_stream(self, member_id: str):
        if member_id == "nobody":
            raise OSError(111, "Connection refused")
        ours, theirs = trio.testing.memory_stream_pair()

        async def serve() -> None:
            envelope = wire.decode_frame_body(await read_frame(theirs))
            handler = self.peer.handlers.get(envelope["t"])
            if self.silent:
                await trio.sleep_forever()
            if handler is None:
                await theirs.aclose()
                return
            async with theirs:
                await handler(theirs, envelope)

        self.nursery.start_soon(serve)
        return ours


async def asked(answerer=None, *, register: bool = True, cluster: str = "meshd", query: str = "clients",
                silent: bool = False) -> object:
    """Node a asks node b; b's answer, or the QueryFailed a got."""
    result: object = None
    async with trio.open_nursery() as nursery:
        b_gossip = PairedGossip(nursery)
        server = MeshQueries(node_id="b", cluster_name="meshd", gossip=b_gossip)
        if answerer is not None:
            server.serve(answerer)
        if not register:
            del b_gossip.handlers[QUERY]
        a_gossip = PairedGossip(nursery, peer=b_gossip)
        a_gossip.silent = silent
        client = MeshQueries(node_id="a", cluster_name=cluster, gossip=a_gossip)
        try:
            result = await client.ask("b", query, {"limit": 2})
        except QueryFailed as exc:
            result = exc
        nursery.cancel_scope.cancel()
    if isinstance(result, QueryFailed):
        raise result
    return result


async def test_a_question_gets_the_answer() -> None:
    seen = []

    def answer(peer, query, args):
        seen.append((peer, query, args))
        return {"items": [], "count": 0}

    assert await asked(answer) == {"items": [], "count": 0}
    assert seen == [("a", "clients", {"limit": 2})]


@pytest.mark.parametrize("answerer, reason", [
    (lambda peer, query, args: (_ for _ in ()).throw(UnknownQuery(query)), "unknown query 'clients'"),
    (lambda peer, query, args: args["missing"], "bad arguments for 'clients'"),
    (None, "this node answers no queries"),
])
async def test_refusals_come_back_as_reasons(answerer, reason) -> None:
    with pytest.raises(QueryFailed, match=reason):
        await asked(answerer)


async def test_an_older_node_closes_the_stream_and_is_named_as_such() -> None:
    with pytest.raises(QueryFailed, match="closed the query unanswered"):
        await asked(lambda *a: 1, register=False)


async def test_a_member_of_another_cluster_gets_no_answer() -> None:
    with pytest.raises(QueryFailed, match="closed the query unanswered"):
        await asked(lambda *a: 1, cluster="other")


async def test_an_unreachable_member() -> None:
    async with trio.open_nursery() as nursery:
        queries = MeshQueries(node_id="a", cluster_name="meshd", gossip=PairedGossip(nursery))
        with pytest.raises(QueryFailed, match="unreachable"):
            await queries.ask("nobody", "clients", {})
        nursery.cancel_scope.cancel()


@pytest.fixture
def mock_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)  # pytest-trio runs the test on it


async def test_a_silent_member_is_given_up_on_at_the_timeout(mock_clock) -> None:
    start = trio.current_time()
    with pytest.raises(QueryFailed, match=f"no answer within {QUERY_TIMEOUT:g} s"):
        await asked(lambda *a: 1, silent=True)
    assert trio.current_time() - start == pytest.approx(QUERY_TIMEOUT)


async def test_a_channel_takes_questions_without_waiting_and_answers_in_order() -> None:
    """Three questions sent at once; the first one's answer may leave only after the
    second's (its event is set later): the answers still come in the questions'
    order, each once its event is set, and the questions were answered as they came."""
    applied: list[int] = []
    events: dict[int, trio.Event] = {}

    def answer(peer, args):
        applied.append(args["n"])
        events[args["n"]] = trio.Event()
        return {"n": args["n"], "from": peer}, events[args["n"]]

    async with trio.open_nursery() as nursery:
        b_gossip = PairedGossip(nursery)
        server = MeshQueries(node_id="b", cluster_name="meshd", gossip=b_gossip)
        server.handle_pipelined("repl", answer)
        client = MeshQueries(node_id="a", cluster_name="meshd", gossip=PairedGossip(nursery, peer=b_gossip))
        channel = await client.open_channel("b", "repl")
        for n in (1, 2, 3):
            await channel.send({"n": n})
        await trio.testing.wait_all_tasks_blocked()
        assert applied == [1, 2, 3]  # applied as they came, none answered yet
        replies: list[object] = []

        async def read() -> None:
            for _ in range(3):
                replies.append(await channel.reply())

        nursery.start_soon(read)
        events[2].set()
        await trio.testing.wait_all_tasks_blocked()
        assert replies == []  # the second is ready, but the first goes first
        events[1].set()
        await trio.testing.wait_all_tasks_blocked()
        assert replies == [{"n": 1, "from": "a"}, {"n": 2, "from": "a"}]
        events[3].set()
        await trio.testing.wait_all_tasks_blocked()
        assert replies[2] == {"n": 3, "from": "a"}
        await channel.aclose()
        nursery.cancel_scope.cancel()


async def test_a_channel_to_a_member_without_one_fails_at_its_first_answer() -> None:
    async with trio.open_nursery() as nursery:
        b_gossip = PairedGossip(nursery)
        MeshQueries(node_id="b", cluster_name="meshd", gossip=b_gossip)  # serves no channel for "repl"
        client = MeshQueries(node_id="a", cluster_name="meshd", gossip=PairedGossip(nursery, peer=b_gossip))
        channel = await client.open_channel("b", "repl")
        await channel.send({"n": 1})
        with pytest.raises(QueryFailed, match="no channel for query 'repl'"):
            await channel.reply()
        # An older node does not know channels at all: it closes the stream.
        del b_gossip.handlers[CHANNEL]
        channel = await client.open_channel("b", "repl")
        with pytest.raises(QueryFailed, match="closed the channel"):
            await channel.reply()
        nursery.cancel_scope.cancel()


async def test_a_bad_question_on_a_channel_is_refused_and_the_channel_goes_on() -> None:
    def answer(peer, args):
        return args["x"], None

    async with trio.open_nursery() as nursery:
        b_gossip = PairedGossip(nursery)
        MeshQueries(node_id="b", cluster_name="meshd", gossip=b_gossip).handle_pipelined("q", answer)
        client = MeshQueries(node_id="a", cluster_name="meshd", gossip=PairedGossip(nursery, peer=b_gossip))
        channel = await client.open_channel("b", "q")
        await channel.send({})
        await channel.send({"x": 7})
        with pytest.raises(QueryFailed, match="bad arguments"):
            await channel.reply()
        assert await channel.reply() == 7
        nursery.cancel_scope.cancel()
