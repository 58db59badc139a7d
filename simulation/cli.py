"""`meshd simulate` (dispatched here by mesh/cli.py): a virtual SWIM cluster with partition detection."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, TextIO

from clock import Clock

if TYPE_CHECKING:
    from simulation.membership import SimParams

def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError("must be between 0 and 1")
    return value


def _positive(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError("must be positive")
    return value


def simulate_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="meshd simulate",
        description="Run a virtual SWIM cluster in simulated time and write its convergence traces.",
    )
    p.add_argument("--nodes", type=int, default=100, help="cluster size (default 100)")
    p.add_argument("--seconds", type=_positive, default=60.0, help="virtual seconds to run (default 60)")
    p.add_argument("--loss", type=_fraction, default=0.0, help="packet loss probability, 0..1")
    p.add_argument("--latency-ms", type=float, default=2.0, help="mean one-way latency; each link varies 0.5x..1.5x")
    p.add_argument("--duplicate", type=_fraction, default=0.0, help="packet duplication probability")
    p.add_argument("--seed", type=int, default=1, help="RNG seed: same seed, same run")
    p.add_argument("--crash", type=int, default=0, help="number of nodes that crash")
    p.add_argument("--crash-at", type=float, default=20.0, help="virtual time of the crash")
    p.add_argument("--restart-after", type=_positive, default=None, metavar="SECONDS",
                   help="the crashed nodes start again this long after their crash (a new gossip machine "
                        "joining through a live member, as a restarted node)")
    p.add_argument("--stall", type=_fraction, default=0.0, help="fraction of nodes whose event loop stalls 0.2-2 s now and then")
    p.add_argument("--broadcasts-per-s", type=float, default=0.0, help="user broadcasts per virtual second (random origins)")
    p.add_argument("--partition", help='two sides "A|B" as node index ranges, e.g. "0-49|50-99"')
    p.add_argument("--partition-at", type=float, default=10.0, help="virtual time the cut happens")
    p.add_argument("--heal-at", type=float, default=None,
                   help="virtual time the link returns (every node runs the partition detector and traces "
                        "partition_detected / partition_healed)")
    p.add_argument("--preset", default="lan", choices=["lan", "wan", "local"])
    p.add_argument("--no-lifeguard", action="store_true", help="classic SWIM, for comparison")
    p.add_argument("--join", action="store_true", help="start with every node joining through n0 instead of a converged view")
    p.add_argument("--suspicion-mult", type=int, default=None, help="override the preset's suspicion multiplier")
    p.add_argument("--sweep-mult", type=int, default=None,
                   help="override the preset's sweep multiplier (extra probes per interval once three members are "
                        "suspect at once; 0 turns sweeps off, for comparison)")
    p.add_argument("--suspicion-age-credit", type=float, default=None,
                   help="override how much of a suspicion's age a member credits when it hears of it late, in "
                        "log10(N) probe intervals (default 1; 0: the timeout runs from receipt, memberlist's rule)")
    p.add_argument("--out", required=True, help="directory for the traces (one JSON Lines file per node) and summary.json")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    return p


def simulate_main(argv: list[str]) -> int:
    if "--cluster" in argv:
        return cluster_main(argv)
    from simulation.membership import SimParams, parse_partition

    args = simulate_parser().parse_args(argv)
    if args.nodes < 2:
        print("meshd simulate: --nodes must be at least 2", file=sys.stderr)
        return 2
    if args.crash < 0 or args.crash >= args.nodes:
        print("meshd simulate: --crash must be between 0 and nodes-1", file=sys.stderr)
        return 2
    late = schedule_problem(args)
    if late:
        print(f"meshd simulate: {late}", file=sys.stderr)
        return 2
    partition = None
    if args.partition:
        try:
            partition = parse_partition(args.partition, args.nodes)
        except ValueError as exc:
            print(f"meshd simulate: {exc}", file=sys.stderr)
            return 2
    overrides: dict[str, float] = {}
    if args.suspicion_mult is not None:
        overrides["suspicion_mult"] = args.suspicion_mult
    if args.sweep_mult is not None:
        if args.sweep_mult < 0:
            print("meshd simulate: --sweep-mult must be 0 or more", file=sys.stderr)
            return 2
        overrides["sweep_mult"] = args.sweep_mult
    if args.suspicion_age_credit is not None:
        if not 0 <= args.suspicion_age_credit <= 4:
            print("meshd simulate: --suspicion-age-credit must be between 0 and 4", file=sys.stderr)
            return 2
        overrides["suspicion_age_credit"] = args.suspicion_age_credit
    params = SimParams(
        nodes=args.nodes,
        seconds=args.seconds,
        loss=args.loss,
        latency_ms=args.latency_ms,
        duplicate=args.duplicate,
        seed=args.seed,
        crash=args.crash,
        crash_at=args.crash_at,
        restart_after=args.restart_after,
        stall=args.stall,
        broadcasts_per_s=args.broadcasts_per_s,
        partition=partition,
        partition_at=args.partition_at,
        heal_at=args.heal_at,
        preset=args.preset,
        lifeguard=not args.no_lifeguard,
        overrides=overrides,
        join=args.join,
    )
    summary = run_to(Path(args.out), params, progress=None if args.no_progress else sys.stderr)
    print(_summary_line(summary))
    return 0


def schedule_problem(args: argparse.Namespace) -> str | None:
    """Why the run's schedule cannot happen as asked (an event at or after the end,
    a heal before its cut, an option that needs another), or None."""
    end = args.seconds
    events: list[tuple[str, float]] = []
    if args.crash:
        events.append(("--crash-at", args.crash_at))
        if args.restart_after is not None:
            events.append(("the restart (--crash-at + --restart-after)", args.crash_at + args.restart_after))
    elif args.restart_after is not None:
        return "--restart-after needs --crash"
    if args.partition:
        events.append(("--partition-at", args.partition_at))
        if args.heal_at is not None:
            if args.heal_at <= args.partition_at:
                return f"--heal-at {args.heal_at:g} is not after --partition-at {args.partition_at:g}"
            events.append(("--heal-at", args.heal_at))
    elif args.heal_at is not None:
        return "--heal-at needs --partition"
    for what, at in events:
        if not 0 <= at < end:
            return f"{what} {at:g} falls outside the run (--seconds {end:g}): it would never happen"
    return None


def cluster_parser() -> argparse.ArgumentParser:
    from faults import FAULTS

    p = argparse.ArgumentParser(
        prog="meshd simulate --cluster",
        description="Run whole meshd clusters in virtual time, one per seed, under a random workload with faults "
                    "(kills, restarts, cuts, clock skew, config changes), and check them: no acknowledged message "
                    "lost, per-publisher order, no forbidden duplicate, one owner per session, route tables and "
                    "config equal to the truth, nothing left piled up after the heal.",
    )
    p.add_argument("--cluster", action="store_true", required=True, help="the whole-cluster simulator (this mode)")
    p.add_argument("--nodes", type=int, default=5, help="nodes per cluster (default 5)")
    p.add_argument("--clients", type=int, default=20, help="MQTT clients: publishers, persistent and clean subscribers (default 20)")
    p.add_argument("--seconds", type=_positive, default=60.0, help="virtual seconds of workload and faults per seed (default 60)")
    p.add_argument("--seeds", type=int, default=1, help="how many seeds to run (default 1)")
    p.add_argument("--seed", type=int, default=1, help="the first seed (default 1)")
    p.add_argument("--out", help="directory for each seed's node traces (seed-N/<node>/traces, for meshd report) and history.txt")
    p.add_argument("--buggify", action="append", default=[], choices=FAULTS, metavar="FAULT",
                   help=f"switch a deliberate defect on (repeatable): {', '.join(FAULTS)}")
    p.add_argument("--replicas", type=int, default=1, help="session_replicas of every node (default 1)")
    p.add_argument("--crash", action="store_true",
                   help="one node crashes for good at a random time (never restarted): checked by the survival property")
    p.add_argument("--no-history", action="store_true", help="do not print a violation's event history on stderr")
    return p


def cluster_main(argv: list[str]) -> int:
    """`meshd simulate --cluster`: one line per seed, then `K seeds, V violations`;
    exit 1 when V > 0.  Node code iterates sets of strings, whose order follows
    Python's string hashing: the command runs itself again with PYTHONHASHSEED=0 when
    it is not set so, which makes a seed's output the same from run to run."""
    args = cluster_parser().parse_args(argv)
    if args.nodes < 2 or args.clients < 2 or args.seeds < 1:
        print("meshd simulate --cluster: --nodes and --clients must be at least 2, --seeds at least 1", file=sys.stderr)
        return 2
    if os.environ.get("PYTHONHASHSEED") != "0":
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        code = "import sys; from simulation.cli import cluster_main; sys.exit(cluster_main(sys.argv[1:]))"
        sys.stdout.flush()
        os.execve(sys.executable, [sys.executable, "-c", code, *argv], env)
    from simulation.cluster_sim import run_seed
    from simulation.schedule import SimSpec

    violations = 0
    for seed in range(args.seed, args.seed + args.seeds):
        out = Path(args.out) / f"seed-{seed}" if args.out else None
        spec = SimSpec(args.nodes, args.clients, args.seconds, seed, replicas=args.replicas, crash=args.crash)
        result = run_seed(spec, buggify=tuple(args.buggify), out_dir=out)
        print(result.line(), flush=True)
        if result.violation is not None:
            violations += 1
            if not args.no_history:
                print(f"seed={seed}: the events concerned:", file=sys.stderr)
                for line in result.violation.events:
                    print(f"  {line}", file=sys.stderr)
                sys.stderr.flush()
    print(f"{args.seeds} seeds, {violations} violations")
    return 1 if violations else 0


