"""Prometheus text metrics: format, escaping, label children, callbacks."""

from __future__ import annotations

import logging
import math
import re
from typing import Any, Callable

import pytest
import trio

from mesh.http_api import Router, serve_http
from mesh.http_client import request_json
from mesh.metrics import CONTENT_TYPE, Metrics, add_metrics_route

# A strict reader for text format 0.0.4, written from the format description.
_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL = r"[a-zA-Z_][a-zA-Z0-9_]*"
_LABEL_VALUE = r'"(?:[^"\\\n]|\\\\|\\"|\\n)*"'
_VALUE = r"(?:[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?|[+-]Inf|NaN)"
HELP_RE = re.compile(rf"^# HELP ({_NAME}) ((?:[^\\\n]|\\\\|\\n)*)$")
TYPE_RE = re.compile(rf"^# TYPE ({_NAME}) (counter|gauge|histogram|summary|untyped)$")
SAMPLE_RE = re.compile(rf"^({_NAME})(\{{(?:{_LABEL}={_LABEL_VALUE}(?:,{_LABEL}={_LABEL_VALUE})*)?\}})? ({_VALUE})$")
PAIR_RE = re.compile(rf"({_LABEL})=({_LABEL_VALUE})")


def unescape(text: str) -> str:
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "\\": "\\", '"': '"'}[m.group(1)], text)


def parse(text: str) -> dict[str, dict]:
    """name -> {help, type, samples: {labels tuple: float}}; asserts every line is valid."""
    assert text.endswith("\n")
    families: dict[str, dict] = {}
    current: str | None = None
    for line in text[:-1].split("\n"):
        if m := HELP_RE.match(line):
            current = m.group(1)
            assert current not in families, f"family {current} twice"
            families[current] = {"help": unescape(m.group(2)), "type": None, "samples": {}}
        elif m := TYPE_RE.match(line):
            assert m.group(1) == current and families[current]["type"] is None
            families[current]["type"] = m.group(2)
        elif m := SAMPLE_RE.match(line):
            assert m.group(1) == current, f"sample {line!r} outside its family"
            labels = tuple((k, unescape(v[1:-1])) for k, v in PAIR_RE.findall(m.group(2) or ""))
            assert labels not in families[current]["samples"]
            families[current]["samples"][labels] = float(m.group(3))
        else:
            raise AssertionError(f"not a valid exposition line: {line!r}")
    return families


def test_render_parses_and_has_help_and_type() -> None:
    m = Metrics()
    msgs = m.counter("meshd_messages_received_total", "PUBLISH packets received", ["qos"])
    q1 = msgs.labels(qos="1")
    q1.inc()
    q1.inc(4)
    msgs.labels(qos="0").inc()
    conns = m.gauge("meshd_connections", "open client connections")
    conns.set(7)
    conns.dec()
    conns.inc(3)
    plain = m.counter("meshd_restarts_total", "restarts")
    fam = parse(m.render())
    assert fam["meshd_messages_received_total"] == {
        "help": "PUBLISH packets received",
        "type": "counter",
        "samples": {(("qos", "0"),): 1.0, (("qos", "1"),): 5.0},
    }
    assert fam["meshd_connections"]["type"] == "gauge"
    assert fam["meshd_connections"]["samples"] == {(): 9.0}
    assert fam["meshd_restarts_total"]["samples"] == {(): 0.0}
    assert plain.get() == 0 and q1.get() == 5


def test_labels_are_escaped_and_round_trip() -> None:
    m = Metrics()
    c = m.counter("weird_total", 'help with \\ backslash\nand newline "quotes"', ["a", "b"])
    nasty = 'x"y\\z\nw'
    c.labels(a=nasty, b="plain").inc()
    c.labels("ünï", "").inc(2)
    text = m.render()
    assert '\\"' in text and "\\\\" in text and "\\n" in text
    fam = parse(text)["weird_total"]
    assert fam["help"] == 'help with \\ backslash\nand newline "quotes"'
    assert fam["samples"] == {(("a", nasty), ("b", "plain")): 1.0, (("a", "ünï"), ("b", "")): 2.0}


def test_children_are_cached() -> None:
    m = Metrics()
    c = m.counter("c_total", "c", ["peer", "kind"])
    child = c.labels(peer="n1", kind="x")
    assert c.labels(peer="n1", kind="x") is child
    assert c.labels("n1", "x") is child  # positional, in labelnames order
    c.labels(kind="x", peer="n1").inc()
    assert child.get() == 1
    c.remove(peer="n1", kind="x")
    assert parse(m.render())["c_total"]["samples"] == {}


def test_counters_only_go_up() -> None:
    m = Metrics()
    c = m.counter("up_total", "u")
    lc = m.counter("upl_total", "u", ["x"]).labels(x="1")
    seen = []
    for step in (1, 0, 5, 2.5):
        c.inc(step)
        lc.inc(step)
        seen.append(parse(m.render())["up_total"]["samples"][()])
    assert seen == sorted(seen) and seen[-1] == 8.5
    with pytest.raises(ValueError):
        c.inc(-1)
    with pytest.raises(ValueError):
        lc.inc(-1)
    assert c.get() == 8.5 and lc.get() == 8.5
    assert not hasattr(c, "set") and not hasattr(c, "dec")


