"""Tests of the harness itself: python -m pytest -q scripts/bench

The generator's byte tricks are checked against the project's decoder; one short run
against a real meshd proves the pieces fit (no timing is asserted).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
for p in (str(HERE), str(HERE.parents[1])):
    if p not in sys.path:
        sys.path.insert(0, p)

import brokers  # noqa: E402
import loadgen  # noqa: E402
import table  # noqa: E402
import wire  # noqa: E402
from mqtt import Decoder, Puback, Publish, encode  # noqa: E402

PAYLOAD = bytes([0xA5]) * 64


def _decode_all(data: bytes, role: str = "client") -> list:
    d = Decoder(role=role)
    if role == "server":  # a server decoder insists on CONNECT first
        data = wire.connect_packet("t") + data
    d.feed(data)
    return list(d.packets())[1 if role == "server" else 0:]


def test_qos1_batch_is_valid_publishes_with_consecutive_ids_that_wrap() -> None:
    t = wire.PublishTemplate("bench/in/007", PAYLOAD, 1)
    t.next_pid = 65534
    packets = _decode_all(t.batch(4), role="server")
    assert [p.packet_id for p in packets] == [65534, 65535, 1, 2]
    assert all(p.topic == "bench/in/007" and p.payload == PAYLOAD and p.qos == 1 for p in packets)


def test_stamped_payload_replaces_only_the_head() -> None:
    for qos in (0, 1):
        t = wire.PublishTemplate("bench/lat", PAYLOAD, qos)
        (p,) = _decode_all(t.stamped(b"\x01\x02\x03"), role="server")
        assert p.payload == b"\x01\x02\x03" + PAYLOAD[3:]


def test_subscriber_counts_and_acks_every_split_like_the_decoder() -> None:
    pubs = [Publish(topic="bench/x", payload=PAYLOAD, qos=1, packet_id=i) for i in (1, 300, 65535, 7)]
    data = b"".join(encode(p, 4) for p in pubs)
    size = wire.publish_frame_size("bench/x", 64, 1)
    for cut in range(1, len(data)):
        s = wire.SubscriberStream(size, 1, 64)
        acks = s.feed(data[:cut]) + s.feed(data[cut:])
        assert s.received == 4
        assert [a.packet_id for a in _decode_all(acks, role="server")] == [1, 300, 65535, 7]


def test_subscriber_falls_back_to_frames_on_mixed_packets() -> None:
    size = wire.publish_frame_size("bench/x", 64, 0)
    data = encode(Publish(topic="bench/x", payload=PAYLOAD), 4) + b"\xd0\x00" + encode(Publish(topic="a/longer/topic", payload=b"z"), 4)
    s = wire.SubscriberStream(size, 0, 64)
    assert s.feed(data) == b""
    assert (s.received, s.other) == (2, 1)


def test_ack_stream_counts_pubacks_split_anywhere() -> None:
    data = b"".join(encode(Puback(packet_id=i), 4) for i in (0x4002, 2, 3))
    for cut in range(len(data) + 1):
        a = wire.AckStream()
        a.feed(data[:cut])
        a.feed(data[cut:])
        assert a.acked == 3


def test_table_medians_ranges_and_ratios() -> None:
    recs = [
        {"broker": b, "scenario": "fanout-qos0", "rep": i, "result": {"msgs_per_s": v, "lost": 0}}
        for b, vals in (("meshd", (300, 100, 200)), ("amqtt", (10, 20, 30)))
        for i, v in enumerate(vals)
    ]
    recs.append({"broker": "amqtt", "scenario": "fanout-qos0", "rep": 3, "error": "boom"})
    stats = table.summarise(recs)
    assert stats[("fanout-qos0", "meshd", "msgs_per_s")] == (200, 100, 300, 3)
    md = table.markdown(recs)
    assert "200 [100..300]" in md and "10.00×" in md and "boom" in md


def test_short_runs_against_a_real_meshd() -> None:
    brokers.raise_fd_limit()
    b = brokers.start(brokers.BROKERS["meshd"], Path(tempfile.mkdtemp()), pin=False)
    try:
        r = loadgen.throughput(b.port, b.pid, publishers=3, subscribers=2, qos=1, duration=0.3, drain_s=1.0)
        assert r["delivered"] == r["expected"] == 2 * r["published"] > 0
        assert r["lost"] == 0 and r["puback_missing"] == 0
        lat = loadgen.latency(b.port, b.pid, qos=1, rate=500, duration=0.3, warmup=0.1)
        assert lat["lost"] == 0 and lat["samples"] > 0 and lat["p50_us"] <= lat["max_us"]
        idle = loadgen.idle_connections(b.port, b.pid, count=50, settle=0.1)
        assert idle["connected"] == 50
    finally:
        assert b.stop() is not None


def test_persistent_subscriber_gets_everything_sent_while_offline() -> None:
    import persistence
    b = brokers.start(brokers.BROKERS["meshd"], Path(tempfile.mkdtemp()), pin=False,
                      extra=persistence.meshd_flags("batch"))
    try:
        r = persistence.offline_then_online(b.port, b.pid, 300, persistent=True)
        assert r["acked"] == r["published"] == 300 and r["session_present"]
        assert r["delivered"] == 300 and r["lost"] == 0 and r["drain_per_s"] > 0
        # the queue was taken: a second reconnect finds the session with nothing left
        assert persistence.drain(b.port, 1)[0] == 0
    finally:
        assert b.stop() is not None


def test_clean_subscriber_keeps_nothing_but_publishes_are_acked() -> None:
    import persistence
    b = brokers.start(brokers.BROKERS["meshd"], Path(tempfile.mkdtemp()), pin=False)
    try:
        r = persistence.offline_then_online(b.port, b.pid, 200, persistent=False)
        assert r["acked"] == 200 and "delivered" not in r
        received, _, present = persistence.drain(b.port, 1)
        assert (received, present) == (0, False)
    finally:
        assert b.stop() is not None


def test_cross_node_run_forwards_every_qos1_message() -> None:
    import cluster
    brokers.raise_fd_limit()
    a, b, http_a = cluster.start_pair(Path(tempfile.mkdtemp()), pin=False)
    try:
        r = loadgen.throughput(a.port, [a.pid, b.pid], sub_port=b.port, publishers=3, subscribers=1, qos=1,
                               topics="per-publisher", duration=0.3, drain_s=1.0,
                               before_publish=lambda: cluster.wait_for_route(http_a, "B"))
        assert r["delivered"] == r["expected"] == r["published"] > 0
        assert r["lost"] == 0 and r["puback_missing"] == 0
    finally:
        assert b.stop() is not None and a.stop() is not None


def test_table_reads_nested_metrics_and_skips_the_header(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    lines = [{"kind": "header", "machine": {}},
             {"broker": "meshd", "scenario": "cross-qos1", "rep": 0,
              "result": {"ratio": 0.5, "cross": {"broker_cpu_pct": 70.0}, "single": {}}}]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    recs = table.load([str(path)])
    assert len(recs) == 1
    stats = table.summarise(recs)
    assert stats[("cross-qos1", "meshd", "cross.broker_cpu_pct")] == (70.0, 70.0, 70.0, 1)
    assert ("cross-qos1", "meshd", "single.broker_cpu_pct") not in stats


def test_acked_messages_for_an_offline_session_survive_kill_9() -> None:
    import persistence
    r = persistence.killed_and_restarted(Path(tempfile.mkdtemp()), persistence.meshd_flags("sync"), 300, "sync")
    assert r["acked"] == 300 and r["session_present"]
    assert r["delivered"] == 300 and r["lost"] == 0


def _run_lines(commit: str, msgs_per_s: int) -> list[str]:
    header = {"kind": "header", "machine": {"cpu": "test"}, "source": {"commit": commit, "dirty": []}}
    run = {"broker": "meshd", "scenario": "fanout-qos0", "rep": 0, "result": {"msgs_per_s": msgs_per_s, "lost": 0}}
    return [json.dumps(header), json.dumps(run)]


def test_table_reads_raw_lines_back_out_of_markdown(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    newer, older = _run_lines("bbbbbbb", 123_456), _run_lines("aaaaaaa", 7_654)
    text = "\n".join([
        "# Results", "", "## Newer run", "", "```sh", "# a comment, not a heading", "```", "",
        "<details><summary>raw lines (1 run)</summary>", "", "```jsonl", *newer, "```", "", "</details>", "",
        "### a note under it", "", "## Older run", "", "```jsonl", *older, "```", "",
    ])
    md = tmp_path / "RESULTS.md"
    md.write_text(text)

    assert table.markdown_blocks(text, "older") == older
    assert table.markdown_blocks(text, "NEWER") == newer  # case-insensitive; the ```sh line is no heading
    assert table.markdown_blocks(text) == newer + older
    assert [r["result"]["msgs_per_s"] for r in table.load([str(md)], section="newer")] == [123_456]

    assert table.main([str(md), "--section", "newer run"]) == 0
    out = capsys.readouterr().out
    assert "123,456" in out and "7,654" not in out
    assert table.main([str(md), "--section", "older", "--raw"]) == 0
    assert capsys.readouterr().out.splitlines() == older  # the lines as written, header included
    assert table.main([str(md)]) == 0  # two commits: never merged, one table each
    out = capsys.readouterr().out
    assert "### meshd at bbbbbbb" in out and "### meshd at aaaaaaa" in out
    assert out.index("123,456") < out.index("### meshd at aaaaaaa") < out.index("7,654")


def test_results_md_keeps_parseable_raw_lines_that_rebuild_its_tables() -> None:
    text = (HERE / "RESULTS.md").read_text()
    lines = table.markdown_blocks(text)
    records = [json.loads(line) for line in lines]  # every ```jsonl line is one JSON object
    assert any(r.get("kind") == "header" for r in records)
    for heading in table.markdown_headings(text):
        for records_of_variant in table.by_variant(table.load_runs_from_text(text, heading)).values():
            table.markdown(records_of_variant)
    # the three-broker table is exactly what table.py makes of the lines under it
    full = table.load_runs_from_text(text, "full run")
    assert len(full) == 1 and full[0][0]["source"]["commit"] == "f1f811a"
    assert table.markdown(full[0][1]) in text
