"""Route sync at scale on the simulator: a big table pulled from a peer is applied a
slice at a time, with the node's other tasks (gossip among them) running in between."""

from __future__ import annotations

import gc

import trio
import trio.lowlevel

from routing.cluster import ROUTE_SLICE
from routing.table import RouteTable
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
        assert c.cluster("n1").heap.freezes >= 1
        # Polled on the nodes' own flags: gc.get_freeze_count() walks the whole frozen
        # heap (30 ms each in a busy test worker; 3,500 polls took 106 s of CI).
        await c.wait_for(lambda: not any(c.cluster(n).heap.frozen for n in ("n0", "n1")), 60, "the heap thawed")
        assert gc.get_freeze_count() == 0

    sim(scenario, nodes=2)


class _TrieChangePerStep(trio.abc.Instrument):
    """How many entries the nodes' remote tries (plain and shared) gained or lost in
    each uninterrupted task step."""

    def __init__(self, c: SimCluster, nodes: list[str]) -> None:
        self.tables = [c.cluster(n).table for n in nodes]
        self.sizes = self._sizes()  # (added within a step: its end comes first)
        self.steps: list[int] = []

    def _sizes(self) -> list[int]:
        return [len(t.trie) + len(t.shared_trie) for t in self.tables]

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.sizes = self._sizes()

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        changed = max(abs(now - before) for now, before in zip(self._sizes(), self.sizes))
        if changed:
            self.steps.append(changed)


def test_a_member_with_20000_routes_that_dies_is_held_without_copying_them_and_released_in_slices() -> None:
    """A member declared dead keeps its routes on the others as held routes by
    reference: no step copies or drops its table (at a million routes over 10 nodes,
    every node copied a dead member's 100,000 into a trie of their own in one go, for
    seconds, and more members were declared dead in turn). A message for it is held;
    back with none of its routes, its held ones leave the tries a slice at a time."""

    async def scenario(c: SimCluster) -> None:
        c.cluster("n0").table.local_changes(
            (f"fleet/{i % 100}/dev/{i}/+" if i % 5 == 0 else f"fleet/{i % 100}/dev/{i}/temp", True)
            for i in range(ROUTES))
        others = ["n1", "n2"]
        tables = [c.cluster(n).table for n in others]
        await c.wait_for(lambda: all(len(t.trie) == ROUTES and not t.unsettled for t in tables), 60,
                         "n1 and n2 hold n0's routes")
        pub = await c.connect("n1", "pub")
        watch = _TrieChangePerStep(c, others)
        trio.lowlevel.add_instrument(watch)
        try:
            await c.kill("n0")
            await c.wait_for(lambda: all(c.cluster(n).held.is_held("n0") for n in others), 60, "n0 held dead")
            assert watch.steps == []  # nothing copied, nothing dropped
            assert all(t.match_nodes("fleet/7/dev/107/temp") == {"n0"} and "n0" not in t.remote for t in tables)
            assert await pub.publish("fleet/7/dev/107/temp", b"held", qos=1) == 0
            assert c.cluster("n1").held.counts() == {"n0": 1}
            await c.restart("n0")  # with none of those routes (they were never subscriptions)
            await c.wait_for(lambda: all(len(t.trie) == 0 and not t.unsettled and not t.held for t in tables), 60,
                             "n0's held routes released")
        finally:
            trio.lowlevel.remove_instrument(watch)
        assert sum(watch.steps) >= ROUTES
        assert max(watch.steps) <= ROUTE_SLICE  # released in one go, one step of 20,000
        assert not any(c.cluster(n).held.members for n in others)
        await c.wait_converged()

    sim(scenario, nodes=3)


def test_a_node_that_takes_20000_subscriptions_spreads_them_in_slices() -> None:
    """Local route changes become deltas `ROUTE_SLICE` at a time, the loop free between
    (one delta of 100,000 changes was seconds of one step on a node of a 10-node
    mesh taking its share of a million)."""

    async def scenario(c: SimCluster) -> None:
        table = c.cluster("n0").table
        watch = _LocalRoutesPerStep(table)
        trio.lowlevel.add_instrument(watch)
        try:
            for i in range(ROUTES):
                c.cluster("n0").port.route_changed(f"site/{i % 100}/dev/{i}/+", True)
            other = c.cluster("n1").table
            await c.wait_for(lambda: len(other.trie) == ROUTES and not other.unsettled, 60, "n1 holds n0's routes")
        finally:
            trio.lowlevel.remove_instrument(watch)
        assert sum(watch.steps) == ROUTES
        assert max(watch.steps) <= ROUTE_SLICE
        await c.wait_converged()

    sim(scenario, nodes=2)


