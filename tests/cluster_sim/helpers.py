"""Helpers for cluster tests on the simulator (simulation/cluster.py): whole nodes in
one Trio run, in virtual time, deterministic by seed.

Every test runs on seed 1; `CLUSTER_SIM_SEED=N` runs them all on seed N instead (a loop
over seeds finds timings a test took for granted, and bugs):

    for s in $(seq 1 50); do CLUSTER_SIM_SEED=$s python3 -m pytest -q tests/cluster_sim; done
"""

from __future__ import annotations

import os
from typing import Awaitable, Callable, Iterable, TypeVar

from simulation.cluster import ClusterParams, SimCluster, run_cluster
from simulation.sim_client import Received

T = TypeVar("T")


def sim(scenario: Callable[[SimCluster], Awaitable[T]], *, nodes: int = 3, seed: int | None = None,
        **settings: object) -> T:
    """Run `scenario` on a fresh converged cluster of `nodes` nodes (n0, n1, ...)."""
    if seed is None:
        seed = int(os.environ.get("CLUSTER_SIM_SEED", "1"))

    async def converged_first(c: SimCluster) -> T:
        await c.wait_converged()
        return await scenario(c)

    return run_cluster(ClusterParams(nodes=nodes, seed=seed, settings=dict(settings)), converged_first)


def routes(c: SimCluster, node_id: str) -> dict[str, set[str]]:
    """The node's whole cluster route table (filter -> nodes), as /api/v1/routes shows it."""
    return c.cluster(node_id).table.routes()


async def wait_route(c: SimCluster, topic_filter: str, owners: set[str], nodes: Iterable[str] | None = None,
                     timeout: float = 10.0) -> None:
    """Until every running node (or `nodes`) routes `topic_filter` to exactly `owners`."""
    names = list(nodes) if nodes is not None else c.alive_nodes()
    await c.wait_for(lambda: all(routes(c, n).get(topic_filter, set()) == owners for n in names), timeout,
                     f"{topic_filter} -> {sorted(owners)} on {names}")


async def status(c: SimCluster, node_id: str) -> dict[str, object]:
    code, body = await c.api(node_id, "GET", "/api/v1/status")
    assert code == 200
    assert isinstance(body, dict)
    return body


async def metrics(c: SimCluster, node_id: str) -> str:
    code, body = await c.api(node_id, "GET", "/metrics")
    assert code == 200 and isinstance(body, str)
    return body


def numbers(messages: Iterable[Received]) -> list[int]:
    """Payloads of the form b"<prefix>:<n>" or b"<n>" as their numbers, in order."""
    return [int(m.payload.rsplit(b":", 1)[-1]) for m in messages]


def check_stream(messages: list[Received], qos: int, sent: int) -> None:
    """Every message once, in order; a QoS 1 repeat only as a DUP resend."""
    seen: list[int] = []
    for m in messages:
        n = int(m.payload.rsplit(b":", 1)[-1])
        if seen and n <= seen[-1]:
            assert qos == 1 and m.dup and n in seen, f"QoS {qos}: {n} after {seen[-1]} (dup={m.dup})"
            continue
        seen.append(n)
    assert seen == list(range(sent)), f"QoS {qos}: missing {sorted(set(range(sent)) - set(seen))[:20]}"
