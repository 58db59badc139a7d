"""The `$delayed/<seconds>/<topic>` form: accepted delays and targets, and the v5
reason code of every refusal."""

from __future__ import annotations

import pytest

from delayed.records import id_to_key, key_to_id, make_key
from delayed.topic import DelayedTopic, DelayedTopicRefused, is_delayed, parse_delayed
from mqtt import ReasonCode


@pytest.mark.parametrize("topic, expected", [
    ("$delayed/0/x", DelayedTopic(0, "x")),
    ("$delayed/30/plant/7/temp", DelayedTopic(30, "plant/7/temp")),
    ("$delayed/4294967/a", DelayedTopic(4294967, "a")),
    ("$delayed/5//lead", DelayedTopic(5, "/lead")),
])
def test_accepted(topic, expected):
    assert is_delayed(topic)
    assert parse_delayed(topic, 4294967) == expected


@pytest.mark.parametrize("topic, code", [
    ("$delayed/abc/x", ReasonCode.TOPIC_NAME_INVALID),  # not an integer
    ("$delayed/-5/x", ReasonCode.TOPIC_NAME_INVALID),  # negative
    ("$delayed/1.5/x", ReasonCode.TOPIC_NAME_INVALID),
    ("$delayed//x", ReasonCode.TOPIC_NAME_INVALID),  # no delay
    ("$delayed/\u0661/x", ReasonCode.TOPIC_NAME_INVALID),  # a non-ASCII digit
    ("$delayed/10", ReasonCode.TOPIC_NAME_INVALID),  # no target
    ("$delayed/10/", ReasonCode.TOPIC_NAME_INVALID),  # empty target
    ("$delayed/10/a/+/b", ReasonCode.TOPIC_NAME_INVALID),  # wildcards
    ("$delayed/10/a/#", ReasonCode.TOPIC_NAME_INVALID),
    ("$delayed/4294968/x", ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR),  # above the maximum
    ("$delayed/10/$SYS/x", ReasonCode.NOT_AUTHORIZED),
    ("$delayed/10/$delayed/5/x", ReasonCode.NOT_AUTHORIZED),
])
def test_refused(topic, code):
    with pytest.raises(DelayedTopicRefused) as exc:
        parse_delayed(topic, 4294967)
    assert exc.value.reason_code == code


def test_the_maximum_is_the_configured_one():
    assert parse_delayed("$delayed/60/x", 60).delay == 60
    with pytest.raises(DelayedTopicRefused):
        parse_delayed("$delayed/61/x", 60)


def test_ids_name_keys_and_keys_sort_by_due_time():
    key = make_key(1700000000.0001, 42)
    assert key_to_id(key) == "1700000000001-42"  # rounded up: never due early
    assert id_to_key(key_to_id(key)) == key
    assert make_key(5.0, 9) < make_key(5.001, 1) < make_key(6.0, 0)
    for bad in ("", "12", "a-1", "1-b", "-1", "1-", f"{1 << 64}-1"):
        assert id_to_key(bad) is None
