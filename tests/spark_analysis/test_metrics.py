"""Each metric on the hand-built scenario (see scenario.py for the worked answers)."""

from __future__ import annotations

import pytest
from pyspark.testing import assertDataFrameEqual

from gossip.trace import trace_record
from spark_analysis import dissemination, failures, lifetimes, partitions, summary
from spark_analysis.load import load_traces
from spark_analysis.stats import Method, choose_method, pct
from spark_analysis.summary import counts_percentile, dissemination_summary

from .conftest import write_traces

pytestmark = pytest.mark.spark
S = 1_000_000
EXACT = Method(exact=True, largest_group=0)


@pytest.fixture(scope="module")
def frames(spark, scenario_dir):
    traces = load_traces(spark, [str(scenario_dir)]).traces
    life = lifetimes.node_lifetimes(traces).cache()
    obs = dissemination.observations(traces, life).cache()
    heads = dissemination.alive_counts(traces, life).cache()
    return {"traces": traces, "life": life, "obs": obs, "heads": heads}


def test_lifetimes_and_crashes(spark, frames):
    expected = spark.createDataFrame(
        [
            ("a", 0, 0, 80 * S, "node_stop", 80 * S, None),
            ("b", 0, 0, 80 * S, "node_stop", 80 * S, None),
            ("c", 0, 0, 80 * S, "node_stop", 80 * S, None),
            ("d", 0, 0, 30 * S, "node_crash", 30 * S, None),
        ],
        "node string, life int, start_ts_us long, end_ts_us long, end_kind string, last_ts_us long, "
        "restart_ts_us long",
    )
    assertDataFrameEqual(frames["life"].drop("records"), expected)


def test_event_table_coverage_times(spark, frames):
    third = 1 / 3
    expected = spark.createDataFrame(
        [
            ("E1", "broadcast", "a", 10 * S, 4, 4, 1.0, True, 0.5, 2.0, 2.0, 2.0, 2),
            ("E2", "route_add", "b", 20 * S, 4, 3, 0.75, False, 0.2, None, None, None, 1),
            ("S1", "member_suspect", "c", 31 * S, 3, 3, 1.0, True, 0.5, 1.0, 1.0, 1.0, 1),
            ("D1", "member_dead", "c", 35 * S, 3, 3, 1.0, True, 1.0, 2.0, 2.0, 2.0, 1),
            ("E3", "config_set", "a", 40 * S, 3, 3, 1.0, True, 0.3, 0.9, 0.9, 0.9, 1),
            ("D2", "member_dead", "b", 50 * S, 3, 2, 2 * third, False, 0.5, None, None, None, 1),
            ("A1", "member_alive", "c", 51 * S, 3, 3, 1.0, True, 0.2, 0.4, 0.4, 0.4, 1),
            ("S2", "member_suspect", "a", 58 * S, 3, 1, third, False, None, None, None, None, 0),
        ],
        "event_id string, kind string, origin string, origin_ts_us long, alive_nodes long, "
        "observed_nodes long, coverage double, full_coverage boolean, t50_s double, "
        "t90_s double, t99_s double, t100_s double, max_hops long",
    )
    events = dissemination.event_table(dissemination.delay_arrays(frames["obs"], frames["heads"]))
    assertDataFrameEqual(events, expected)


def test_dissemination_summary_medians_and_hops(spark, frames):
    events = dissemination.event_table(dissemination.delay_arrays(frames["obs"], frames["heads"]))
    s = dissemination_summary(events, frames["obs"], EXACT)
    assert s["events"] == 8 and s["full_coverage_ratio"] == 0.625
    # over all 8 events, never reaching a level counted as infinitely slow:
    # t50 .2 .2 .3 .5 .5 .5 1 never; t90/t99 .4 .9 1 2 2 never never never.
    assert (s["t50_s_median"], s["t90_s_median"], s["t99_s_median"]) == (0.5, 2.0, 2.0)
    assert s["t100_s"] == {"p50": 1.0, "p90": 2.0, "p99": 2.0, "max": 2.0}
    # 22 observations: 8 at hop 0, 13 at hop 1, 1 at hop 2; linear p99 = 1 + 0.79.
    assert s["hops"] == {"p50": 1.0, "p99": 1.79}
    assert s["by_kind"]["member_dead"]["t50_s_median"] == 0.75
    assert s["by_kind"]["broadcast"]["hops"] == {"p50": 1.0, "p99": 1.97}
    assert s["by_kind"]["route_add"]["t100_s"]["p50"] is None
    assert set(s["by_kind"]) == {
        "broadcast", "route_add", "config_set", "member_suspect", "member_dead", "member_alive",
    }