def run_to(
    out: Path, params: SimParams, *, progress: TextIO | None = None, wall_clock: Clock | None = None,
    cpu_clock: Callable[[], float] | None = None,
) -> dict[str, Any]:
    """Run one simulation, write its traces and ``summary.json`` under ``out``, return
    the summary.  The same params (seed included) write the same files, but for the
    wall and CPU figures, which come from ``wall_clock`` / ``cpu_clock``."""
    from simulation.membership import Simulation

    out.mkdir(parents=True, exist_ok=True)
    sim = Simulation(params, out_dir=out, progress=progress, wall_clock=wall_clock, cpu_clock=cpu_clock)
    summary = sim.run().summary()
    summary["dead_bound_s"] = round(sim.dead_bound(), 3)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _summary_line(s: dict[str, Any]) -> str:
    parts = [
        f"{s['nodes']} nodes x {s['virtual_s']:g} s virtual in {s['wall_s']} s wall ({s['speed_x']}x real time), {s['cpu_s']} s CPU ({s['cpu_speed_x']}x)",
        f"{s['packets']} packets, {s['bandwidth_per_node_Bps'] / 1000:.2f} KB/s per node UDP"
        f" + {s['stream_bandwidth_per_node_Bps'] / 1000:.2f} KB/s TCP",
    ]
    if s["broadcasts"]:
        parts.append(
            f"{s['broadcasts']} broadcasts: coverage {s['broadcast_coverage'] * 100:.2f}%, p50 {s['broadcast_p50_s']} s, p99 {s['broadcast_p99_s']} s"
        )
    if s["crashed"]:
        parts.append(
            f"{s['crashed']} crashed: dead at {s['crash_dead_coverage'] * 100:.1f}% of live nodes, median {s['crash_to_dead_median_s']} s, max {s['crash_to_dead_max_s']} s"
        )
    if s.get("partition_dead"):
        parts.append(f"{s['partition_dead']} dead across the partition")
    split = s.get("partition")
    if split:
        bound = split["suspicion_timeout_plus_3_s"]
        for side in ("side_a", "side_b"):
            v = split[side]
            parts.append(
                f"{side.replace('_', ' ')} ({v['nodes']} nodes) held the other dead at {v['marked_other_dead']}/{v['nodes']},"
                f" p50 {v['other_dead_p50_s']} s, max {v['other_dead_max_s']} s after the cut"
                f" (suspicion timeout + 3 s = {bound} s: {v['within_bound']} within);"
                f" suspect to dead p50 {v['suspect_to_dead_p50_s']} s, max {v['suspect_to_dead_max_s']} s"
            )
        if "heal_p99_s" in split:
            parts.append(
                f"one view after the heal at {split['one_view_nodes']}/{split['live_nodes']} nodes,"
                f" p50 {split['heal_p50_s']} s, p99 {split['heal_p99_s']} s, max {split['heal_max_s']} s"
            )
    parts.append(f"false dead {s['false_dead']}, false suspicions {s['false_suspicions']}")
    return "; ".join(parts)


