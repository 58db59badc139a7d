"""Rules added through the API of one node apply on every node (cluster config
registers, HLC order), on the cluster simulator: a rule posted on n0 republishes what
a client of n2 publishes to a subscriber on n1; deleted on n1, it stops everywhere; a
node restarted after a change it missed catches up."""

from __future__ import annotations

from simulation.cluster import SimCluster
from tests.cluster_sim.helpers import sim, wait_route

RULE = {"id": "hot", "sql": 'SELECT payload.temp AS t FROM "sensors/+/temp" WHERE t > 30',
        "actions": [{"type": "republish", "topic": "alerts/hot", "payload": "${t}", "qos": 1}]}


async def rule_ids(c: SimCluster, node_id: str) -> list[str]:
    code, body = await c.api(node_id, "GET", "/api/v1/rules")
    assert code == 200 and isinstance(body, dict)
    return [r["id"] for r in body["rules"]]


async def wait_rules(c: SimCluster, expected: list[str], what: str) -> None:
    for _ in range(60):
        if all([await rule_ids(c, n) == expected for n in c.node_ids]):
            return
        await c.run_for(0.5)
    raise AssertionError(f"{what}: rules are {[await rule_ids(c, n) for n in c.node_ids]}")


def test_a_rule_added_on_n0_runs_on_every_node() -> None:
    async def scenario(c: SimCluster) -> None:
        code, body = await c.api("n0", "POST", "/api/v1/rules", RULE)
        assert code == 201, body
        await wait_rules(c, ["hot"], "every node has the rule")
        watcher = await c.connect("n1", "watcher")
        await watcher.subscribe("alerts/#", 1)
        await wait_route(c, "alerts/#", {"n1"})
        sensor = await c.connect("n2", "sensor")
        await sensor.publish("sensors/1/temp", b'{"temp": 20}', qos=1)
        await sensor.publish("sensors/1/temp", b'{"temp": 35}', qos=1)
        await c.wait_for(lambda: len(watcher.received) >= 1, 10, "the alert from n2's rule reaches n1")
        await c.run_for(1.0)
        assert watcher.payloads() == [b"35"]
        code, body = await c.api("n2", "GET", "/api/v1/rules/hot")
        assert body["metrics"]["matched"] == 2 and body["metrics"]["passed"] == 1 and body["source"] == "cluster"

        await c.kill("n2")
        code, body = await c.api("n1", "DELETE", "/api/v1/rules/hot")
        assert code == 200, body
        await c.restart("n2")
        await wait_rules(c, [], "the delete reaches every node, n2 after its restart")
        sensor = await c.connect("n2", "sensor")
        await sensor.publish("sensors/1/temp", b'{"temp": 40}', qos=1)
        await c.run_for(2.0)
        assert watcher.payloads() == [b"35"]

    sim(scenario)


def test_a_rule_a_node_cannot_parse_is_refused_where_it_is_posted() -> None:
    async def scenario(c: SimCluster) -> None:
        code, body = await c.api("n0", "POST", "/api/v1/rules", {**RULE, "sql": "SELECT FROM WHERE"})
        assert code == 400 and "cannot parse the rule's SQL" in body["error"]
        await c.run_for(3.0)
        for n in c.node_ids:
            assert await rule_ids(c, n) == []

    sim(scenario)
