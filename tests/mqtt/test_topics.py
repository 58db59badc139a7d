"""Topic names, topic filters, shared subscriptions and the reference matcher."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqtt import (
    RemoteProtocolError,
    parse_shared_subscription,
    topic_matches,
    validate_topic_filter,
    validate_topic_name,
)

from .strategies import topic_filters, topic_names


@pytest.mark.parametrize("name", ["a", "a/b", "/", "/a", "a/", "$SYS/x", "ü/中", "a b", "//"])
def test_valid_topic_names(name):
    validate_topic_name(name)


@pytest.mark.parametrize("name", ["", "+", "#", "a/+", "a/#", "a+", "a\x00b"])
def test_invalid_topic_names(name):
    with pytest.raises(RemoteProtocolError) as info:
        validate_topic_name(name)
    assert info.value.reason_code == 0x90


@pytest.mark.parametrize(
    "topic_filter",
    ["#", "+", "a/#", "a/+/b", "+/+", "/+", "+/", "a//b", "$SYS/#", "$share/g/a/#", "$share/g/#",
     "$shares/x", "$sharex", "sport/tennis/+", "a/b/c/#"],
)
def test_valid_topic_filters(topic_filter):
    validate_topic_filter(topic_filter)


@pytest.mark.parametrize(
    "topic_filter",
    ["", "a/#/b", "#/a", "a+", "+a", "a/b+", "#a", "a#", "a/b#", "##", "++",
     "$share", "$share/", "$share//a", "$share/g", "$share/g/", "$share/g+/a", "$share/#/a",
     "$share/g/a/#/b", "a\x00"],
)
def test_invalid_topic_filters(topic_filter):
    with pytest.raises(RemoteProtocolError) as info:
        validate_topic_filter(topic_filter)
    assert info.value.reason_code == 0x8F


@pytest.mark.parametrize(
    ("topic_filter", "expected"),
    [
        ("a/b", (None, "a/b")),
        ("$share/g/a/b", ("g", "a/b")),
        ("$share/grp/#", ("grp", "#")),
        ("$share/g//", ("g", "/")),
        ("$shares/a", (None, "$shares/a")),
        ("$SYS/x", (None, "$SYS/x")),
    ],
)
def test_parse_shared_subscription(topic_filter, expected):
    assert parse_shared_subscription(topic_filter) == expected


MATCHES = [
    ("a/b", "a/b", True),
    ("a/b", "a/c", False),
    ("a/b", "a/b/c", False),
    ("a/+", "a/b", True),
    ("a/+", "a/b/c", False),
    ("a/+", "a/", True),  # '+' matches an empty level
    ("+/+", "/", True),
    ("+", "/a", False),
    ("/+", "/a", True),
    ("a/#", "a", True),  # '#' includes the parent level [MQTT-4.7.1-2]
    ("a/#", "a/b/c", True),
    ("a/#", "ab", False),
    ("#", "a/b", True),
    ("#", "/", True),
    ("+/b/#", "x/b", True),
    ("+/b/#", "x/c", False),
    ("sport/tennis/+", "sport/tennis/player1", True),
    ("sport/tennis/+", "sport/tennis/player1/ranking", False),
    ("sport/+", "sport", False),
    # $-topics are not matched by a wildcard in the first level [MQTT-4.7.2-1]
    ("#", "$SYS/x", False),
    ("+/x", "$SYS/x", False),
    ("+", "$SYS", False),
    ("$SYS/#", "$SYS/x", True),
    ("$SYS/+", "$SYS/x", True),
    ("a/#", "a/$x", True),
    ("A", "a", False),  # case-sensitive
]


@pytest.mark.parametrize(("topic_filter", "name", "expected"), MATCHES)
def test_topic_matches(topic_filter, name, expected):
    assert topic_matches(topic_filter, name) is expected


@settings(max_examples=300, deadline=None)
@given(topic_names)
def test_a_name_matches_itself_and_hash(name):
    assert topic_matches(name, name)
    assert topic_matches("#", name) is not name.startswith("$")


@settings(max_examples=300, deadline=None)
@given(topic_names, st.data())
def test_replacing_levels_with_plus_still_matches(name, data):
    levels = name.split("/")
    mask = data.draw(st.lists(st.booleans(), min_size=len(levels), max_size=len(levels)))
    topic_filter = "/".join("+" if m else level for m, level in zip(mask, levels))
    if name.startswith("$") and mask[0]:
        assert not topic_matches(topic_filter, name)
    else:
        assert topic_matches(topic_filter, name)
        assert not topic_matches(topic_filter + "/x", name)


@settings(max_examples=300, deadline=None)
@given(topic_filters())
def test_generated_filters_are_valid(topic_filter):
    validate_topic_filter(topic_filter)