def test_labelled_parent_cannot_be_used_directly() -> None:
    m = Metrics()
    c = m.counter("p_total", "p", ["x"])
    g = m.gauge("pg", "p", ["x"])
    for call in (c.inc, g.inc, g.dec, lambda: g.set(1)):
        with pytest.raises(ValueError):
            call()
    with pytest.raises(ValueError):
        c.labels(y="1")
    with pytest.raises(ValueError):
        c.labels("1", "2")
    with pytest.raises(ValueError):
        m.counter("q_total", "q").labels(x="1")
    with pytest.raises(ValueError):
        c.labels(x="1").labels(x="2")


@pytest.mark.parametrize("name", ["", "1abc", "a-b", "a b", "é"])
def test_metric_names_validated(name: str) -> None:
    with pytest.raises(ValueError):
        Metrics().counter(name, "h")


@pytest.mark.parametrize("labels", [["a-b"], ["__reserved"], ["1x"], ["a", "a"]])
def test_label_names_validated(labels: list[str]) -> None:
    with pytest.raises(ValueError):
        Metrics().gauge("g", "h", labels)


def test_labelnames_must_not_be_a_string() -> None:
    with pytest.raises(TypeError):
        Metrics().gauge("g", "h", "qos")


def test_duplicate_names_rejected() -> None:
    m = Metrics()
    m.counter("dup", "h")
    with pytest.raises(ValueError):
        m.gauge("dup", "h")
    with pytest.raises(ValueError):
        m.gauge_callback("dup", "h", lambda: 1)


def test_callback_gauges_read_at_render_time() -> None:
    m = Metrics()
    sessions = {"a", "b"}
    m.gauge_callback("meshd_sessions", "sessions", lambda: len(sessions))
    members = {"alive": 3, "suspect": 1}
    m.gauge_callback("meshd_members", "members by state", lambda: dict(members), labelnames=["state"])
    sent = [10]
    m.counter_callback("meshd_gossip_sent_total", "gossip packets sent", lambda: sent[0])
    fam = parse(m.render())
    assert fam["meshd_sessions"]["samples"] == {(): 2.0}
    assert fam["meshd_members"]["samples"] == {(("state", "alive"),): 3.0, (("state", "suspect"),): 1.0}
    assert fam["meshd_gossip_sent_total"]["type"] == "counter"
    sessions.add("c")
    members["dead"] = 2
    sent[0] = 12
    fam = parse(m.render())
    assert fam["meshd_sessions"]["samples"] == {(): 3.0}
    assert fam["meshd_members"]["samples"][(("state", "dead"),)] == 2.0
    assert fam["meshd_gossip_sent_total"]["samples"] == {(): 12.0}


def test_failing_callback_does_not_break_render(caplog) -> None:
    caplog.set_level(logging.ERROR, logger="mesh.metrics")
    m = Metrics()
    m.gauge_callback("bad", "raises", lambda: 1 / 0)
    not_a_number: Callable[[], Any] = lambda: "x"  # a buggy callback, as the type checker cannot see
    m.gauge_callback("nan_like", "not a number", not_a_number)
    m.gauge("good", "fine").set(1)
    fam = parse(m.render())
    assert fam["bad"]["samples"] == {} and fam["nan_like"]["samples"] == {}
    assert fam["good"]["samples"] == {(): 1.0}
    assert "bad" in caplog.text


def test_special_values() -> None:
    m = Metrics()
    g = m.gauge("g", "g", ["k"])
    g.labels(k="inf").set(math.inf)
    g.labels(k="ninf").set(-math.inf)
    g.labels(k="nan").set(math.nan)
    g.labels(k="big").set(1e300)
    g.labels(k="small").set(-0.125)
    g.labels(k="bool").set(True)
    text = m.render()
    assert 'g{k="inf"} +Inf' in text and 'g{k="ninf"} -Inf' in text and 'g{k="nan"} NaN' in text
    samples = parse(text)["g"]["samples"]
    assert samples[(("k", "big"),)] == 1e300 and samples[(("k", "small"),)] == -0.125
    assert samples[(("k", "bool"),)] == 1.0


def test_empty_registry_renders_nothing() -> None:
    assert Metrics().render() == ""


async def test_metrics_route_over_http() -> None:
    m = Metrics()
    c = m.counter("hits_total", "hits")
    router = Router()
    add_metrics_route(router, m)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(lambda task_status: serve_http(router, "127.0.0.1", 0, task_status=task_status))
        c.inc(3)
        status, body = await trio.to_thread.run_sync(lambda: request_json(f"127.0.0.1:{port}", "GET", "/metrics"))
        assert status == 200 and parse(body)["hits_total"]["samples"] == {(): 3.0}
        host_port = ("127.0.0.1", port)
        stream = await trio.open_tcp_stream(*host_port)
        async with stream:
            await stream.send_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            raw = b""
            while chunk := await stream.receive_some(65536):
                raw += chunk
        assert f"content-type: {CONTENT_TYPE}".encode() in raw.lower()
        nursery.cancel_scope.cancel()
