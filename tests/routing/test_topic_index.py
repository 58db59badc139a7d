"""TopicIndex (the route table's flat trie) against a brute-force matcher and TopicTrie."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routing.topic_index import TopicIndex
from routing.trie import TopicTrie
from tests.routing.test_trie import SPEC_CASES, naive_matches


@pytest.mark.parametrize("topic_filter,topic,expected", SPEC_CASES)
def test_spec_examples(topic_filter: str, topic: str, expected: bool) -> None:
    index: TopicIndex[str] = TopicIndex()
    index.add(topic_filter, "v")
    assert index.match(topic) == (["v"] if expected else [])
    assert index.match_filters(topic) == ([(topic_filter, {"v"})] if expected else [])


def test_all_spec_filters_together() -> None:
    index: TopicIndex[str] = TopicIndex()
    filters = sorted({f for f, _, _ in SPEC_CASES})
    for f in filters:
        index.add(f, f)
    for _, topic, _ in SPEC_CASES:
        want = sorted(f for f in filters if naive_matches(f, topic))
        assert sorted(index.match(topic)) == want
        assert sorted(f for f, _ in index.match_filters(topic)) == want


def test_value_once_per_matching_filter() -> None:
    index: TopicIndex[str] = TopicIndex()
    assert index.add("a/+", "c1")
    assert index.add("a/#", "c1")
    assert index.add("a/b", "c2")
    assert not index.add("a/b", "c2")
    assert Counter(index.match("a/b")) == Counter({"c1": 2, "c2": 1})
    assert dict(index.match_filters("a/b")) == {"a/+": {"c1"}, "a/#": {"c1"}, "a/b": {"c2"}}
    assert len(index) == 3


def test_values_remove_discard_clear() -> None:
    index: TopicIndex[int] = TopicIndex()
    assert index.values("x") == set() and not index.has_filter("x")
    index.add("x/y", 1)
    index.add("x/y", 2)
    index.add("x", 3)
    assert index.values("x/y") == {1, 2} and "x/y" in index and not index.has_filter("x/y/z")
    assert not index.has_filter("x/y/z") and sorted(index.filters()) == ["x", "x/y"]
    index.values("x/y").add(99)  # a copy
    assert index.values("x/y") == {1, 2}
    assert index.remove("x/y", 1) and not index.remove("x/y", 1) and not index.remove("nope", 1)
    assert index.discard_filter("x/y") == {2} and index.discard_filter("x/y") == set()
    assert len(index) == 1 and index.filter_count() == 1 and index.node_count() == 1
    index.clear()
    assert len(index) == 0 and list(index.filters()) == [] and index.node_count() == 0
    index.add("x", 4)
    assert index.match("x") == [4]


def test_filters_sharing_values_share_one_set() -> None:
    index: TopicIndex[str] = TopicIndex()
    for i in range(100):
        index.add(f"a/{i}", "n1")
        index.add(f"b/{i}", "n1")
        index.add(f"b/{i}", "n2")
    assert len(index._sets) == 3  # none, {n1}, {n1, n2}
    for i in range(100):
        index.remove(f"b/{i}", "n2")
    assert index.match("b/7") == ["n1"] and len(index._set_ids) == 1


def test_grows_and_shrinks_back_to_empty() -> None:
    # Thousands of edges: the slot table doubles several times, and deletes shift
    # entries of long probe runs back; every level and value set is released at the end.
    index: TopicIndex[str] = TopicIndex()
    trie: TopicTrie[str] = TopicTrie()
    filters = [f"s/{i % 37}/d/{i}/{'+' if i % 5 == 0 else '#' if i % 7 == 0 else 'm'}" for i in range(3000)]
    for i, f in enumerate(filters):
        assert index.add(f, f"n{i % 3}") == trie.add(f, f"n{i % 3}")
    assert index.node_count() == trie.node_count()
    for t in ("s/3/d/40/m", "s/5/d/5/x", "s/0/d/0/m/z", "s/7/d/7", "s/1/d/1/q"):
        assert sorted(index.match(t)) == sorted(trie.match(t))
    for i, f in enumerate(filters[::2]):
        assert index.remove(f, f"n{(2 * i) % 3}")
        trie.remove(f, f"n{(2 * i) % 3}")
    for f in filters:
        t = f.replace("+", "x").replace("#", "y/z")
        assert sorted(index.match(t)) == sorted(trie.match(t))
    for i, f in enumerate(filters[1::2]):
        assert index.remove(f, f"n{(2 * i + 1) % 3}")
    assert len(index) == 0 and index.node_count() == 0 and index._root_flags == 0
    assert set(index._level_ids) == {"+", "#"} and index._set_ids == {}
    assert not any(index._slots)


# -- property tests: a brute-force matcher over the live pairs --------------------

# Many level names: more than the signature's 8 bits, so names share a bit.
LEVELS = st.sampled_from(["a", "b", "", "$SYS", "$x", "c", "d", "e", "f", "g", "h", "i", "j", "k"])
FILTER_LEVELS = st.one_of(LEVELS, st.just("+"))


@st.composite
def topic_filters(draw: st.DrawFn) -> str:
    levels = draw(st.lists(FILTER_LEVELS, min_size=1, max_size=4))
    if draw(st.booleans()):
        levels.append("#")
    return "/".join(levels)


topics = st.lists(LEVELS, min_size=1, max_size=5).map("/".join)
OPS = st.lists(st.tuples(st.sampled_from(["add", "add", "remove", "discard"]), topic_filters(), st.integers(0, 3)),
               max_size=80)


@settings(max_examples=300, deadline=None)
@given(OPS, st.lists(topics, min_size=1, max_size=10))
def test_matches_brute_force_through_adds_and_removes(ops: list[tuple[str, str, int]], topic_list: list[str]) -> None:
    index: TopicIndex[int] = TopicIndex()
    model: set[tuple[str, int]] = set()
    for op, f, v in ops:
        if op == "add":
            assert index.add(f, v) == ((f, v) not in model)
            model.add((f, v))
        elif op == "remove":
            assert index.remove(f, v) == ((f, v) in model)
            model.discard((f, v))
        else:
            assert index.discard_filter(f) == {w for g, w in model if g == f}
            model = {(g, w) for g, w in model if g != f}
        assert len(index) == len(model)
        for topic in topic_list[:3]:
            assert Counter(index.match(topic)) == Counter(w for g, w in model if naive_matches(g, topic))
    live = {f for f, _ in model}
    for topic in topic_list:
        assert Counter(index.match(topic)) == Counter(w for g, w in model if naive_matches(g, topic))
        assert sorted((f, sorted(vs)) for f, vs in index.match_filters(topic)) == sorted(
            (f, sorted(w for g, w in model if g == f)) for f in live if naive_matches(f, topic))
    assert sorted(index.filters()) == sorted(live) and index.filter_count() == len(live)
    for f in live:
        assert index.values(f) == {w for g, w in model if g == f}
    # No empty nodes: one edge per distinct filter prefix.
    assert index.node_count() == len({tuple(f.split("/")[:i]) for f in live for i in range(1, len(f.split("/")) + 1)})


@settings(max_examples=100, deadline=None)
@given(st.lists(topic_filters(), max_size=40), st.lists(topics, min_size=1, max_size=15))
def test_same_answers_as_the_trie(filters: list[str], topic_list: list[str]) -> None:
    index: TopicIndex[str] = TopicIndex()
    trie: TopicTrie[str] = TopicTrie()
    for i, f in enumerate(filters):
        index.add(f, f"n{i % 4}")
        trie.add(f, f"n{i % 4}")
    for topic in topic_list:
        assert Counter(index.match(topic)) == Counter(trie.match(topic))
        assert sorted((f, sorted(v)) for f, v in index.match_filters(topic)) == sorted(
            (f, sorted(v)) for f, v in trie.match_filters(topic))


def test_huge_page_advice_is_a_hint() -> None:
    from librt.vecs import vec
    from mypy_extensions import i64

    from routing.huge_pages import HUGE_PAGE, advise_huge_pages

    big = vec[i64](capacity=2 * HUGE_PAGE)  # 32 MB: advised (True where the kernel takes it)
    assert isinstance(advise_huge_pages(big, 16 * HUGE_PAGE), bool)
    assert advise_huge_pages(vec[i64](capacity=8), 64) is False  # too small to bother
    assert advise_huge_pages(object(), 16 * HUGE_PAGE) is False  # no buffer: nothing, no error
