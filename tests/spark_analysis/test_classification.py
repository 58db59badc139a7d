"""The classification table (spark_analysis/README.md, "Classification") on synthetic
real-style traces whose truth is known: restarts that write ``member_alive`` before
``node_start``, a graceful leave, partitions with and without a crash, clocks skewed
between nodes, and a member whose traces are missing."""

from __future__ import annotations

import pytest

from gossip.trace import trace_record
from spark_analysis import failures, lifetimes, partitions, summary
from spark_analysis.load import load_traces

from .conftest import write_traces

pytestmark = pytest.mark.spark
S = 1_000_000
END = 100.0
SKEW = {"g": +1.5, "h": -1.5}  # these nodes' clocks run ahead / behind


def rec(node: str, t: float, kind: str, **kw) -> dict:
    return trace_record(ts_us=round((t + SKEW.get(node, 0.0)) * S), node=node, kind=kind, **kw)


def dead(eid: str, by: str, member: str, t: float) -> dict:
    t_us = round((t + SKEW.get(by, 0.0)) * S)
    return trace_record(ts_us=t_us, node=by, kind="member_dead", subject=member, origin=by,
                        origin_ts_us=t_us, event_id=eid, hops=0)


def heartbeat(node: str, start: float, stop: float) -> list[dict]:
    times = [float(t) for t in range(int(start), int(stop), 5)] + [stop]
    return [rec(node, t, "broadcast", event_id=f"{node}{t}") for t in times]


def _traces() -> list[dict]:
    r: list[dict] = [rec(n, 0, "node_start", subject=n) for n in "abcdefgh"]
    for n in "abch":  # run to the end
        r += heartbeat(n, 1, END)
    # d is killed at 20 (no record says so) and restarted at 40: its gossip machine's
    # own alive is stamped just before the node_start
    r += heartbeat(d := "d", 1, 19)
    r += [rec(d, 19.9, "broadcast", event_id="d-last"), rec(d, 39.999, "member_alive", subject=d, origin=d),
          rec(d, 40, "node_start", subject=d)] + heartbeat(d, 41, END)
    r += heartbeat("e", 1, 30)  # e is killed at 30 and never returns
    r += heartbeat("f", 1, 49) + [rec("f", 50, "node_stop", subject="f")]  # f leaves gracefully
    r += heartbeat("g", 1, 60)  # g (clock +1.5 s) is killed at 60
    # a partition a | c from 58 to 75, detected by a at 65 (onset 60); c stays up
    r += [rec("a", 65, "partition_detected", subject="a/1", peers="c,e", majority=True, took_us=5 * S),
          rec("a", 75, "partition_healed", subject="a/1", peers="c,e", took_us=S)]
    r += [
        dead("R", "a", "d", 27),  # d was down, came back: restart
        dead("T", "b", "e", 36),  # e never came back: true detection
        dead("PC", "a", "e", 62),  # across the partition, but e had crashed: true detection
        dead("L", "a", "f", 55),  # f had left: leave
        dead("P", "a", "c", 63),  # c alive, across a's partition: partition detection
        dead("F", "b", "a", 80),  # a alive and reachable: false positive
        dead("G", "a", "g", 60.5),  # g's last line (its clock) is at 61.5: still a detection
        dead("H", "b", "h", 70),  # h (clock -1.5 s) alive throughout: false positive
        dead("Z", "b", "z", 70),  # z wrote no traces at all: unverified
    ]
    return r


EXPECTED = {"R": "restart", "T": "true_detection", "PC": "true_detection", "L": "leave", "P": "partition",
            "F": "false_positive", "G": "true_detection", "H": "false_positive", "Z": "unverified"}


@pytest.fixture(scope="module")
def frames(spark, tmp_path_factory):
    traces = load_traces(spark, [str(write_traces(tmp_path_factory.mktemp("classes"), _traces()))]).traces
    life = lifetimes.node_lifetimes(traces).cache()
    episodes = partitions.partition_episodes(traces).cache()
    return traces, life, episodes


def test_each_declaration_gets_its_class(frames):
    traces, life, episodes = frames
    classified = failures.declarations(traces, life, episodes)
    got = {r["event_id"]: r["class"] for r in classified.collect()}
    assert got == EXPECTED
    s = summary.declaration_summary(classified)
    assert s["by_class"] == {"true_detection": 3, "restart": 1, "leave": 1, "partition": 1,
                             "false_positive": 2, "unverified": 1}
    fp = {(r["event_id"], r["member"]) for r in failures.false_positives(classified).collect()}
    assert fp == {("F", "a"), ("H", "h")}


def test_a_restart_is_a_new_life_and_its_crash_is_detected(frames):
    traces, life, _ = frames
    lives = {(r["node"], r["life"]): (r["start_ts_us"], r["end_ts_us"], r["end_kind"], r["restart_ts_us"])
             for r in life.collect()}
    # the member_alive written just before node_start opens the new life
    assert lives[("d", 0)] == (0, 19_900_000, "inferred_crash", 39_999_000)
    assert lives[("d", 1)] == (39_999_000, None, None, None)
    assert lives[("e", 0)][1:3] == (30 * S, "inferred_crash") and lives[("f", 0)][2] == "node_stop"
    assert len(lives) == 9
    det = failures.detection(traces, life, lifetimes.crashes(life))
    got = {r["member"]: (r["crash_ts_us"], r["restart_ts_us"], r["declared"]) for r in det.collect()}
    # d: a declared it dead while it was down; nobody else did
    assert got["d"] == (19_900_000, 39_999_000, 1) and got["e"][2] == 2 and got["g"][0] == 61_500_000
