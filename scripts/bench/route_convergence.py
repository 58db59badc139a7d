#!/usr/bin/env python3
"""Route convergence across a cluster of real meshd processes on 127.0.0.1.

For each round: a client subscribes on node 0 to a fresh topic; as soon as its SUBACK
arrives, one publisher on every other node publishes to that topic every few
milliseconds (QoS 0) until the subscriber has received a message from that node.  The
figure per node is the time from SUBACK to the first delivery of its publish: how long
the route took to reach that node (plus one forward).

    python scripts/bench/route_convergence.py --nodes 10 --rounds 20
    python scripts/bench/route_convergence.py --nodes 10 --rounds 20 --preset local
    python scripts/bench/route_convergence.py --nodes 10 --rounds 10 --preload 1000000 --join

With `--preload N`, before the rounds every node gets N/nodes distinct subscriptions
(`route_scale.node_filters`: one in five a wildcard) from clients of 10,000 each (the
default `max_subscriptions_per_client`), in SUBSCRIBEs of 1,000 filters, and the run waits until every node's `meshd_routes` gauge shows all N
(the seconds that took, and each node's resident memory then, go into the line); the
rounds then time a route delta at that table size. With `--join`, after the rounds a
new node starts (seeded with node 0) and the time from its start until its own table
holds all N routes is measured: how long a new node takes to receive the whole table
(and the CPU seconds its process used until then, which move less with the machine's
load). `preload_dead`, `rounds_dead` and `join_dead` count the `member.dead` lines the
nodes logged in each phase (one per node that declared a member dead).

Prints median and p99 (seconds) and writes one JSON line per run to
scripts/bench/results/route_convergence.jsonl (git-ignored; a result lands in RESULTS.md
with its lines, see README.md).  Traffic stays on 127.0.0.1; the run stops by itself
(each round is bounded by --round-timeout).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from mesh.http_client import request_json  # noqa: E402
from tests.support import Client, MeshdProcess, start_all  # noqa: E402

sys.path.insert(0, str(ROOT / "scripts" / "bench"))
from route_scale import node_filters  # noqa: E402

SUBSCRIBE_BATCH = 1000
PER_CLIENT = 10_000  # meshd's default max_subscriptions_per_client


def start_cluster(n: int, preset: str, workdir: str, log_level: str = "warning",
                  extra_flags: tuple[str, ...] = ()) -> list[MeshdProcess]:
    """Node 0 first (its bound gossip port is the others' seed), then the rest at once;
    every node is ready (all listeners bound) before the view is asked for.
    ``extra_flags`` go to every node (other benchmarks' settings)."""
    def node(i: int, *seed: str) -> MeshdProcess:
        return MeshdProcess(os.path.join(workdir, f"n{i}"), "--gossip-preset", preset, *seed,
                            "--log-level", log_level, *extra_flags, http=True, node_id=f"n{i}")

    first = node(0).start()
    nodes = [first] + [node(i, "--seed", first.gossip_addr) for i in range(1, n)]
    try:
        start_all(nodes[1:])
        deadline = time.monotonic() + 60
        for member in nodes:
            while True:
                _, body = request_json(member.http_addr, "GET", "/api/v1/members")
                if sum(m["state"] == "alive" for m in body["members"]) == n:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError("cluster did not converge")
                time.sleep(0.1)
    except BaseException:
        # Never leave processes behind when the cluster cannot be brought up.
        for member in nodes:
            member.__exit__()
        raise
    return nodes


def one_round(nodes: list[MeshdProcess], publishers: list[Client], topic: str, timeout: float) -> dict[str, float]:
    sub = Client(f"conv-sub-{topic.replace('/', '-')}", version=5)
    sub.connect(nodes[0].port)
    first: dict[str, float] = {}
    stop = threading.Event()
    t_suback = [0.0]

    def publish_loop(i: int, pub: Client) -> None:
        payload = nodes[i].node_id.encode()
        while not stop.is_set() and nodes[i].node_id not in first:
            pub.publish(topic, payload, qos=0, wait=False)
            time.sleep(0.005)

    sub.subscribe(topic, 0)
    t_suback[0] = time.monotonic()
    threads = [threading.Thread(target=publish_loop, args=(i, p), daemon=True) for i, p in enumerate(publishers) if i > 0]
    for t in threads:
        t.start()
    deadline = t_suback[0] + timeout
    while len(first) < len(nodes) - 1 and time.monotonic() < deadline:
        try:
            msg = sub.messages.get(timeout=max(0.01, deadline - time.monotonic()))
        except Exception:
            break
        node_id = msg.payload.decode()
        first.setdefault(node_id, time.monotonic() - t_suback[0])
    stop.set()
    for t in threads:
        t.join()
    sub.disconnect()
    return first


def route_count(node: MeshdProcess) -> int:
    """The node's `meshd_routes` gauge; 0 while it does not answer (a node applying a
    part of a big table holds its event loop for a while)."""
    return metric(node, "meshd_routes")


def metric(node: MeshdProcess, name: str) -> int:
    """One of the node's metrics without labels; 0 while it does not answer."""
    host, port = node.http_addr.rsplit(":", 1)
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=30) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name + " "):
                    return int(float(line.split()[1]))
    except OSError:  # URLError and timeouts included: not answering now
        return 0
    return 0


