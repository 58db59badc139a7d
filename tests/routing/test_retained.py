"""The retained-message index agrees with the reference matcher."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from mqtt import topic_matches
from routing.retained import RetainedIndex

LEVELS = st.sampled_from(["a", "b", "$SYS", "", "c"])
TOPICS = st.lists(LEVELS, min_size=1, max_size=4).map("/".join)
FILTER_LEVELS = st.sampled_from(["a", "b", "$SYS", "", "+", "c"])


@st.composite
def filters(draw):
    levels = draw(st.lists(FILTER_LEVELS, min_size=1, max_size=4))
    if draw(st.booleans()):
        levels.append("#")
    return "/".join(levels)


@settings(max_examples=300, deadline=None)
@given(topics=st.lists(TOPICS, max_size=20), deleted=st.lists(TOPICS, max_size=5), topic_filter=filters())
def test_match_equals_reference(topics, deleted, topic_filter):
    index: RetainedIndex[str] = RetainedIndex()
    live = {}
    for t in topics:
        index.set(t, t.upper())
        live[t] = t.upper()
    for t in deleted:
        assert index.delete(t) == (t in live)
        live.pop(t, None)
    assert len(index) == len(live)
    expected = sorted((t, v) for t, v in live.items() if topic_matches(topic_filter, t))
    assert sorted(index.match(topic_filter)) == expected
    assert sorted(index.items()) == sorted(live.items())


def test_hash_matches_parent_and_dollar_rule():
    index: RetainedIndex[int] = RetainedIndex()
    for i, t in enumerate(["a", "a/b", "$SYS/x", "b"]):
        index.set(t, i)
    assert sorted(index.match("a/#")) == [("a", 0), ("a/b", 1)]
    assert sorted(index.match("#")) == [("a", 0), ("a/b", 1), ("b", 3)]
    assert index.match("+/x") == []
    assert index.match("$SYS/#") == [("$SYS/x", 2)]


def test_delete_prunes_empty_levels():
    index: RetainedIndex[int] = RetainedIndex()
    index.set("a/b/c", 1)
    assert index.delete("a/b/c")
    assert index._root.children == {}
    assert not index.delete("a/b/c")
