"""Membership of whole nodes on the simulator: one view, kill -9 seen as dead (and
nobody else), a restart seen alive again, a graceful stop seen as a leave."""

from __future__ import annotations

from simulation.cluster import SimCluster
from tests.cluster_sim.helpers import sim


def states(c: SimCluster, observer: str) -> dict[str, str]:
    return {m["id"]: m["state"] for m in c.gossip(observer).members()}


def test_five_nodes_converge_a_killed_one_is_dead_and_comes_back_alive() -> None:
    async def scenario(c: SimCluster) -> None:
        ids = set(c.node_ids)
        for n in c.node_ids:
            assert {k for k, v in states(c, n).items() if v == "alive"} == ids
        await c.kill("n3")
        others = [n for n in c.node_ids if n != "n3"]
        await c.wait_for(lambda: all(states(c, n).get("n3") == "dead" for n in others), 60, "n3 dead everywhere")
        for n in others:  # nobody else was declared dead meanwhile
            assert {k for k, v in states(c, n).items() if v == "alive"} == ids - {"n3"}
        await c.restart("n3")
        await c.wait_for(lambda: all(states(c, n).get("n3") == "alive" for n in c.node_ids), 60, "n3 back")
        await c.wait_converged()
        # The API shows the same view as the members table.
        code, body = await c.api("n1", "GET", "/api/v1/members")
        assert code == 200 and isinstance(body, dict)
        assert {m["id"]: m["state"] for m in body["members"]} == {n: "alive" for n in c.node_ids}

    sim(scenario, nodes=5)


def test_a_graceful_stop_is_a_leave_not_a_death() -> None:
    async def scenario(c: SimCluster) -> None:
        await c.stop("n2")
        await c.wait_for(lambda: states(c, "n0").get("n2") == "left", 30, "n2 left")
        await c.run_for(30.0)
        assert states(c, "n0").get("n2") == "left" and states(c, "n1").get("n2") == "left"

    sim(scenario)


def test_a_restarted_node_takes_a_new_route_epoch_and_its_old_routes_go() -> None:
    async def scenario(c: SimCluster) -> None:
        sub = await c.connect("n1", "clean-sub")
        await sub.subscribe("old/#", 1)
        await c.wait_converged()
        epoch = c.cluster("n1").epoch
        await c.kill("n1")
        await c.restart("n1")
        assert c.cluster("n1").epoch == epoch + 1
        await c.wait_converged(timeout=60)  # the clean session is gone, and so is its route
        assert all("old/#" not in c.cluster(n).table.routes() for n in c.node_ids)

    sim(scenario)
