"""Clients and subscriptions listed cluster-wide on three real `meshd` processes: any
node answers for all of them, and names the member that did not answer."""

from __future__ import annotations

from mesh.http_client import request_json
from tests.cluster.test_membership_processes import view
from tests.support import wait_for
from tests.cluster.test_mesh_processes import start_cluster
from tests.support import Client, run_cli


def get(node, path: str) -> dict:
    status, body = request_json(node.http_addr, "GET", path)
    assert status == 200, body
    return body


def test_clients_and_subscriptions_across_three_nodes_with_one_down(tmp_path):
    nodes = start_cluster(tmp_path)
    clients = []
    try:
        for n in nodes.values():
            wait_for(lambda n=n: sum(v == "alive" for v in view(n).values()) == 3, what=f"{n.node_id} sees 3 alive")
        for name, n in nodes.items():
            c = Client(f"dev-{name}", version=5)
            c.connect(n.port, expiry=600)
            c.subscribe(f"site/{name}/#", 1)
            clients.append(c)
        a, c_node = nodes["A"], nodes["C"]

        # Asked on A, every node answers for its own clients.
        body = get(a, "/api/v1/clients")
        assert body["missing"] == []
        assert {(r["clientid"], r["node"], r["connected"]) for r in body["data"]} == {
            ("dev-A", "A", True), ("dev-B", "B", True), ("dev-C", "C", True)}
        assert get(a, "/api/v1/clients/dev-C")["node"] == "C"
        subs = get(a, "/api/v1/subscriptions?topic=site/B/door")
        assert [(s["clientid"], s["node"], s["topic"]) for s in subs["data"]] == [("dev-B", "B", "site/B/#")]
        assert {r["clientid"] for r in get(a, "/api/v1/clients?node=B")["data"]} == {"dev-B"}
        # A kick asked on A reaches the client on B.
        status, body = request_json(a.http_addr, "POST", "/api/v1/clients/dev-B/kick")
        assert (status, body["nodes"]) == (200, ["B"])
        rc, _ = clients[1].disconnects.get(timeout=10)
        assert rc.value == 0x98

        # C goes down hard: A still answers, for A and B, and names C.
        c_node.kill()
        body = get(a, "/api/v1/clients")
        assert {r["clientid"] for r in body["data"]} == {"dev-A", "dev-B"}  # dev-B's session stays after the kick
        assert [m["node"] for m in body["missing"]] == ["C"] and body["missing"][0]["reason"]
        subs = get(a, "/api/v1/subscriptions")
        assert {s["clientid"] for s in subs["data"]} == {"dev-A", "dev-B"}
        assert [m["node"] for m in subs["missing"]] == ["C"]
        status, body = request_json(a.http_addr, "GET", "/api/v1/clients/dev-C")
        assert status == 404 and [m["node"] for m in body["missing"]] == ["C"]

        # The table says so too, and --json gives the same JSON.
        out = run_cli(["ctl", "clients", "list", "--http", a.http_addr])
        assert out.returncode == 0, out.stderr
        assert any(line.split()[:2] == ["dev-B", "B"] for line in out.stdout.splitlines())
        assert "missing: C" in out.stdout
        out = run_cli(["ctl", "subscriptions", "list", "--json", "--http", a.http_addr])
        assert out.returncode == 0, out.stderr
        assert '"node": "C"' in out.stdout

        # Once gossip holds C dead, that is the reason given.
        wait_for(lambda: view(a).get("C") == "dead", what="A holds C dead")
        assert get(a, "/api/v1/clients")["missing"] == [{"node": "C", "reason": "dead"}]
    finally:
        for c in clients:
            c.drop()
        for n in nodes.values():
            n.__exit__()
