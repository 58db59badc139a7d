"""How a replay reads another member's part of a stream, against a scripted member:
a member that closes the read unanswered is taken for a version without streams only
if it closes a second read too; one that refuses the second (it died while answering
the first: a killed process's kernel closes its sockets, which the asker reads as an
orderly end) is missing, so the replay says so and reads its part when it is back."""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Mapping, Sequence

import pytest
import trio

from clock import ManualClock
from routing.queries import QueryFailed, QueryUnanswered
from session_store.store import MemoryStore
from streams.cursor import FetchedPage, FetchFailed
from streams.service import READ_QUERY, StreamService
from streams.spec import parse_specs


class ScriptedMember:
    """Answers the asker's queries to member "C" from a script, one entry per ask:
    an exception to raise or a reply to return."""

    def __init__(self, script: list[object]) -> None:
        self.script = script
        self.asked: list[tuple[str, str]] = []

    def handle(self, query: str, handler: Callable[[str, Mapping[str, Any]], Awaitable[object]]) -> None:
        pass

    async def ask(self, peer: str, query: str, args: Mapping[str, object], timeout: float = 3.0) -> object:
        self.asked.append((peer, query))
        step = self.script.pop(0)
        if isinstance(step, Exception):
            raise step
        return step


class Members:
    def members(self) -> Sequence[Mapping[str, Any]]:
        return [{"id": "A", "state": "alive"}, {"id": "C", "state": "alive"}]

    def member_state(self, member_id: str) -> str | None:
        return "alive"


class NoRoutes:
    def has_route(self, node: str, topic_filter: str) -> bool:
        return False


def read_part_of_c(script: list[object]) -> tuple[object, ScriptedMember]:
    member = ScriptedMember(script)
    service = StreamService(node_id="A", clock=ManualClock(), store=MemoryStore(), specs=parse_specs('[{"filter": "plant/#"}]'),
                            recovered_meta={}, queries=member, members=Members(), routes=NoRoutes())

    async def main() -> object:
        try:
            return await service._fetch("C", "plant/#", "plant/#", "")
        except FetchFailed as exc:
            return exc

    return trio.run(main), member


def unanswered() -> QueryUnanswered:
    return QueryUnanswered("closed the query unanswered (a version without cluster queries?)")


def test_a_member_that_dies_while_answering_is_missing_not_an_older_version() -> None:
    result, member = read_part_of_c([unanswered(), QueryFailed("unreachable (Connection refused)")])
    assert isinstance(result, FetchFailed) and "unreachable" in str(result)
    assert member.asked == [("C", READ_QUERY)] * 2


def test_a_member_that_closes_two_reads_unanswered_holds_no_part() -> None:
    result, member = read_part_of_c([unanswered(), unanswered()])
    assert isinstance(result, FetchedPage) and (result.records, result.end) == ([], True)
    assert len(member.asked) == 2


def test_a_member_that_answers_the_second_read_gives_its_page() -> None:
    result, member = read_part_of_c([unanswered(), {"m": [], "k": "", "end": False, "t": ""}])
    assert isinstance(result, FetchedPage) and (result.records, result.end) == ([], False)


@pytest.mark.parametrize("error, missing", [
    (QueryFailed("unknown query 'stream_read'"), False),  # queries, but no streams: no part
    (QueryFailed("no answer within 10 s"), True),
    (QueryFailed("connection lost ([Errno 104] Connection reset by peer)"), True),
])
def test_other_failures_are_asked_once(error: QueryFailed, missing: bool) -> None:
    result, member = read_part_of_c([error])
    assert isinstance(result, FetchFailed) is missing
    assert len(member.asked) == 1
