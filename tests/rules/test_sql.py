"""The rule SQL compiler, fed messages: fields, JSON paths, operators, functions, CASE,
sources, NULLs; and what it refuses, with the position."""

from __future__ import annotations

import json
from typing import Any

import pytest

from mqtt import EMPTY_PROPERTIES, Properties
from rules.record import RuleInput
from rules.sql import RuleSqlError, compile_rule
from session_store.model import Message


def message(payload: Any, topic: str = "sensors/7/temp", qos: int = 1, *, retain: bool = False,
            user: tuple[tuple[str, str], ...] = ()) -> RuleInput:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    props = Properties(user_properties=user) if user else EMPTY_PROPERTIES
    msg = Message(topic, body, qos, retain, props, None, "dev-7", 42, "n1")
    return RuleInput.of_message(msg, event="message.publish", node="n1", timestamp=1_700_000_000_123, username="alice")


def run(sql: str, source: RuleInput) -> dict[str, Any] | None:
    return compile_rule(sql).evaluate(source)


def test_the_issue_example_with_an_alias_in_where() -> None:
    sql = 'SELECT payload.temp AS t, clientid, topic, timestamp FROM "sensors/+/temp" WHERE t > 30'
    q = compile_rule(sql)
    assert q.topic_filters == ("sensors/+/temp",) and q.events == ()
    assert q.evaluate(message({"temp": 30})) is None
    assert q.evaluate(message({"temp": 30.5})) == {"t": 30.5, "clientid": "dev-7", "topic": "sensors/7/temp",
                                                   "timestamp": 1_700_000_000_123}


def test_metadata_fields_and_paths() -> None:
    out = run('SELECT id, event, username, qos, retain, node, payload.a.b.1 AS deep, payload.missing.x AS gone, '
              'user_properties.site AS site, payload FROM "#"', message({"a": {"b": [10, 20]}}, user=(("site", "lab"),)))
    assert out == {"id": "n1:42", "event": "message.publish", "username": "alice", "qos": 1, "retain": False,
                   "node": "n1", "deep": 20, "gone": None, "site": "lab", "payload": '{"a": {"b": [10, 20]}}'}


@pytest.mark.parametrize(("expr", "value"), [
    ("1 + 2 * 3", 7), ("(1 + 2) * 3", 9), ("7 / 2", 3.5), ("7 % 3", 1), ("-payload.n", -4),
    ("payload.n > 3 AND payload.n < 5", True), ("payload.n = 3 OR NOT payload.n = 4", False),
    ("payload.n <> 4", False), ("payload.n BETWEEN 1 AND 4", True), ("payload.n IN (1, 4)", True),
    ("payload.n NOT IN (1, 4)", False), ("topic LIKE 'sensors/%/temp'", True), ("topic NOT LIKE 's_nsors%'", False),
    ("payload.none IS NULL", True), ("payload.n IS NOT NULL", True), ("payload.none + 1", None),
    ("payload.none > 1", None), ("CASE WHEN payload.n > 3 THEN 'hot' ELSE 'cold' END", "hot"),
    ("CASE payload.n WHEN 3 THEN 'three' WHEN 4 THEN 'four' END", "four"), ("CASE WHEN false THEN 1 END", None),
    ("upper(clientid)", "DEV-7"), ("lower('AB')", "ab"), ("length(topic)", 14), ("substring(topic, 1, 7)", "sensors"),
    ("concat(clientid, '/', qos)", "dev-7/1"), ("clientid || '!'", "dev-7!"), ("replace(topic, '/', '.')", "sensors.7.temp"),
    ("trim('  x ')", "x"), ("ltrim('  x ')", "x "), ("rtrim('  x ')", "  x"), ("split(topic, '/')", ["sensors", "7", "temp"]),
    ("topic_level(topic, 2)", "7"), ("regex_match(topic, '^sensors/[0-9]+')", True), ("strpos(topic, 'temp')", 11),
    ("abs(-2)", 2), ("round(2.567, 2)", 2.57), ("round(2.5)", 2), ("ceil(1.2)", 2), ("floor(1.8)", 1), ("sqrt(16)", 4.0),
    ("power(2, 10)", 1024.0), ("log10(1000)", 3.0), ("mod(10, 4)", 2), ("greatest(1, payload.n, 3)", 4),
    ("coalesce(payload.none, 'x')", "x"), ("nullif(payload.n, 4)", None), ("cast('12' AS INT) + 1", 13),
    ("str(payload.n)", "4"), ("int('7')", 7), ("float('1.5')", 1.5), ("json_encode(payload.obj)", '{"k":1}'),
    ("json_decode('[1,2]')", [1, 2]), ("md5('a')", "0cc175b9c0f1b6a831c399e269772661"), ("now_timestamp()", 1_700_000_000_123),
    ("lpad('7', 3, '0')", "007"), ("if(payload.n > 1, 'y', 'n')", "y"),
])
def test_expressions(expr: str, value: Any) -> None:
    out = run(f'SELECT {expr} AS v FROM "#"', message({"n": 4, "obj": {"k": 1}}))
    assert out == {"v": value}


