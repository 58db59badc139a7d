"""Clients and subscriptions listed cluster-wide on a whole simulated cluster in virtual
time (simulation/cluster.py): the API router of one node, called in-process, answers
for every member, and names a member that was killed; once gossip holds it dead, it
says so without asking it."""

from __future__ import annotations

from simulation.cluster import ClusterParams, SimCluster, run_cluster


def test_a_killed_member_is_named_missing_in_virtual_time() -> None:
    async def scenario(cluster: SimCluster) -> None:
        await cluster.wait_converged()
        a, b, c = cluster.node_ids
        for name in (a, b, c):
            client = await cluster.connect(name, f"dev-{name}", session_expiry=600)
            await client.subscribe(f"site/{name}/#", 1)

        status, body = await cluster.api(a, "GET", "/api/v1/clients")
        assert status == 200 and body["missing"] == []
        assert {(r["clientid"], r["node"]) for r in body["data"]} == {(f"dev-{n}", n) for n in (a, b, c)}

        await cluster.kill(c)
        started = cluster.clock.now()
        status, body = await cluster.api(a, "GET", "/api/v1/subscriptions")
        assert status == 200
        assert {(s["clientid"], s["topic"]) for s in body["data"]} == {(f"dev-{a}", f"site/{a}/#"),
                                                                      (f"dev-{b}", f"site/{b}/#")}
        status, body = await cluster.api(a, "GET", f"/api/v1/subscriptions?topic=site/{b}/door")
        assert [(s["clientid"], s["node"]) for s in body["data"]] == [(f"dev-{b}", b)]
        assert [m["node"] for m in body["missing"]] == [c]
        assert cluster.clock.now() - started <= 3.0 + 0.1  # never longer than one query timeout

        await cluster.wait_for(lambda: cluster.gossip(a).member_state(c) == "dead", 60.0, f"{a} holds {c} dead")
        status, body = await cluster.api(a, "GET", "/api/v1/clients")
        assert {r["clientid"] for r in body["data"]} == {f"dev-{a}", f"dev-{b}"}
        assert body["missing"] == [{"node": c, "reason": "dead"}]

    run_cluster(ClusterParams(nodes=3, seed=7), scenario)
