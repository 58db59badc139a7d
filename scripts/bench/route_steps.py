#!/usr/bin/env python3
"""The longest uninterrupted Trio steps of simulated nodes at a big route table.

On the cluster simulator (`simulation.cluster`: whole nodes in one process, virtual
time), each node takes `--per-node` routes through its mesh port (the broker's path:
local route changes flushed into deltas and broadcast in chunks), then one member is
killed and restarted. Per phase it prints the steps over 50 ms of wall time (a step is
what a node does without a checkpoint: while it runs, nothing else on that node, gossip
included, can), the CPU per task and the garbage collector's passes per generation.
Wall time in one process: run it on a quiet machine, or compare two trees side by side.

    python scripts/bench/route_steps.py --nodes 3 --per-node 20000
"""

from __future__ import annotations

import argparse
import collections
import gc
import sys
import time
from pathlib import Path

import trio
import trio.lowlevel

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts" / "bench"))

from route_scale import node_filters  # noqa: E402
from simulation.cluster import ClusterParams, SimCluster, run_cluster  # noqa: E402

LONG = 0.05


class Steps(trio.abc.Instrument):
    def __init__(self) -> None:
        self.t0 = 0.0
        self.long: list[tuple[float, str, float]] = []
        self.cpu: collections.Counter[str] = collections.Counter()
        self.gc: list[tuple[float, int]] = []
        self._gc_t0 = 0.0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_t0 = time.perf_counter()
        else:
            self.gc.append((time.perf_counter() - self._gc_t0, info["generation"]))

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.t0 = time.perf_counter()

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        spent = time.perf_counter() - self.t0
        name = task.name.rsplit(".", 1)[-1]
        self.cpu[name] += spent
        if spent > LONG and name != "main":
            self.long.append((spent, name, trio.current_time()))

    def report(self, phase: str) -> None:
        print(f"== {phase}: {len(self.long)} steps over {LONG * 1000:.0f} ms; longest:")
        for spent, name, at in sorted(self.long, reverse=True)[:10]:
            print(f"   {spent * 1000:8.1f} ms  {name}  (virtual {at:.1f} s)")
        for gen in (0, 1, 2):
            passes = [d for d, g in self.gc if g == gen]
            print(f"   gc generation {gen}: {len(passes)} passes, {sum(passes):.2f} s, longest {max(passes, default=0) * 1000:.0f} ms")
        print("   wall per task:", ", ".join(f"{k} {v:.2f} s" for k, v in self.cpu.most_common(6) if k != "main"))
        self.long.clear()
        self.cpu.clear()
        self.gc.clear()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--per-node", type=int, default=20_000)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    total = args.nodes * args.per_node

    async def scenario(c: SimCluster) -> None:
        await c.wait_converged()
        watch = Steps()
        trio.lowlevel.add_instrument(watch)
        for i, node in enumerate(c.node_ids):
            port = c.cluster(node).port
            for topic_filter in node_filters(i, args.per_node):
                port.route_changed(topic_filter, True)

        def loaded() -> bool:
            return all(c.cluster(n).table.route_count() == total and not c.cluster(n).table.unsettled
                       for n in c.node_ids)

        await c.wait_for(loaded, 3000, "every node holds every route")
        watch.report(f"{args.nodes} nodes take {args.per_node:,} routes each")
        victim, others = c.node_ids[1], [n for n in c.node_ids if n != c.node_ids[1]]
        await c.kill(victim)
        await c.wait_for(lambda: all(c.cluster(n).held.is_held(victim) for n in others), 120, "held")
        await c.restart(victim)
        await c.wait_for(lambda: not any(c.cluster(n).held.members for n in others), 600, "released")
        watch.report(f"{victim} dies and comes back (without its routes)")

    run_cluster(ClusterParams(nodes=args.nodes, seed=args.seed), scenario)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
