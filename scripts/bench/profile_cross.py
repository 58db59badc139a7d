"""Profile the nodes of the cross-node scenario (publishers on A, subscriber on B) with py-spy.

    python scripts/bench/profile_cross.py --qos 0          # 3 nodes, fan-in 10->1, A->B
    python scripts/bench/profile_cross.py --qos 1 --rate 250

Starts the scenario's three nodes (`cluster.start_nodes`, pinned to the broker core),
attaches `py-spy record` to A and to B, runs the fan-in across the link as
`cluster.run` does, and prints each node's top functions by self and total time (the
tables of `profile_meshd.py`) with its CPU per message. Raw stacks go to
scripts/bench/profiles/cross-qos<N>-<node>.txt.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parents[1]))

import brokers  # noqa: E402
import cluster  # noqa: E402
import loadgen  # noqa: E402
from profile_meshd import ensure_py_spy, parse_collapsed, top_tables  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--qos", type=int, default=0, choices=(0, 1))
    parser.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    parser.add_argument("--duration", type=float, default=4.0)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--native", action="store_true", help="py-spy --native: C frames too (cbor2, the GC, compiled cores)")
    parser.add_argument("--out", type=Path, default=HERE / "profiles")
    args = parser.parse_args(argv)
    py_spy = ensure_py_spy()
    args.out.mkdir(parents=True, exist_ok=True)
    brokers.raise_fd_limit()
    if brokers.can_pin():
        os.sched_setaffinity(0, {brokers.GENERATOR_CORE})
    work = Path(tempfile.mkdtemp(prefix="meshd-profile-cross-"))
    nodes, http_a = cluster.start_nodes(work, ("A", "B", "C"))
    raws = {name: args.out / f"cross-qos{args.qos}-{name}.txt" for name in ("A", "B")}
    spies = []
    try:
        for name, node in zip(("A", "B"), nodes):
            cmd = [py_spy, "record", "--pid", str(node.pid), "--rate", str(args.rate), "--format", "raw",
                   "-o", str(raws[name]), *(["--native"] if args.native else [])]
            if brokers.can_pin():
                cmd = ["taskset", "-c", str(brokers.GENERATOR_CORE), *cmd]
            spies.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        time.sleep(1.0)  # let py-spy attach before the load starts
        result = loadgen.throughput(nodes[0].port, [n.pid for n in nodes], sub_port=nodes[1].port, tag="p",
                                    before_publish=lambda: cluster.wait_for_route(http_a, "B"),
                                    publishers=cluster.PUBLISHERS, subscribers=1, qos=args.qos,
                                    topics="per-publisher", duration=args.duration, window=cluster.WINDOW[args.qos])
    finally:
        for spy in spies:
            if spy.poll() is None:
                spy.send_signal(2)  # SIGINT: py-spy writes its output and exits
        for spy in spies:
            try:
                spy.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                spy.kill()
        for node in reversed(nodes):
            node.stop()
        shutil.rmtree(work, ignore_errors=True)
    delivered = result["delivered"] or 1
    print(f"cross-qos{args.qos}: {result['msgs_per_s']:.0f} msg/s, {result['cpu_us_per_msg']:.2f} us/msg (all nodes), "
          f"per node us/msg: {[round(1e6 * c / delivered, 2) for c in result['node_cpu_s']]}, lost {result['lost']}")
    for name, raw in raws.items():
        total, self_fn, _, total_fn = top_tables(parse_collapsed(raw.read_text()), args.top)
        print(f"\n## node {name} ({total} busy samples)\n\nself:")
        for k, c in self_fn:
            print(f"{100 * c / total:5.1f}  {k}")
        print("\ninclusive:")
        for k, c in total_fn:
            print(f"{100 * c / total:5.1f}  {k}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
