#!/usr/bin/env python3
"""How fast the cluster simulator (simulation/cluster.py) runs: virtual seconds per
wall second for a cluster of complete nodes, idle and with light traffic.

    python scripts/sim/cluster_speed.py                       # 20 nodes, 60 virtual s each
    python scripts/sim/cluster_speed.py --nodes 5 --seconds 120

Light traffic: one persistent QoS 1 subscriber per node on `load/<node>/#` and one
publisher per node that publishes QoS 1 to the next node's filter every `--interval`
virtual seconds (so every message crosses one mesh link).  Prints one line per case.

Measured on the 2-core development machine, shared (load average ~3), 120 virtual s per
case: 20 nodes idle 66-70, light traffic 24-36 virtual s per wall s; 5 nodes idle 268,
light traffic 127.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import trio  # noqa: E402

from simulation.cluster import ClusterParams, SimCluster, run_cluster  # noqa: E402


def measure(params: ClusterParams, seconds: float, traffic: bool, interval: float) -> tuple[float, float, int]:
    """(virtual seconds run, wall seconds, messages delivered) for the measured part."""

    async def scenario(c: SimCluster) -> tuple[float, float, int]:
        await c.wait_converged(timeout=120)
        subs = []
        if traffic:
            subs = [await c.connect(n, f"sub-{n}", clean_start=False, session_expiry=3600) for n in c.node_ids]
            for s in subs:
                await s.subscribe(f"load/{s.node_id}/#", 1)
            pubs = [await c.connect(n, f"pub-{n}") for n in c.node_ids]
            await c.wait_converged(timeout=120)
        start_v, start_w = c.clock.now(), time.perf_counter()
        if traffic:
            async with trio.open_nursery() as nursery:
                for i, pub in enumerate(pubs):
                    target = c.node_ids[(i + 1) % len(c.node_ids)]

                    async def publish_loop(pub=pub, target=target) -> None:
                        n = 0
                        while c.clock.now() - start_v < seconds:
                            await pub.publish(f"load/{target}/{n}", b"x" * 64, qos=1)
                            n += 1
                            await trio.sleep(interval)

                    nursery.start_soon(publish_loop)
        else:
            await c.run_for(seconds)
        return c.clock.now() - start_v, time.perf_counter() - start_w, sum(len(s.received) for s in subs)

    return run_cluster(params, scenario)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=60.0, help="virtual seconds measured per case")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between one publisher's messages")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--preset", default="lan")
    args = parser.parse_args()
    for traffic in (False, True):
        params = ClusterParams(nodes=args.nodes, seed=args.seed, gossip_preset=args.preset)
        virtual, wall, delivered = measure(params, args.seconds, traffic, args.interval)
        case = f"light traffic ({args.nodes} QoS 1 msg per {args.interval:g} s, {delivered} delivered)" if traffic else "idle"
        print(f"{args.nodes} nodes, {case}: {virtual:.1f} virtual s in {wall:.2f} wall s = "
              f"{virtual / wall:.1f} virtual s per wall s")


if __name__ == "__main__":
    main()
