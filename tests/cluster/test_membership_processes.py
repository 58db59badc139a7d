"""Real `meshd` processes on 127.0.0.1 joined by seeds (real UDP and TCP gossip): one
view, kill -9, rejoin.  Membership in all its cases is tested on the simulator
(tests/cluster_sim/)."""

from __future__ import annotations

from mesh.http_client import request_json
from tests.support import MeshdProcess, free_port, run_cli, wait_for

FAST = ("--gossip-preset", "local")

def view(node: MeshdProcess) -> dict[str, str]:
    status, body = request_json(node.http_addr, "GET", "/api/v1/members")
    assert status == 200
    return {m["id"]: m["state"] for m in body["members"]}

def test_five_nodes_converge_kill9_dead_and_rejoin(tmp_path):
    ports = [free_port() for _ in range(5)]
    nodes = [
        MeshdProcess(str(tmp_path / f"n{i}"), *FAST, "--seed", f"127.0.0.1:{ports[0]}", http=True,
                     gossip_port=ports[i], node_id=f"n{i}")
        for i in range(5)
    ]
    try:
        for n in nodes:
            n.start()
        ids = {f"n{i}" for i in range(5)}
        for n in nodes:
            wait_for(lambda n=n: {k for k, v in view(n).items() if v == "alive"} == ids, what=f"{n.node_id} sees all alive")
        # meshd members prints the same view as a table.
        out = run_cli(["members", "--http", nodes[1].http_addr])
        assert out.returncode == 0, out.stderr
        assert all(f"n{i}" in out.stdout for i in range(5)) and "alive" in out.stdout

        nodes[3].kill()
        for n in nodes[:3] + nodes[4:]:
            wait_for(lambda n=n: view(n).get("n3") == "dead", what=f"{n.node_id} marks n3 dead")
        # Nobody else was declared dead meanwhile.
        for n in nodes[:3] + nodes[4:]:
            assert {k for k, v in view(n).items() if v == "alive"} == ids - {"n3"}

        nodes[3] = MeshdProcess(str(tmp_path / "n3"), *FAST, "--seed", f"127.0.0.1:{ports[0]}", http=True,
                                gossip_port=ports[3], node_id="n3", port=nodes[3].port).start()
        for n in nodes:
            wait_for(lambda n=n: view(n).get("n3") == "alive", what=f"{n.node_id} sees n3 back")
    finally:
        for n in nodes:
            n.__exit__()
