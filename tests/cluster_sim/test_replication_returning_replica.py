"""A replica that was down during a takeover comes back with its copy (issue 29 step
7: messages only one copy holds are merged into the current owner's queue without
duplicates).  The owner and its only replica went down together: the client's
reconnect elsewhere found no copy (a new session, the owner's claim superseded).
When the replica restarts, its copy holds acknowledged messages the new owner lacks:
it offers the copy to the new owner (`repl_merge`), which merges it as the takeover
would have had the replica been up, instead of the copy being dropped."""

from __future__ import annotations

from simulation.cluster import SimCluster
from tests.cluster_sim.helpers import numbers, sim, wait_route
from tests.cluster_sim.test_replication import EXPIRY, replication

COUNT = 20


def test_a_replica_down_during_the_takeover_merges_its_copy_into_the_new_owners_session() -> None:
    async def scenario(c: SimCluster) -> None:
        sub = await c.connect("n0", "back-sub", clean_start=False, session_expiry=EXPIRY)
        await sub.subscribe("back/q", 1)
        await wait_route(c, "back/q", {"n0"})
        await c.wait_for(lambda: bool((replication(c, "n0").describe("back-sub") or {}).get("replicas")), 10,
                         "a replica")
        view = replication(c, "n0").describe("back-sub")
        assert view is not None
        replica = view["replicas"][0]["node"]
        taker = next(n for n in c.node_ids if n not in ("n0", replica))
        await sub.disconnect()
        pub = await c.connect(taker, "back-pub")
        for i in range(COUNT):
            assert await pub.publish("back/q", str(i).encode(), qos=1) == 0  # on the replica's disk too
        await c.kill(replica)
        await c.kill("n0")  # before a new copy could be made elsewhere
        await c.wait_for(lambda: not {"n0", replica} & set(c.gossip(taker).alive_members()), 30,
                         "both seen dead")
        await sub.reconnect(taker, session_expiry=EXPIRY)
        assert not sub.session_present  # no copy anywhere: a new session
        await sub.subscribe("back/q", 1)
        await c.restart(replica)
        # At once if the new owner places its copy there (its snapshot replaces this
        # one), else when the copy is collected (a minute after the newer claim).
        await c.wait_for(lambda: set(numbers(sub.received)) >= set(range(COUNT)), 100,
                         "the acknowledged messages from the returning replica's copy")
        await c.run_for(10.0)
        assert sorted(numbers(sub.received)) == list(range(COUNT))  # once each

    sim(scenario, nodes=4, session_replicas=2)
