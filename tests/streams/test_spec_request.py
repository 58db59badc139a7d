from __future__ import annotations

import pytest

from mesh.config import ConfigError, load_settings
from streams.request import ReplayRefused, parse_request, real_filter
from streams.spec import SpecError, StreamSpec, canonical_json, covers, parse_specs, stream_for


def test_specs_parse_validate_and_round_trip():
    specs = parse_specs([{"filter": "a/#", "max_age_s": 60, "max_bytes": 1000, "max_messages": 5},
                         {"filter": "b/+", "keep": "opt-in"}])
    assert specs[0] == StreamSpec("a/#", 60.0, 1000, 5)
    assert parse_specs(canonical_json(specs)) == specs
    for bad, why in (([{"max_age_s": 1}], "filter is required"), ([{"filter": "a/#/b"}], "filter"),
                     ([{"filter": "a", "max_messages": 0}], "positive"), ([{"filter": "a", "max_bytes": 1.5}], "integer"),
                     ([{"filter": "a", "ttl": 1}], "unknown key"), ([{"filter": "a"}, {"filter": "a"}], "twice"),
                     ([{"filter": "a", "keep": "some"}], "keep"), ("{", "JSON"), ([{"filter": "$share/g/a"}], "cannot")):
        with pytest.raises(SpecError, match=why):
            parse_specs(bad)


def test_toml_streams_tables(tmp_path):
    path = tmp_path / "meshd.toml"
    path.write_text('[[streams]]\nfilter = "plant/#"\nmax_age_s = 3600\n\n[[streams]]\nfilter = "ota/+"\nmax_messages = 10\n')
    settings = load_settings({"config": str(path)}, env={})
    assert parse_specs(settings.streams) == (StreamSpec("plant/#", 3600.0), StreamSpec("ota/+", max_messages=10))
    path.write_text('[[streams]]\nmax_age_s = 1\n')
    with pytest.raises(ConfigError) as info:
        load_settings({"config": str(path)}, env={})
    assert info.value.key == "streams" and "filter is required" in info.value.message


@pytest.mark.parametrize("stream, sub, expected", [
    ("a/#", "a/#", True), ("a/#", "a/b/c", True), ("a/#", "a/+", True), ("a/#", "a", True), ("a/#", "b/#", False),
    ("a/+", "a/b", True), ("a/+", "a/+", True), ("a/+", "a/#", False), ("a/+", "a/b/c", False),
    ("#", "x/y", True), ("#", "$SYS/x", False), ("a/b", "a/+", False), ("+/t", "x/t", True),
])
def test_covers(stream, sub, expected):
    assert covers(stream, sub) is expected


def test_stream_for_prefers_the_exact_filter():
    specs = parse_specs([{"filter": "#"}, {"filter": "a/#"}])
    assert stream_for(specs, "a/#").filter == "a/#"
    assert stream_for(specs, "a/b").filter == "#"
    assert stream_for(parse_specs([{"filter": "a/#"}]), "b") is None


def test_replay_requests():
    r = parse_request("$replay/earliest/a/b/#", None)
    assert (r.topic_filter, r.after, r.asked) == ("a/b/#", "", "earliest")
    assert parse_request("a/#", "earliest").topic_filter == "a/#"
    assert parse_request("a/#", None) is None
    assert real_filter("$replay/earliest/a/#") == "a/#" and real_filter("a/#") == "a/#"
    for topic_filter, prop, code in (("$replay/earliest", None, 0x8F), ("$replay//a", None, 0x8F),
                                     ("a/#", "yesterday", 0x83), ("$share/g/a", "earliest", 0x83),
                                     ("$replay/earliest/a/#/b", None, 0x8F)):
        with pytest.raises(ReplayRefused) as info:
            parse_request(topic_filter, prop)
        assert info.value.code == code
