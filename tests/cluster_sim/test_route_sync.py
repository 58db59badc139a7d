"""Route sync at scale on the simulator: a big table pulled from a peer is applied a
slice at a time, with the node's other tasks (gossip among them) running in between."""

from __future__ import annotations

import gc

import trio
import trio.lowlevel

from routing.cluster import ROUTE_SLICE
from simulation.cluster import SimCluster
from tests.cluster_sim.helpers import sim

ROUTES = 20_000


class _TrieGrowthPerStep(trio.abc.Instrument):
    """How many entries a node's remote trie gained in each uninterrupted task step:
    work done without a checkpoint, during which nothing else on the node can run."""

    def __init__(self, c: SimCluster, node: str) -> None:
        self.table = c.cluster(node).table
        self.size = 0
        self.steps: list[int] = []

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.size = len(self.table.trie)

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        grown = len(self.table.trie) - self.size
        if grown:
            self.steps.append(grown)


def test_a_table_of_20000_routes_pulled_from_a_peer_is_applied_in_slices() -> None:
    async def scenario(c: SimCluster) -> None:
        watch = _TrieGrowthPerStep(c, "n1")
        trio.lowlevel.add_instrument(watch)
        try:
            # Into n0's table without a broadcast: n1 learns them only by pulling them
            # (anti-entropy finds n0's digest ahead), as a new node pulls a whole table.
            c.cluster("n0").table.local_changes(
                (f"fleet/{i % 100}/dev/{i}/+" if i % 5 == 0 else f"fleet/{i % 100}/dev/{i}/temp", True)
                for i in range(ROUTES))
            table = c.cluster("n1").table
            await c.wait_for(lambda: len(table.trie) == ROUTES and not table.unsettled, 60, "n1 holds n0's routes")
        finally:
            trio.lowlevel.remove_instrument(watch)
        assert sum(watch.steps) == ROUTES
        # Applied in one go, this would be one step of 20,000.
        assert max(watch.steps) <= ROUTE_SLICE
        assert len(watch.steps) >= ROUTES // ROUTE_SLICE
        assert table.match_nodes("fleet/7/dev/107/temp") == {"n0"}
        await c.wait_converged()
        # Kept out of the collector's full passes while it was applied, not for ever.
        assert gc.get_freeze_count() == 0

    sim(scenario, nodes=2)
