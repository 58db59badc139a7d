"""Topic trie: matching rules (MQTT §4.7), a naive reference matcher, pruning."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routing.trie import TopicTrie


def naive_matches(topic_filter: str, topic: str) -> bool:
    """Reference matcher straight from the spec text, level by level."""
    f = topic_filter.split("/")
    t = topic.split("/")
    # [MQTT-4.7.2-1] $-topics are not matched by a leading wildcard.
    if topic.startswith("$") and f[0] in ("+", "#"):
        return False
    for i, level in enumerate(f):
        if level == "#":
            return True  # this level and below, incl. the parent (len(t) == i)
        if i >= len(t):
            return False
        if level != "+" and level != t[i]:
            return False
    return len(f) == len(t)


# (filter, topic, matches) — the examples from MQTT 3.1.1 / 5.0 §4.7.
SPEC_CASES = [
    ("sport/tennis/player1/#", "sport/tennis/player1", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/ranking", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/score/wimbledon", True),
    ("sport/tennis/player1/#", "sport/tennis/player2", False),
    ("sport/#", "sport", True),
    ("sport/tennis/+", "sport/tennis/player1", True),
    ("sport/tennis/+", "sport/tennis/player2", True),
    ("sport/tennis/+", "sport/tennis/player1/ranking", False),
    ("sport/+", "sport", False),
    ("sport/+", "sport/", True),
    ("+/+", "/finance", True),
    ("/+", "/finance", True),
    ("+", "/finance", False),
    ("+", "finance", True),
    ("#", "anything/at/all", True),
    ("#", "/", True),
    ("#", "$SYS/broker/uptime", False),
    ("+/monitor/Clients", "$SYS/monitor/Clients", False),
    ("$SYS/#", "$SYS/monitor/Clients", True),
    ("$SYS/#", "$SYS", True),
    ("$SYS/monitor/+", "$SYS/monitor/Clients", True),
    ("+/monitor/Clients", "x/monitor/Clients", True),
    ("a/+/c", "a/b/c", True),
    ("a/+/c", "a//c", True),
    ("a/+/c", "a/b/d", False),
    ("a/b", "a/b", True),
    ("a/b", "a/b/c", False),
    ("a/b", "A/b", False),
    ("a/+/#", "a/b", True),
    ("a/+/#", "a", False),
    ("+/#", "a", True),
    ("a/$x", "a/$x", True),
    ("a/+", "a/$x", True),  # the $ rule only concerns the first level
]


@pytest.mark.parametrize("topic_filter,topic,expected", SPEC_CASES)
def test_spec_examples(topic_filter: str, topic: str, expected: bool) -> None:
    assert naive_matches(topic_filter, topic) is expected
    trie: TopicTrie[str] = TopicTrie()
    trie.add(topic_filter, "v")
    assert trie.match(topic) == (["v"] if expected else [])
    mf = trie.match_filters(topic)
    assert mf == ([(topic_filter, {"v"})] if expected else [])


def test_all_spec_filters_together() -> None:
    trie: TopicTrie[str] = TopicTrie()
    filters = sorted({f for f, _, _ in SPEC_CASES})
    for f in filters:
        trie.add(f, f)
    for _, topic, _ in SPEC_CASES:
        want = sorted(f for f in filters if naive_matches(f, topic))
        assert sorted(trie.match(topic)) == want
        assert sorted(f for f, _ in trie.match_filters(topic)) == want


def test_value_once_per_matching_filter() -> None:
    trie: TopicTrie[str] = TopicTrie()
    assert trie.add("a/+", "c1")
    assert trie.add("a/#", "c1")
    assert trie.add("a/b", "c2")
    assert not trie.add("a/b", "c2")
    assert Counter(trie.match("a/b")) == Counter({"c1": 2, "c2": 1})
    assert dict(trie.match_filters("a/b")) == {"a/+": {"c1"}, "a/#": {"c1"}, "a/b": {"c2"}}
    assert len(trie) == 3


def test_values_has_filter_filters_len() -> None:
    trie: TopicTrie[int] = TopicTrie()
    assert trie.values("x") == set()
    assert not trie.has_filter("x")
    trie.add("x/y", 1)
    trie.add("x/y", 2)
    trie.add("x", 3)
    assert trie.values("x/y") == {1, 2}
    assert trie.has_filter("x") and trie.has_filter("x/y")
    assert "x/y" in trie
    assert not trie.has_filter("x/y/z")
    assert sorted(trie.filters()) == ["x", "x/y"]
    assert len(trie) == 3
    # values() is a copy: mutating it does not touch the trie.
    trie.values("x/y").add(99)
    assert trie.values("x/y") == {1, 2}
    assert trie.remove("x/y", 1)
    assert not trie.remove("x/y", 1)
    assert not trie.remove("nope", 1)
    assert len(trie) == 2
    trie.clear()
    assert len(trie) == 0 and list(trie.filters()) == [] and trie.node_count() == 0


def test_remove_prunes_but_keeps_shared_prefix() -> None:
    trie: TopicTrie[str] = TopicTrie()
    trie.add("a/b/c", "v")
    trie.add("a/b", "w")
    assert trie.node_count() == 3
    trie.remove("a/b/c", "v")
    assert trie.node_count() == 2  # a, a/b stay: a/b holds w
    assert trie.match("a/b") == ["w"]
    trie.remove("a/b", "w")
    assert trie.node_count() == 0


def test_inner_node_without_values_is_no_filter() -> None:
    trie: TopicTrie[str] = TopicTrie()
    trie.add("a/b/c", "v")
    assert not trie.has_filter("a/b")
    assert trie.match("a/b") == []
    assert list(trie.filters()) == ["a/b/c"]


def test_discard_filter() -> None:
    trie: TopicTrie[str] = TopicTrie()
    trie.add("a/#", "x")
    trie.add("a/#", "y")
    trie.add("b", "z")
    assert trie.discard_filter("a/#") == {"x", "y"}
    assert trie.discard_filter("a/#") == set()
    assert len(trie) == 1 and trie.filter_count() == 1 and trie.node_count() == 1


def test_shared_subscription_values_are_opaque() -> None:
    # The broker strips $share/group/ and stores (group, client) tuples.
    trie: TopicTrie[tuple[str, str]] = TopicTrie()
    trie.add("sensors/+", ("g1", "c1"))
    trie.add("sensors/+", ("g1", "c2"))
    assert sorted(trie.match("sensors/t")) == [("g1", "c1"), ("g1", "c2")]


# -- property tests against the reference matcher ---------------------------

LEVELS = st.sampled_from(["a", "b", "", "$SYS", "$x", "c"])
FILTER_LEVELS = st.sampled_from(["a", "b", "", "$SYS", "$x", "c", "+"])


@st.composite
def topic_filters(draw: st.DrawFn) -> str:
    levels = draw(st.lists(FILTER_LEVELS, min_size=1, max_size=4))
    if draw(st.booleans()):
        levels.append("#")
    return "/".join(levels)


topics = st.lists(LEVELS, min_size=1, max_size=5).map("/".join)


@settings(max_examples=300, deadline=None)
@given(st.lists(topic_filters(), max_size=25), st.lists(topics, min_size=1, max_size=15))
def test_match_equals_reference(filters: list[str], topic_list: list[str]) -> None:
    trie: TopicTrie[str] = TopicTrie()
    for f in filters:
        trie.add(f, f)
    distinct = set(filters)
    for topic in topic_list:
        want = sorted(f for f in distinct if naive_matches(f, topic))
        assert sorted(trie.match(topic)) == want
        assert sorted(f for f, vs in trie.match_filters(topic)) == want
        for f, vs in trie.match_filters(topic):
            assert vs == {f}


def _naive_nodes(pairs: set[tuple[str, int]]) -> int:
    prefixes = set()
    for f, _ in pairs:
        levels = f.split("/")
        for i in range(1, len(levels) + 1):
            prefixes.add(tuple(levels[:i]))
    return len(prefixes)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.booleans(), topic_filters(), st.integers(0, 3)),
        max_size=60,
    )
)
def test_add_remove_sequences(ops: list[tuple[bool, str, int]]) -> None:
    trie: TopicTrie[int] = TopicTrie()
    model: set[tuple[str, int]] = set()
    for is_add, f, v in ops:
        if is_add:
            assert trie.add(f, v) == ((f, v) not in model)
            model.add((f, v))
        else:
            assert trie.remove(f, v) == ((f, v) in model)
            model.discard((f, v))
        assert len(trie) == len(model)
    # No empty nodes: the node count equals the number of distinct prefixes.
    assert trie.node_count() == _naive_nodes(model)
    assert sorted(trie.filters()) == sorted({f for f, _ in model})
    assert trie.filter_count() == len({f for f, _ in model})
    for f in {f for f, _ in model}:
        assert trie.values(f) == {v for g, v in model if g == f}
