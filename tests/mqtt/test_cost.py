"""The codec's cost grows with the packet's size, not faster (issue 21, item 8).

Counted, not timed: the number of Python lines the decoder runs (sys.settrace) is the
same on every machine and under any load. A client can fill a CONNECT with thousands
of user properties; their cost per property must stay a small constant, so that such
a CONNECT costs about what any other packet of its size costs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import FrameType
from typing import Any

import native
from mqtt import Connect, Decoder, Properties, encode

REPO = Path(__file__).resolve().parents[2]

MQTT_PACKAGE = Decoder.__module__.split(".")[0]


def lines_run(data: bytes) -> int:
    """Lines of the mqtt package run to decode `data` (one CONNECT) on a server, counted
    in the pure-Python build (compiled code runs no Python lines: where this process has
    the mypyc-compiled codec, a MESHD_PURE_PYTHON=1 process counts them)."""
    if native.status().compiled:
        return _lines_run_pure(data)
    return _lines_run_here(data)


def _lines_run_pure(data: bytes) -> int:
    code = (
        "import sys; from tests.mqtt.test_cost import _lines_run_here; "
        "print(_lines_run_here(sys.stdin.buffer.read()))"
    )
    env = dict(os.environ, MESHD_PURE_PYTHON="1", PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-c", code], input=data, env=env, cwd=REPO,
                         capture_output=True, check=True)
    return int(out.stdout)


def _lines_run_here(data: bytes) -> int:
    count = 0

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal count
        if frame.f_globals.get("__name__", "").split(".")[0] != MQTT_PACKAGE:
            return None
        if event == "line":
            count += 1
        return tracer

    decoder = Decoder(role="server")
    sys.settrace(tracer)
    try:
        decoder.feed(data)
        packet = decoder.next_packet()
    finally:
        sys.settrace(None)
    assert isinstance(packet, Connect)
    return count


def connect_with_user_properties(n: int) -> bytes:
    props = Properties(user_properties=tuple((f"k{i}", "v") for i in range(n)))
    return encode(Connect(client_id="c", clean_start=True, keep_alive=0, protocol_level=5, properties=props), 5)


def test_user_properties_cost_a_few_lines_each_and_grow_linearly():
    base = lines_run(connect_with_user_properties(1))
    n1000 = lines_run(connect_with_user_properties(1000)) - base
    n5000 = lines_run(connect_with_user_properties(5000)) - base
    # Linear: five times the properties, five times the work (within rounding).
    assert abs(n5000 - 5 * n1000) <= n5000 // 100, (n1000, n5000)
    # A small constant per property: the strings of the whole section are decoded in
    # one call, each property is only sliced out (11 lines; before issue 21, 40).
    assert n5000 / 5000 <= 12, n5000 / 5000


def test_a_large_client_id_costs_no_more_than_a_small_one():
    small = lines_run(encode(Connect(client_id="c", clean_start=True, keep_alive=0, protocol_level=5), 5))
    large = lines_run(encode(Connect(client_id="x" * 65000, clean_start=True, keep_alive=0, protocol_level=5), 5))
    assert large <= small + 30, (small, large)  # a longer remaining length, nothing per byte


def test_many_user_properties_decode_to_the_same_pairs():
    pairs = tuple((f"k{i}", "vé" * (i % 3)) for i in range(300)) + (("", ""), ("k", "v"), ("k", "v"))
    data = encode(Connect(client_id="c", clean_start=True, keep_alive=0, protocol_level=5,
                          properties=Properties(user_properties=pairs, session_expiry_interval=5)), 5)
    decoder = Decoder(role="server")
    decoder.feed(data)
    packet = decoder.next_packet()
    assert isinstance(packet, Connect)
    assert packet.properties.user_properties == pairs
    assert packet.properties.session_expiry_interval == 5
