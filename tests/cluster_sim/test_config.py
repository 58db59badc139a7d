"""Cluster-wide settings on the simulator: set on one node through its API, applied on
every node, converging on one value when changed concurrently, refused where set when
bad, and kept across a node's restart."""

from __future__ import annotations

from simulation.cluster import SimCluster
from tests.cluster_sim.helpers import sim

ACL = '[[rule]]\npermission = "deny"\naction = "subscribe"\ntopics = ["secret/#"]\n'


async def set_config(c: SimCluster, node_id: str, key: str, value: object) -> tuple[int, object]:
    return await c.api(node_id, "PUT", f"/api/v1/config/{key}", {"value": value})


def effective(c: SimCluster, node_id: str, key: str) -> object:
    """The value the node's broker works with (not only the register the API shows)."""
    return getattr(c.running(node_id).broker.limits, key)


async def config_value(c: SimCluster, node_id: str, key: str) -> object:
    code, body = await c.api(node_id, "GET", f"/api/v1/config/{key}")
    return body.get("value") if code == 200 and isinstance(body, dict) else None


def test_a_setting_changed_on_n0_is_applied_on_every_node() -> None:
    async def scenario(c: SimCluster) -> None:
        code, body = await set_config(c, "n0", "max_queued_messages", 3)
        assert code == 200, body
        await c.wait_for(lambda: all(effective(c, n, "max_queued_messages") == 3 for n in c.node_ids), 10,
                         "every node applies the change")
        # Applied for real on n2: a persistent session there keeps only 3 queued messages.
        sub = await c.connect("n2", "small-q", clean_start=False, session_expiry=600)
        await sub.subscribe("cfg/#", 1)
        await sub.disconnect()
        pub = await c.connect("n2", "p")
        for i in range(6):
            await pub.publish("cfg/x", str(i).encode(), qos=1)
        await sub.reconnect("n2", session_expiry=600)
        await c.wait_for(lambda: len(sub.received) >= 3, 5, "the queued messages")
        await c.run_for(1.0)
        assert sub.payloads() == [b"3", b"4", b"5"]
        code, listing = await c.api("n1", "GET", "/api/v1/config")
        assert code == 200 and isinstance(listing, dict)
        (register,) = [r for r in listing["config"] if r["key"] == "max_queued_messages"]
        assert register["value"] == 3 and register["origin"] == "n0"

    sim(scenario)


def test_a_bad_setting_is_refused_where_it_is_set() -> None:
    async def scenario(c: SimCluster) -> None:
        code, body = await set_config(c, "n0", "max_inflight", 0)
        assert code == 400 and isinstance(body, dict) and body["error"].startswith("max_inflight:")
        code, body = await set_config(c, "n0", "mqtt", "1.2.3.4:1")
        assert code == 400 and isinstance(body, dict) and "not a cluster setting" in body["error"]
        code, body = await set_config(c, "n0", "acl", '[[rule]]\npermission = "maybe"\n')
        assert code == 400 and isinstance(body, dict) and "acl" in body["error"]
        await c.run_for(5.0)
        for n in c.node_ids:  # nothing set cluster-wide: each node keeps its own (default) value
            code, body = await c.api(n, "GET", "/api/v1/config/max_inflight")
            assert code == 200 and isinstance(body, dict) and (body["value"], body["source"]) == (32, "default")

    sim(scenario)


def test_concurrent_conflicting_changes_converge_on_one_value() -> None:
    async def scenario(c: SimCluster) -> None:
        for n, value in (("n0", 11), ("n1", 22), ("n2", 33)):
            code, _ = await set_config(c, n, "max_inflight", value)
            assert code == 200

        def values() -> set[object]:
            return {effective(c, n, "max_inflight") for n in c.node_ids}

        await c.wait_for(lambda: len(values()) == 1, 30, "one value everywhere")
        assert values() <= {11, 22, 33}

    sim(scenario)


def test_the_cluster_wide_acl_is_enforced_on_every_node() -> None:
    async def scenario(c: SimCluster) -> None:
        code, body = await set_config(c, "n0", "acl", ACL)
        assert code == 200, body
        for n in c.node_ids:
            await c.wait_for(lambda n=n: c.running(n).security.acl_generation > 0, 10, f"{n} has the ACL")
        client = await c.connect("n2", "acl-c")
        assert await client.subscribe("secret/plans", 1) == 0x87
        assert await client.subscribe("public/plans", 1) == 1

    sim(scenario)


def test_a_node_restarted_after_a_change_it_missed_catches_up() -> None:
    async def scenario(c: SimCluster) -> None:
        await c.kill("n2")
        code, _ = await set_config(c, "n0", "max_queued_messages", 7)
        assert code == 200
        await c.restart("n2")
        await c.wait_for(lambda: all(effective(c, n, "max_queued_messages") == 7 for n in c.node_ids), 30,
                         "n2 catches up")
        # And a node keeps what it learned across its own restart.
        await c.kill("n1")
        await c.restart("n1")
        assert effective(c, "n1", "max_queued_messages") == 7

    sim(scenario)


def test_the_winning_change_spreads_even_when_the_losing_one_is_sent_later() -> None:
    """n1's wall clock runs 5 s ahead: its change wins by HLC although n0's is made a
    little later.  Gossip replaces a broadcast by send time: were both changes under one
    key, n0's later, losing one would stop n1's from spreading, and nodes would hold
    the wrong value until push-pull (30 s).  Keyed per node, the winner is everywhere
    within a few gossip rounds."""

    async def scenario(c: SimCluster) -> None:
        c.skew("n1", 5.0)
        code, _ = await set_config(c, "n1", "max_inflight", 22)
        assert code == 200
        await c.run_for(0.005)  # n1's change is on its way, not yet everywhere
        code, _ = await set_config(c, "n0", "max_inflight", 11)
        assert code == 200
        await c.wait_for(lambda: all(effective(c, n, "max_inflight") == 22 for n in c.node_ids), 5,
                         "the winning value everywhere")

    sim(scenario, nodes=5)