def test_detection_of_the_crash(spark, frames):
    crashed = lifetimes.crashes(frames["life"])
    det = failures.detection(frames["traces"], frames["life"], crashed)
    expected = spark.createDataFrame(
        [("d", 30 * S, "node_crash", None, 1.0, 7.0, 3, 3)],
        "member string, crash_ts_us long, source string, restart_ts_us long, first_suspect_s double, "
        "all_dead_s double, observers long, declared long",
    )
    assertDataFrameEqual(det, expected)


def test_false_positive_is_the_declaration_of_a_live_member(spark, frames):
    episodes = partitions.partition_episodes(frames["traces"])
    classified = failures.declarations(frames["traces"], frames["life"], episodes)
    fp = failures.false_positives(classified)
    expected = spark.createDataFrame(
        [("c", "b", 50 * S, "D2", 51 * S)],
        "member string, declared_by string, ts_us long, event_id string, active_ts_us long",
    )
    assertDataFrameEqual(fp, expected)


EPISODE = (
    "node string, subject string, peers string, majority boolean, detected_ts_us long, healed_ts_us long, "
    "detection_s double, suspect_to_dead_s double, heal_s double, split_s double, within_bound boolean, revisions long"
)


def test_partition_episode(spark, frames):
    # an older writer: no took_us, so detection and heal come from the traces
    episodes = partitions.partition_episodes(frames["traces"])
    # (a's death of c at 50.5 came before its suspicion at 58: no suspect-to-dead)
    expected = spark.createDataFrame([("a", "c", "c", None, 60 * S, 70 * S, 2.0, None, 10.0, 10.0, None, 0)], EPISODE)
    assertDataFrameEqual(episodes, expected)


def test_partition_episodes_from_detector_records(spark, tmp_path):
    def rec(node: str, kind: str, t: float, pid: str, **extra) -> dict:
        return trace_record(ts_us=round(t * S), node=node, kind=kind, subject=pid, **extra)

    recs = [
        # x suspected y at 6 and held it dead at 9.5 (3.5 s: within 4 + 3); y took 9 s
        rec("x", "member_suspect", 6, "y"), rec("x", "member_dead", 9.5, "y"),
        rec("y", "member_suspect", 4, "x"), rec("y", "member_dead", 13, "x"),
        rec("x", "member_suspect", 56, "y"), rec("x", "member_dead", 59, "y"),
        # x (majority) lost y: 4.5 s after onset
        rec("x", "partition_detected", 10, "x/1", peers="y", majority=True, took_us=4_500_000, suspicion_us=4 * S),
        # y (minority) lost x: 9 s, beyond 4 + 3
        rec("y", "partition_detected", 14, "y/1", peers="x", majority=False, took_us=9 * S, suspicion_us=4 * S),
        rec("x", "partition_healed", 40, "x/1", peers="y", took_us=500_000),
        rec("y", "partition_healed", 40.2, "y/1", peers="x", took_us=700_000),
        # a second split at x, never healed
        rec("x", "partition_detected", 60, "x/2", peers="y", majority=True, took_us=5 * S, suspicion_us=4 * S),
    ]
    traces = load_traces(spark, [str(write_traces(tmp_path, recs))]).traces
    episodes = partitions.partition_episodes(traces)
    expected = spark.createDataFrame(
        [
            ("x", "x/1", "y", True, 10 * S, 40 * S, 4.5, 3.5, 0.5, 30.0, True, 0),
            ("y", "y/1", "x", False, 14 * S, 40_200_000, 9.0, 9.0, 0.7, 26.2, False, 0),
            ("x", "x/2", "y", True, 60 * S, None, 5.0, 3.0, None, None, True, 0),
        ],
        EPISODE,
    )
    assertDataFrameEqual(episodes, expected, rtol=1e-9)
    s = summary.partition_summary(episodes, EXACT)
    assert (s["count"], s["healed"], s["within_bound"]) == (3, 2, "2/3")
    assert s["by_side"]["majority"]["detection_s_max"] == 5.0 and s["by_side"]["minority"]["within_bound"] == "0/1"
    assert s["heal_s_max"] == 0.7 and s["list"][0]["peers"] == "y"
    assert s["by_side"]["minority"]["suspect_to_dead_s_max"] == 9.0


