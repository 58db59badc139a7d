"""The replay merge, fed by a model of nodes that publish while a replay reads them.

The model: each node has messages already stored when the replay starts, keeps
publishing during it, and forwards live messages to the subscriber (in order, with a
delay) only once it knows the subscriber's route; a page read sees what was stored at
that moment and says `end` only at the end of it with the route known. Whatever the
interleaving, page sizes, failures and hold limit, the subscriber gets every message
exactly once, each node's in its order, and the replayed ones before the switch in
position order (unless a node's held live messages overflowed: its part is then read
on behind the others, in its own order)."""

from __future__ import annotations

from collections import deque

from hypothesis import given, settings
from hypothesis import strategies as st

from streams import position as p
from streams.merge import Marker, Record, ReplayMerge


class Node:
    def __init__(self, name: str, stored: int, to_publish: int, route_known: bool) -> None:
        self.name = name
        self.messages = [p.encode(1000 + 3 * i + ord(name[-1]) % 3, 0, name) for i in range(stored + to_publish)]
        self.published = stored
        self.route_known = route_known
        self.in_flight: deque[str] = deque()

    def publish(self) -> None:
        pos = self.messages[self.published]
        self.published += 1
        if self.route_known:
            self.in_flight.append(pos)

    def read(self, after: str, size: int) -> tuple[list[str], str, bool]:
        found = [m for m in self.messages[:self.published] if m > after][:size]
        last = found[-1] if found else after
        at_end = not [m for m in self.messages[:self.published] if m > last]
        return found, last, at_end and self.route_known


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_every_message_once_in_order(data):
    nodes = {f"n{i}": Node(f"n{i}", data.draw(st.integers(0, 8)), data.draw(st.integers(0, 8)), data.draw(st.booleans()))
             for i in range(data.draw(st.integers(1, 3)))}
    merge = ReplayMerge(p.EARLIEST, nodes, hold_limit=data.draw(st.integers(1, 5)))
    size = data.draw(st.integers(1, 4))
    delivered: list[str] = []
    replay_phase: list[str] = []
    asked: dict[str, str] = {}
    failing = {n: data.draw(st.integers(0, 2)) for n in nodes}

    def collect() -> None:
        for item in merge.take():
            if isinstance(item, Record):
                delivered.append(item.position)
                if merge.merging:
                    replay_phase.append(item.position)
            else:
                assert isinstance(item, Marker)

    for step in range(2000):
        for node, after in merge.to_fetch():
            asked[node] = after
        collect()
        moves = [("answer", n) for n in asked] + [("publish", n) for n, x in nodes.items() if x.published < len(x.messages)]
        moves += [("live", n) for n, x in nodes.items() if x.in_flight]
        moves += [("route", n) for n, x in nodes.items() if not x.route_known]
        moves += [("retry", n) for n in merge.missing_nodes() if n not in asked]
        if not moves:
            break
        if step < 300:
            kind, name = data.draw(st.sampled_from(moves))
        else:  # the faults stop: everything settles (routes spread, forwards arrive)
            kind, name = min(moves, key=lambda m: ("route", "live", "retry", "answer", "publish").index(m[0]))
        node = nodes[name]
        if kind == "answer":
            after = asked.pop(name)
            if failing[name] and data.draw(st.booleans()):
                failing[name] -= 1
                merge.failed(name)
            else:
                found, last, end = node.read(after, size)
                merge.page(name, [Record(x, None) for x in found], last, end)
        elif kind == "publish":
            node.publish()
        elif kind == "live":
            pos = node.in_flight.popleft()
            collect()
            if merge.live(Record(pos, None)):
                delivered.append(pos)
        elif kind == "route":
            node.route_known = True
        else:
            merge.retry(name)
        collect()
    else:
        raise AssertionError("the model did not settle")
    assert merge.finished
    everything = sorted(m for x in nodes.values() for m in x.messages)
    assert sorted(delivered) == everything, "lost or repeated"
    assert len(delivered) == len(set(delivered))
    for name in nodes:
        mine = [d for d in delivered if p.origin(d) == name]
        assert mine == sorted(mine), f"{name} out of order"
    if not merge.overflows:  # an overflowed node's part is read on after the others moved past it
        assert replay_phase == sorted(replay_phase)


def test_missing_node_is_reported_then_recovered_in_its_order():
    a, b = p.encode(1, 0, "a"), p.encode(2, 0, "b")
    merge = ReplayMerge(p.EARLIEST, ["a", "b"])
    assert sorted(merge.to_fetch()) == [("a", ""), ("b", "")]
    merge.failed("b")
    merge.page("a", [Record(a, "A")], a, True)
    out = merge.take()
    assert out[0] == Marker("missing", "b") and out[1] == Record(a, "A")
    assert not merge.merging and not merge.finished and merge.to_fetch() == []
    held = p.encode(5, 0, "b")
    assert merge.live(Record(held, "live")) is False  # b's part first
    merge.retry("b")
    assert merge.to_fetch() == [("b", "")]
    merge.page("b", [Record(b, "B")], b, True)
    assert merge.take() == [Record(b, "B"), Record(held, "live"), Marker("recovered", "b")]
    assert merge.finished and merge.live(Record(p.encode(6, 0, "b"), None)) is True


def test_truncated_part_is_said():
    merge = ReplayMerge(p.EARLIEST, ["a"])
    merge.to_fetch()
    first = p.encode(9, 0, "a")
    merge.page("a", [Record(first, None)], first, True, trimmed=p.encode(8, 0, "a"))
    assert merge.take()[0] == Marker("truncated", "a", first)
