"""Deterministic simulations: detection bound, no false positives, full broadcast
reach, Lifeguard against slow members, partitions, traces."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest

from clock import ManualClock
from gossip.events import MemberChanged, SwimEvent
from simulation.cli import run_to, simulate_main
from tests.support import meshd_command, subprocess_env
from simulation.membership import SimParams, Simulation, parse_partition
from gossip.trace import TRACE_FIELDS, TRACE_KINDS


def test_crashed_node_marked_dead_everywhere_within_the_formula_bound() -> None:
    sim = Simulation(SimParams(nodes=100, seconds=75, loss=0.05, crash=1, crash_at=10.0, seed=11))
    r = sim.run()
    bound = sim.dead_bound()
    (victim,) = r.crashed
    seen = r.dead_seen[victim]
    assert len(seen) == 99  # every live node
    detection = r.crash_detection()
    assert max(detection) <= bound
    # and not faster than the minimum suspicion timeout allows
    assert min(detection) >= 8.0
    assert r.false_dead == 0


def test_ten_virtual_minutes_lossy_no_false_dead_every_broadcast_everywhere() -> None:
    # broadcasts stop 100 s before the end: time for push-pull (every 90 s at 100
    # members) to hand over whatever the epidemic missed
    p = SimParams(nodes=100, seconds=600, loss=0.05, broadcasts_per_s=0.25, broadcast_stop_before_end=100.0, seed=5)
    r = Simulation(p).run()
    assert r.false_dead == 0
    assert len(r.broadcasts) > 100
    assert r.broadcast_coverage == 1.0
    assert sorted(r.broadcast_latencies)[int(0.99 * len(r.broadcast_latencies))] < 2.0


def test_lifeguard_cuts_false_suspicions_caused_by_slow_members() -> None:
    common = dict(nodes=100, seconds=120, loss=0.05, stall=0.1, seed=3)
    on = Simulation(SimParams(**common, lifeguard=True)).run()
    off = Simulation(SimParams(**common, lifeguard=False)).run()
    # measured with this seed: 0 with Lifeguard, 54 without
    assert off.false_suspicions >= 20
    assert off.false_suspicions >= 10 * max(on.false_suspicions, 1)
    assert on.false_dead == 0


def test_udp_loss_alone_accuses_nobody() -> None:
    # 5 % loss, no slow members: indirect probes and the TCP fallback cover it
    r = Simulation(SimParams(nodes=100, seconds=120, loss=0.05, seed=3)).run()
    assert r.false_suspicions == 0 and r.suspicions_of_live == 0 and r.false_dead == 0


def test_same_seed_same_run() -> None:
    p = SimParams(nodes=40, seconds=30, loss=0.1, crash=2, crash_at=5, broadcasts_per_s=1, stall=0.1, seed=9)
    a, b = Simulation(p).run(), Simulation(p).run()
    sa, sb = a.summary(), b.summary()
    for k in ("wall_s", "speed_x", "cpu_s", "cpu_speed_x"):
        sa.pop(k), sb.pop(k)
    assert sa == sb
    assert a.dead_seen == b.dead_seen


def test_join_from_scratch_converges() -> None:
    sim = Simulation(SimParams(nodes=30, seconds=20, join=True, seed=2))
    sim.run()
    for sw in sim.nodes:
        assert sw.num_members() == 30
        assert all(m.state == "alive" for m in sw.members.values())


def test_partition_then_heal() -> None:
    a, b = parse_partition("0-9|10-19", 20)
    sim = Simulation(SimParams(nodes=20, seconds=70, partition=(a, b), partition_at=5.0, heal_at=40.0, seed=4))
    states_at_heal: dict[str, str] = {}

    def watch(i: int, now: float, ev: SwimEvent) -> None:
        if i == 0 and now < 40.0 and isinstance(ev, MemberChanged) and ev.member == "n15":
            states_at_heal["n15"] = ev.state

    sim.on_event = watch
    r = sim.run()
    assert states_at_heal["n15"] == "dead"  # the far side was given up on
    assert r.partition_dead > 0 and r.false_dead == 0 and r.false_suspicions == 0
    # after the heal, dead members still get gossip for a while, learn of it and refute
    for sw in sim.nodes:
        assert sorted(m.state for m in sw.members.values()) == ["alive"] * 20


def test_parse_partition() -> None:
    assert parse_partition("0-2|n3,n5", 6) == ({0, 1, 2}, {3, 5})
    with pytest.raises(ValueError):
        parse_partition("0-3|3-5", 6)
    with pytest.raises(ValueError):
        parse_partition("0-9", 6)


def test_traces_follow_the_contract(tmp_path: Path) -> None:
    out = tmp_path / "traces"
    sim = Simulation(SimParams(nodes=12, seconds=40, crash=1, crash_at=5.0, broadcasts_per_s=0.5, seed=8), out_dir=out)
    r = sim.run()
    files = sorted(out.glob("*.jsonl"))
    assert len(files) == 12
    records = [json.loads(line) for f in files for line in f.read_text().splitlines()]
    assert records
    for rec in records:
        assert set(TRACE_FIELDS) <= set(rec)
        assert rec["kind"] in TRACE_KINDS and rec["sim"] is True
        assert rec["ts_us"] >= rec["origin_ts_us"]
    (victim,) = r.crashed
    assert any(rec["kind"] == "node_crash" and rec["node"] == victim for rec in records)
    dead = [rec for rec in records if rec["kind"] == "member_dead" and rec["subject"] == victim]
    assert {rec["node"] for rec in dead} == {f"n{i}" for i in range(12)} - {victim}
    origins = [rec for rec in dead if rec["hops"] == 0]
    assert origins and all(rec["node"] == rec["origin"] and rec["ts_us"] == rec["origin_ts_us"] for rec in origins)
    bcast = [rec for rec in records if rec["kind"] == "broadcast"]
    by_event: dict[str, list[dict]] = {}
    for rec in bcast:
        by_event.setdefault(rec["event_id"], []).append(rec)
    assert by_event
    for recs in by_event.values():
        first = [x for x in recs if x["hops"] == 0]
        assert len(first) == 1 and first[0]["node"] == first[0]["origin"]
        assert len({x["node"] for x in recs}) == len(recs)  # first receipt only


def test_simulate_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    rc = simulate_main(
        ["--nodes", "20", "--seconds", "15", "--loss", "0.05", "--crash", "1", "--crash-at", "3",
         "--broadcasts-per-s", "1", "--seed", "7", "--out", str(out)]
    )
    assert rc == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("20 nodes x 15 s virtual") and "broadcasts" in line
    summary = json.loads((out / "summary.json").read_text())
    assert summary["nodes"] == 20 and summary["crashed"] == 1
    assert len(list(out.glob("n*.jsonl"))) == 20


class TickingClock(ManualClock):
    """Each reading moves the clock on by one second: elapsed times are then known."""

    def now(self) -> float:
        self.advance(1.0)
        return super().now()


def _files(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


def test_a_seed_replays_exactly_summary_json_and_traces(tmp_path: Path) -> None:
    # a partition and its heal, crashes, stalls, loss, duplicates and broadcasts: every
    # random choice of the run comes from the one seed
    params = SimParams(
        nodes=30, seconds=25, loss=0.05, duplicate=0.02, crash=2, crash_at=4, stall=0.1, broadcasts_per_s=2,
        partition=({*range(0, 20)}, {*range(20, 30)}), partition_at=6, heal_at=14, seed=11,
    )
    runs = []
    for name in ("a", "b"):
        summary = run_to(tmp_path / name, params, wall_clock=TickingClock(), cpu_clock=lambda: 0.0)
        runs.append(_files(tmp_path / name))
    assert runs[0] == runs[1]  # summary.json and every node's trace, byte for byte
    assert summary["wall_s"] == 1.0 and summary["cpu_s"] == 0.0  # the injected clocks measured the run
    other = run_to(tmp_path / "c", dataclasses.replace(params, seed=12), wall_clock=TickingClock(), cpu_clock=lambda: 0.0)
    assert other != json.loads(runs[0]["summary.json"])


def test_meshd_simulate_same_seed_same_summary_across_processes(tmp_path: Path) -> None:
    # separate processes with different string hashing: nothing may depend on set order
    argv = ["simulate", "--nodes", "25", "--seconds", "12", "--loss", "0.05", "--crash", "1", "--crash-at", "3",
            "--broadcasts-per-s", "1", "--partition", "0-14|15-24", "--partition-at", "4", "--heal-at", "8",
            "--seed", "5", "--no-progress"]
    summaries = []
    for i, hash_seed in enumerate(("1", "2")):
        out = tmp_path / f"run{i}"
        env = {**subprocess_env(), "PYTHONHASHSEED": hash_seed}
        done = subprocess.run([*meshd_command(), *argv, "--out", str(out)], capture_output=True, text=True, timeout=120, env=env)
        assert done.returncode == 0, done.stderr
        summary = json.loads((out / "summary.json").read_text())
        for k in ("wall_s", "speed_x", "cpu_s", "cpu_speed_x"):  # how fast this machine was
            summary.pop(k)
        summaries.append(summary)
    assert summaries[0] == summaries[1]


def test_simulate_cli_passes_gossip_overrides_and_records_them(tmp_path: Path) -> None:
    out = tmp_path / "sim"
    argv = ["--nodes", "8", "--seconds", "5", "--suspicion-age-credit", "0", "--sweep-mult", "2", "--out", str(out), "--no-progress"]
    assert simulate_main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["overrides"] == {"suspicion_age_credit": 0.0, "sweep_mult": 2}


@pytest.mark.parametrize("argv", [["--nodes", "1", "--out", "x"], ["--crash", "5", "--nodes", "5", "--out", "x"], ["--partition", "0-3", "--out", "x"],
                                  ["--suspicion-age-credit", "-1", "--out", "x"], ["--sweep-mult", "-1", "--out", "x"]])
def test_simulate_cli_rejects_bad_arguments(argv: list[str], tmp_path: Path) -> None:
    argv = [a if a != "x" else str(tmp_path / "o") for a in argv]
    assert simulate_main(argv) == 2


def test_one_or_two_crashes_do_not_sweep_three_at_once_do() -> None:
    # a sweep is for correlated failures: one or two crashed members (or slow ones)
    # are left to the round robin
    for k in (1, 2):
        sim = Simulation(SimParams(nodes=50, seconds=40, crash=k, crash_at=5.0, seed=2))
        r = sim.run()
        assert sum(sw.stats.sweeps for sw in sim.nodes) == 0 and r.false_dead == 0
    three = Simulation(SimParams(nodes=50, seconds=40, crash=3, crash_at=5.0, seed=2))
    r3 = three.run()
    live = [sw for sw in three.nodes if sw.id not in r3.crashed]
    # every live node swept once (the quiet period keeps it to one), and only live
    # members were suspected by it: no false suspicion, no false dead
    assert all(sw.stats.sweeps == 1 for sw in live)
    assert all(sw.stats.sweep_probes > 0 for sw in live)
    assert r3.false_suspicions == 0 and r3.false_dead == 0
    assert all(len(r3.dead_seen[v]) == 47 for v in r3.crashed)


@pytest.mark.parametrize("argv, message", [
    (["--partition", "0-5|6-9", "--partition-at", "10", "--heal-at", "80"],
     "--heal-at 80 falls outside the run (--seconds 60): it would never happen"),
    (["--crash", "1", "--crash-at", "70"], "--crash-at 70 falls outside the run (--seconds 60)"),
    (["--crash", "1", "--crash-at", "20", "--restart-after", "45"],
     "the restart (--crash-at + --restart-after) 65 falls outside the run"),
    (["--heal-at", "30"], "--heal-at needs --partition"),
    (["--partition", "0-5|6-9", "--partition-at", "30", "--heal-at", "20"], "--heal-at 20 is not after --partition-at 30"),
])
def test_simulate_refuses_a_schedule_that_cannot_happen(tmp_path, capsys, argv, message):
    from simulation.cli import simulate_main

    out = tmp_path / "sim"
    assert simulate_main(["--nodes", "10", "--out", str(out), "--no-progress", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("meshd simulate: ") and message in err
    assert not out.exists()  # refused before anything ran


def test_a_crashed_node_restarts_and_is_alive_again_everywhere(tmp_path):
    from simulation.truth import TRUTH_FILE

    sim = Simulation(SimParams(nodes=10, seconds=40, crash=1, crash_at=5, restart_after=10, seed=2), out_dir=tmp_path)
    r = sim.run()
    (victim,) = r.crashed
    assert all(sw.members[victim].state == "alive" for sw in sim.nodes)  # refuted its death, rejoined
    lines = [json.loads(x) for x in (tmp_path / f"{victim}.jsonl").read_text().splitlines()]
    assert [x["kind"] for x in lines if x["kind"].startswith("node_")] == ["node_start", "node_crash", "node_start"]
    truth = json.loads((tmp_path / TRUTH_FILE).read_text())
    (crash,) = truth["crashes"]
    assert (crash["node"], crash["crash_s"], crash["restart_s"]) == (victim, 5.0, 15.0)
    assert crash["declared"] == crash["observers"] == 9 and crash["all_dead_s"] < 15
    by_class = truth["declarations"]["by_class"]
    assert by_class["restart"] > 0 and by_class["false_positive"] == by_class["true_detection"] == 0