class _LocalRoutesPerStep(trio.abc.Instrument):
    def __init__(self, table: RouteTable) -> None:
        self.table = table
        self.size = len(table.local_filters())
        self.steps: list[int] = []

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.size = len(self.table.local_filters())

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        grown = len(self.table.local_filters()) - self.size
        if grown:
            self.steps.append(grown)


def test_a_member_with_20000_routes_declared_dead_while_reachable_comes_back_without_a_pull_of_them() -> None:
    """A member cut off, held dead, then heard again with the same routes: its last
    state is taken back whole (`RouteTable.revive`), so no node's trie changes at all
    and no table is sent again (at a million routes over 10 loaded nodes, every false
    death had each node pull and apply the member's 100,000 routes again, which made
    the next member late: a cascade)."""

    async def scenario(c: SimCluster) -> None:
        c.cluster("n0").table.local_changes((f"fleet/{i % 100}/dev/{i}/temp", True) for i in range(ROUTES))
        others = ["n1", "n2"]
        tables = [c.cluster(n).table for n in others]
        await c.wait_for(lambda: all(len(t.trie) == ROUTES and not t.unsettled for t in tables), 60,
                         "n1 and n2 hold n0's routes")
        states = [t.remote["n0"] for t in tables]
        watch = _TrieChangePerStep(c, others)
        trio.lowlevel.add_instrument(watch)
        try:
            c.cut(["n0"], others)
            await c.wait_for(lambda: all(c.cluster(n).held.is_held("n0") for n in others), 60, "n0 held dead")
            c.heal()
            await c.wait_for(lambda: not any(c.cluster(n).held.members for n in others), 120, "n0 back")
            await c.wait_converged(timeout=60)
        finally:
            trio.lowlevel.remove_instrument(watch)
        assert watch.steps == []
        assert all(t.remote["n0"] is state for t, state in zip(tables, states))  # taken back, not pulled again
        assert all(t.route_count() == ROUTES and t.match_nodes("fleet/7/dev/107/temp") == {"n0"} for t in tables)

    sim(scenario, nodes=3)


def test_a_member_that_changed_500_of_20000_routes_while_held_dead_is_caught_up_by_those_changes_alone() -> None:
    """Deltas a member sent while the others held it dead were refused there: a gap,
    closed by what it changed since the version they took back (from its delta log),
    not by its whole table (at a million routes over 10 loaded nodes, each such gap
    pulled 100,000 routes, and answering those pulls took a quarter of every node)."""

    async def scenario(c: SimCluster) -> None:
        c.cluster("n0").table.local_changes((f"fleet/{i % 100}/dev/{i}/temp", True) for i in range(ROUTES))
        others = ["n1", "n2"]
        tables = [c.cluster(n).table for n in others]
        await c.wait_for(lambda: all(len(t.trie) == ROUTES and not t.unsettled for t in tables), 60,
                         "n1 and n2 hold n0's routes")
        pulled_before = [c.cluster(n).pulled_snapshot_filters for n in others]
        states = [t.remote["n0"] for t in tables]
        c.cut(["n0"], others)
        await c.wait_for(lambda: all(c.cluster(n).held.is_held("n0") for n in others), 60, "n0 held dead")
        for i in range(500):
            c.cluster("n0").port.route_changed(f"late/{i}/+", True)
        await c.wait_for(lambda: len(c.cluster("n0").table.local_filters()) == ROUTES + 500, 10,
                         "n0 took the new routes")
        c.heal()
        await c.wait_for(lambda: not any(c.cluster(n).held.members for n in others), 120, "n0 back")
        await c.wait_converged(timeout=60)
        assert all(t.route_count() == ROUTES + 500 and t.match_nodes("late/7/x") == {"n0"} for t in tables)
        assert all(t.remote["n0"] is state for t, state in zip(tables, states))  # caught up, not replaced
        assert [c.cluster(n).pulled_snapshot_filters for n in others] == pulled_before
        assert all(c.cluster(n).pulled_delta_changes >= 500 for n in others)

    sim(scenario, nodes=3)