def test_per_node_lag(spark, frames):
    lag = dissemination.per_node_lag(frames["obs"], EXACT)
    expected = spark.createDataFrame(
        [
            ("a", 5, 0.5, 0.98, 1.0),  # .2 .2 .5 .5 1.0
            ("b", 5, 0.5, 1.96, 2.0),  # .3 .4 .5 1 2
            ("c", 3, 0.9, 0.998, 1.0),  # .4 .9 1
            ("d", 1, 2.0, 2.0, 2.0),
        ],
        "node string, observations long, lag_p50_s double, lag_p99_s double, lag_max_s double",
    )
    assertDataFrameEqual(lag, expected)


def test_real_traces_infer_crashes_from_silence(spark, tmp_path):
    recs = [trace_record(ts_us=0, node=n, kind="node_start", subject=n) for n in "xyz"]
    recs.append(trace_record(ts_us=10 * S, node="x", kind="broadcast"))  # then silence
    recs.append(trace_record(ts_us=100 * S, node="y", kind="broadcast"))
    recs.append(trace_record(ts_us=98 * S, node="z", kind="broadcast"))  # inside the grace
    traces = load_traces(spark, [str(write_traces(tmp_path, recs))]).traces
    life = lifetimes.node_lifetimes(traces, crash_grace_us=5 * S)
    got = {r["node"]: (r["end_ts_us"], r["end_kind"]) for r in life.collect()}
    assert got == {"x": (10 * S, "inferred_crash"), "y": (None, None), "z": (None, None)}


def test_percentiles_switch_to_approx_above_the_limit(spark):
    df = spark.createDataFrame([(float(i),) for i in range(1, 11)], "v double")
    exact = choose_method(df, limit=10)
    approx = choose_method(df, limit=9)
    assert exact.exact and not approx.exact and approx.largest_group == 10
    assert approx.as_json()["accuracy"] == 10_000 and approx.as_json()["method"] == "approx"
    row = df.agg(pct("v", 0.5, exact).alias("e"), pct("v", 0.5, approx).alias("a")).first()
    assert row["e"] == 5.5  # linear interpolation between 5 and 6
    assert row["a"] == 5.0  # percentile_approx returns a value of the data


def test_counts_percentile_matches_linear_interpolation():
    # 0 x8, 1 x13, 2 x1 (the scenario's hops): same as numpy.percentile(..., "linear").
    hist = [(1, 13), (0, 8), (2, 1)]
    assert counts_percentile(hist, 0.5) == 1.0
    assert counts_percentile(hist, 0.99) == pytest.approx(1.79)
    assert counts_percentile([(5, 1)], 0.99) == 5.0
    assert counts_percentile([], 0.5) is None


def test_event_older_than_every_trace_has_no_alive_nodes(spark, tmp_path):
    # x's traces begin at 10 s (older files rotated away); the event was made at 5 s by
    # a node whose traces are missing. Nobody was provably alive then: no coverage,
    # and no division by zero under Spark's ANSI mode.
    recs = [
        trace_record(ts_us=10 * S, node="x", kind="broadcast", origin="y", origin_ts_us=5 * S,
                     event_id="old", hops=1),
        trace_record(ts_us=20 * S, node="x", kind="broadcast", event_id="new"),
    ]
    traces = load_traces(spark, [str(write_traces(tmp_path, recs))]).traces
    life = lifetimes.node_lifetimes(traces)
    heads = dissemination.alive_counts(traces, life)
    events = dissemination.event_table(
        dissemination.delay_arrays(dissemination.observations(traces, life, heads), heads)
    )
    got = {r["event_id"]: (r["alive_nodes"], r["observed_nodes"], r["coverage"], r["t100_s"])
           for r in events.collect()}
    assert got == {"old": (0, 0, None, None), "new": (1, 1, 1.0, 0.0)}