def test_select_star_and_event_sources() -> None:
    q = compile_rule('SELECT *, qos + 1 AS q FROM "a/#", "$events/client_connected", "$events/message_dropped"')
    assert q.topic_filters == ("a/#",) and q.events == ("client.connected", "message.dropped")
    out = q.evaluate(message({"x": 1}))
    assert out is not None and out["q"] == 2 and out["topic"] == "sensors/7/temp" and out["clientid"] == "dev-7"
    event = RuleInput("client.connected", node="n1", timestamp=5, clientid="c", username=None, peer="1.2.3.4:5", protocol=5)
    assert q.evaluate(event) == {"event": "client.connected", "clientid": "c", "node": "n1", "timestamp": 5,
                                 "peer": "1.2.3.4:5", "protocol": 5, "user_properties": {}, "q": None}


def test_a_payload_that_is_not_json_fails_the_evaluation() -> None:
    q = compile_rule('SELECT payload.temp FROM "#"')
    with pytest.raises(ValueError, match="the payload is not JSON"):
        q.evaluate(message(b"\xffnot json"))
    assert compile_rule('SELECT payload FROM "#"').evaluate(message(b"plain")) == {"payload": "plain"}


@pytest.mark.parametrize(("sql", "error"), [
    ("SELECT payload.temp AS t FROM WHERE t > 30", "cannot parse the rule's SQL at line 1, column 31: Expected table name but got 'WHERE'"),
    ('SELECT topic,\n  frobnicate(qos) FROM "x"', "unknown function frobnicate at line 2, column 3; functions: abs, "),
    ('SELECT nope FROM "x"', "unknown field nope at line 1, column 8; fields: "),
    ('SELECT clientid.x FROM "x"', "clientid has no fields"),
    ("SELECT 1", "a rule needs FROM"),
    ('SELECT 1 FROM "x" GROUP BY topic', "GROUP is not supported"),
    ('SELECT 1 FROM "x" ORDER BY topic', "ORDER is not supported"),
    ('SELECT 1 FROM "a/#/b"', "bad topic filter \"a/#/b\" at line 1, column 15: topic filter 'a/#/b': '#' must be the whole last level"),
    ('SELECT 1 FROM "$events/nope"', 'unknown event source "$events/nope" at line 1, column 15'),
    ('SELECT 1 FROM "$share/g/a"', "bad topic filter"),
    ('SELECT 1 FROM "x" JOIN "y" ON a = b', "sources are listed with commas"),
    ('SELECT 1 FROM "x"; SELECT 2 FROM "y"', "a rule is one SELECT"),
    ("DELETE FROM t", "a rule is one SELECT"),
    ('SELECT CAST(topic AS DATE) FROM "x"', "cannot CAST to DATE"),
    ('SELECT topic LIKE clientid FROM "x"', "LIKE takes a string literal pattern"),
])
def test_refused_with_the_reason_and_position(sql: str, error: str) -> None:
    with pytest.raises(RuleSqlError) as caught:
        compile_rule(sql)
    assert str(caught.value).startswith(error) or error in str(caught.value), str(caught.value)


def test_a_type_error_at_run_time_raises_for_the_engine_to_count() -> None:
    q = compile_rule('SELECT 1 FROM "#" WHERE payload.s > 3')
    with pytest.raises(TypeError):
        q.evaluate(message({"s": "text"}))
