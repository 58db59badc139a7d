"""Three real `meshd` processes on 127.0.0.1: the smoke test of the real mesh (TCP
links, real HTTP API and `meshd ctl`, kill -9).  The cluster's behaviour in all its
cases is tested on the simulator (tests/cluster_sim/); this keeps the real transport
and the operator's tools covered end to end."""

from __future__ import annotations

import pytest

from mesh.http_client import request_json
from tests.cluster.test_membership_processes import FAST, view
from tests.support import wait_for
from tests.support import Client, MeshdProcess, free_port, run_cli


def start_cluster(tmp_path, names: str = "ABC", attempts: int = 3,
                  extra: dict[str, tuple[str, ...]] | None = None) -> dict[str, MeshdProcess]:
    """Nodes seeded with the first one's gossip port (`extra`: more flags per node). A
    gossip port is fixed before start (the seeds name it), so another process can take
    it meanwhile: then the whole cluster starts again on fresh ports."""
    for attempt in range(attempts):
        ports = [free_port() for _ in names]
        nodes = {
            name: MeshdProcess(str(tmp_path / f"{name}-{attempt}"), *FAST, "--sys-interval", "0.5", "--seed",
                               f"127.0.0.1:{ports[0]}", *(extra or {}).get(name, ()), http=True,
                               gossip_port=ports[i], node_id=name)
            for i, name in enumerate(names)
        }
        try:
            for n in nodes.values():
                n.start()
            return nodes
        except AssertionError as exc:
            for n in nodes.values():
                n.__exit__()
            if "already in use" not in str(exc) or attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


@pytest.fixture
def cluster3(tmp_path):
    nodes = start_cluster(tmp_path)
    try:
        for n in nodes.values():
            wait_for(lambda n=n: sum(v == "alive" for v in view(n).values()) == 3, what=f"{n.node_id} sees 3 alive")
        yield nodes
    finally:
        for n in nodes.values():
            n.__exit__()


def routes(node: MeshdProcess) -> dict[str, set[str]]:
    status, body = request_json(node.http_addr, "GET", "/api/v1/routes")
    assert status == 200
    return {r["filter"]: set(r["nodes"]) for r in body["routes"]}


def wait_route(nodes, topic_filter: str, owners: set[str]) -> None:
    for n in nodes:
        wait_for(lambda n=n: routes(n).get(topic_filter, set()) == owners, what=f"{n.node_id}: {topic_filter} -> {owners}")


def effective(node: MeshdProcess, key: str):
    status, body = request_json(node.http_addr, "GET", f"/api/v1/config/{key}")
    return body.get("value") if status == 200 else None


def test_forwarding_routes_config_and_kill9_across_processes(cluster3):
    a, b, c = cluster3["A"], cluster3["B"], cluster3["C"]
    # Forwarding over real mesh links: order kept, each message once, at QoS 1 and 2.
    sub = Client("sub-a", version=5)
    sub.connect(a.port)
    sub.subscribe("plant/+/temp", 2)
    wait_route(cluster3.values(), "plant/+/temp", {"A"})
    pub = Client("pub-c", version=5)
    pub.connect(c.port)
    for i in range(20):
        # QoS 1, then QoS 2 (not interleaved: paho hands a QoS 2 message to the
        # application only at its PUBREL, so a QoS 1 one sent after it could come first).
        pub.publish(f"plant/{i}/temp", str(i).encode(), qos=1 if i < 10 else 2)
    got = sub.expect(20)
    assert [m.payload for m in got] == [str(i).encode() for i in range(20)]
    sub.expect_none(0.3)
    # meshd ctl against a real node's API: the route table, a cluster setting set on A
    # and applied on B (config list names its origin), a bad value refused with exit 2.
    out = run_cli(["ctl", "--http", b.http_addr, "routes"])
    assert out.returncode == 0
    assert any(line.split() == ["plant/+/temp", "A"] for line in out.stdout.splitlines())
    out = run_cli(["ctl", "--http", a.http_addr, "config", "set", "max_queued_messages", "3"])
    assert out.returncode == 0, out.stderr
    wait_for(lambda: effective(b, "max_queued_messages") == 3, what="B applies the change")
    listing = run_cli(["ctl", "--http", b.http_addr, "config", "list"])
    assert "max_queued_messages" in listing.stdout and "origin=A" in listing.stdout
    out = run_cli(["ctl", "--http", a.http_addr, "config", "set", "max_inflight", "0"])
    assert out.returncode == 2 and out.stderr.startswith("meshd ctl: max_inflight:")
    # kill -9 of B: its routes go everywhere, and a publish towards them does not hang.
    bsub = Client("b-sub", version=5)
    bsub.connect(b.port)
    bsub.subscribe("b/only", 1)
    wait_route(cluster3.values(), "b/only", {"B"})
    b.kill()
    for n in (a, c):
        wait_for(lambda n=n: "b/only" not in routes(n), what=f"{n.node_id} drops B's routes")
    pub.publish("b/only", b"x", qos=1)