def pulled(nodes: list[MeshdProcess]) -> dict[str, int]:
    """What route sync pulled, summed over `nodes`: filters of whole snapshots, and
    changes from peers' delta logs."""
    return {"pulled_snapshot_filters": sum(metric(n, "meshd_route_pull_snapshot_filters_total") for n in nodes),
            "pulled_delta_changes": sum(metric(n, "meshd_route_pull_delta_changes_total") for n in nodes)}


def rss_mb(node: MeshdProcess) -> float:
    assert node.proc is not None
    with open(f"/proc/{node.proc.pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def cpu_s(node: MeshdProcess) -> float:
    """CPU seconds (user + system) the node's process has used so far: on a shared
    machine the wall time of a join moves with the load, its CPU much less."""
    assert node.proc is not None
    with open(f"/proc/{node.proc.pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_routes(nodes: list[MeshdProcess], total: int, timeout: float) -> float:
    t0 = time.monotonic()
    shown = t0
    while not all(route_count(n) >= total for n in nodes):
        if time.monotonic() - shown > 10:
            shown = time.monotonic()
            print(f"  {shown - t0:.0f} s: routes per node {[route_count(n) for n in nodes]}", file=sys.stderr, flush=True)
        if time.monotonic() - t0 > timeout:  # (counts asked again: the message shows them now)
            raise RuntimeError(f"routes did not reach {total} on every node within {timeout:.0f} s: "
                               f"{[route_count(n) for n in nodes]}")
        time.sleep(0.2)
    return time.monotonic() - t0


def preload(nodes: list[MeshdProcess], total: int, timeout: float) -> tuple[list[Client], dict]:
    """total/len(nodes) subscriptions on each node; returns the clients (kept connected:
    their sessions hold the routes) and the figures."""
    per_node = total // len(nodes)
    t0 = time.monotonic()
    clients = []
    shares: list[list[str]] = []
    for i, node in enumerate(nodes):
        filters = node_filters(i, per_node)
        # A session holds at most max_subscriptions_per_client (10,000 by default).
        # Every client connects before any subscribes: a node busy with thousands of
        # subscriptions answers a CONNECT late.
        for j, start in enumerate(range(0, per_node, PER_CLIENT)):
            c = Client(f"preload-{i}-{j}", version=4)
            c.connect(node.port)
            clients.append(c)
            shares.append(filters[start:start + PER_CLIENT])
    sent: list[int] = []  # SUBSCRIBEs per client
    for c, mine in zip(clients, shares):
        for k in range(0, len(mine), SUBSCRIBE_BATCH):
            c.c.subscribe([(f, 0) for f in mine[k:k + SUBSCRIBE_BATCH]])
        sent.append((len(mine) + SUBSCRIBE_BATCH - 1) // SUBSCRIBE_BATCH)
    for c, n in zip(clients, sent):
        for _ in range(n):
            c.subacks.get(timeout=timeout)
    subscribed = time.monotonic() - t0
    spread = wait_routes(nodes, per_node * len(nodes), timeout)
    return clients, {"preload_routes": per_node * len(nodes), "preload_subscribe_s": round(subscribed, 2),
                     "preload_spread_s": round(spread, 2), "rss_mb": [round(rss_mb(n), 1) for n in nodes]}


def join(nodes: list[MeshdProcess], preset: str, workdir: str, total: int, timeout: float) -> dict:
    """A new node seeded with node 0: seconds from its start until it holds all routes."""
    n = len(nodes)
    new = MeshdProcess(os.path.join(workdir, f"n{n}"), "--gossip-preset", preset, "--seed", nodes[0].gossip_addr,
                       "--log-level", "warning", http=True, node_id=f"n{n}")
    t0 = time.monotonic()
    new.start()
    try:
        started = time.monotonic() - t0
        wait_routes([new], total, timeout)
        return {"join_s": round(time.monotonic() - t0, 2), "join_start_s": round(started, 2),
                "join_rss_mb": round(rss_mb(new), 1), "join_cpu_s": round(cpu_s(new), 2),
                **{f"join_{k}": v for k, v in pulled([new]).items()}}
    finally:
        new.__exit__()


def deaths(workdir: str) -> int:
    """`member.dead` lines in the nodes' logs so far: one per member declared dead by a
    node (a member declared dead by all nine others counts nine)."""
    count = 0
    for name in os.listdir(workdir):
        if name.endswith(".log"):
            with open(os.path.join(workdir, name), encoding="utf-8", errors="replace") as f:
                count += sum("member.dead" in line for line in f)
    return count


def run(nodes_n: int, rounds: int, preset: str, timeout: float, preload_n: int = 0, do_join: bool = False,
        preload_timeout: float = 1500.0) -> dict:
    extra: dict = {}
    with tempfile.TemporaryDirectory(prefix="meshd-conv-") as workdir:
        nodes = start_cluster(nodes_n, preset, workdir)
        loaders: list[Client] = []
        try:
            if preload_n:
                loaders, figures = preload(nodes, preload_n, preload_timeout)
                extra.update(figures)
                extra["preload_dead"] = deaths(workdir)
            publishers = []
            for i, node in enumerate(nodes):
                p = Client(f"conv-pub-{i}", version=5)
                p.connect(node.port)
                publishers.append(p)
            samples: list[float] = []
            missing = 0
            for r in range(rounds):
                got = one_round(nodes, publishers, f"conv/{r}/{time.time_ns()}", timeout)
                samples.extend(got.values())
                missing += nodes_n - 1 - len(got)
            for p in publishers:
                p.disconnect()
            extra["rounds_dead"] = deaths(workdir) - extra.get("preload_dead", 0)
            extra.update(pulled(nodes))
            if do_join:
                extra.update(join(nodes, preset, workdir, extra.get("preload_routes", 0), preload_timeout))
                extra["join_dead"] = deaths(workdir) - extra["rounds_dead"] - extra.get("preload_dead", 0)
            for c in loaders:
                c.disconnect()
        finally:
            for node in nodes:
                node.__exit__()
    samples.sort()
    result = {
        "nodes": nodes_n, "rounds": rounds, "preset": preset, "samples": len(samples), "missing": missing,
        "median_s": statistics.median(samples) if samples else None,
        "p99_s": samples[min(len(samples) - 1, int(0.99 * len(samples)))] if samples else None,
        "max_s": samples[-1] if samples else None,
        "ts": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **extra,
    }
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--preset", default="lan", choices=("lan", "wan", "local"))
    ap.add_argument("--round-timeout", type=float, default=10.0)
    ap.add_argument("--preload", type=int, default=0, metavar="N", help="N subscriptions spread over the nodes first")
    ap.add_argument("--join", action="store_true", help="then time a new node's receipt of the whole table")
    args = ap.parse_args()
    result = run(args.nodes, args.rounds, args.preset, args.round_timeout, args.preload, args.join)
    with open("/proc/loadavg") as f:
        result["loadavg"] = float(f.read().split()[0])
    result["commit"] = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                                      capture_output=True, text=True).stdout.strip() or "?"
    out = ROOT / "scripts" / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "route_convergence.jsonl", "a") as f:
        f.write(json.dumps(result) + "\n")
    print(f"{args.nodes} nodes, {args.preset} preset: SUBACK -> first delivery from every other node: "
          f"median {result['median_s']:.3f} s, p99 {result['p99_s']:.3f} s, max {result['max_s']:.3f} s "
          f"({result['samples']} samples, {result['missing']} missing)")
    if args.preload or args.join:
        print(json.dumps({k: v for k, v in result.items() if k.startswith(("preload", "rss", "join", "rounds_dead", "pulled"))}))
    return 0 if result["missing"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
