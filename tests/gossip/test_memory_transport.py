"""Real GossipService instances on the in-memory network, in virtual time
(trio.testing.MockClock): the Trio driver itself, deterministic enough for
exact timing bounds, and fast."""

from __future__ import annotations

from typing import Any, Callable

import pytest
import trio
import trio.testing

from gossip.config import LAN
from gossip.formulas import suspicion_bounds
from gossip.service import GossipService
from gossip.trace import NullTraceWriter
from gossip.transport import MemoryNetwork


@pytest.fixture
def mock_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


def view(svc: GossipService) -> dict[str, str]:
    return {m["id"]: m["state"] for m in svc.members()}


async def until(cond: Callable[[], bool], timeout: float) -> float:
    start = trio.current_time()
    with trio.fail_after(timeout):
        while not cond():
            await trio.sleep(0.05)
    return trio.current_time() - start


async def test_lan_cluster_in_virtual_time(mock_clock: trio.testing.MockClock) -> None:
    net = MemoryNetwork(latency=0.002, loss=0.05, seed=1)
    ids = [f"v{i}" for i in range(6)]
    scopes: dict[str, trio.CancelScope] = {}
    services: dict[str, GossipService] = {}
    async with trio.open_nursery() as nursery:
        await nursery.start(net.run)

        async def start(node: str, seeds: list[tuple[str, int]]) -> None:
            svc = GossipService(
                node_id=node, bind_host=node, bind_port=7946, seeds=seeds, mdns=False, trace=NullTraceWriter(),
                preset="lan", transport=net.transport(node), seed=int(node[1:]),
            )
            services[node] = svc
            scope = trio.CancelScope()
            scopes[node] = scope

            async def runner(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
                with scope:
                    await svc.run(task_status=task_status)

            await nursery.start(runner)

        for node in ids:
            await start(node, [] if node == "v0" else [("v0", 7946)])
        took = await until(lambda: all(view(s) == {i: "alive" for i in ids} for s in services.values()), 30)
        assert took < 5.0  # joins are push-pulls: one view within a few virtual seconds

        got: list[object] = []
        services["v2"].on_broadcast("cfg", lambda origin, p: got.append((origin, p)))
        services["v5"].broadcast("cfg", "k", 42)
        assert await until(lambda: got == [("v5", 42)], 10) < 2.0

        # v4 crashes; every other member marks it dead within the formula's bound
        scopes["v4"].cancel()
        net.transports[("v4", 7946)].close()
        lo, hi = suspicion_bounds(LAN.suspicion_mult, LAN.suspicion_max_timeout_mult, 6, LAN.probe_interval)
        others = [s for n, s in services.items() if n != "v4"]
        took = await until(lambda: all(view(s)["v4"] == "dead" for s in others), 120)
        assert lo <= took <= hi + 2 * LAN.probe_interval + 1.0

        # a partition: v0..v2 | v3, v5; each side gives up on the other, then heals
        net.cut(["v0", "v1", "v2"], ["v3", "v5"])
        await until(lambda: view(services["v0"])["v5"] == "dead" and view(services["v5"])["v0"] == "dead", 120)
        net.heal()
        await until(lambda: all(view(services[n])[m] == "alive" for n in ("v0", "v5") for m in ("v0", "v3", "v5")), 120)
        nursery.cancel_scope.cancel()
