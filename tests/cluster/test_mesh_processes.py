"""Three real `meshd` processes on 127.0.0.1: clients on different nodes see one broker."""

from __future__ import annotations

import time

import pytest

from mesh.http_client import request_json
from tests.cluster.test_membership_processes import FAST, view, wait_for
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


@pytest.mark.parametrize("qos", [0, 1, 2])
def test_publish_on_c_reaches_subscriber_on_a(cluster3, qos):
    a, c = cluster3["A"], cluster3["C"]
    sub = Client("sub-a", version=5)
    sub.connect(a.port)
    sub.subscribe("plant/+/temp", qos)
    wait_route(cluster3.values(), "plant/+/temp", {"A"})
    pub = Client("pub-c", version=5)
    pub.connect(c.port)
    for i in range(20):
        pub.publish(f"plant/{i}/temp", str(i).encode(), qos=qos)
    got = sub.expect(20)
    assert [m.payload for m in got] == [str(i).encode() for i in range(20)]  # order kept across the hop
    assert {m.qos for m in got} == {qos}
    sub.expect_none(0.3)  # exactly once each, no loops


def test_subscribers_on_two_nodes_and_local_one_all_get_it(cluster3):
    subs = {}
    for name in "ABC":
        subs[name] = Client(f"s-{name}", version=4)
        subs[name].connect(cluster3[name].port)
        subs[name].subscribe("all/#", 1)
    wait_route(cluster3.values(), "all/#", {"A", "B", "C"})
    pub = Client("p", version=5)
    pub.connect(cluster3["B"].port)
    pub.publish("all/x", b"fan", qos=1)
    for s in subs.values():
        assert [m.payload for m in s.expect(1)] == [b"fan"]
        s.expect_none(0.3)


def test_shared_subscription_across_nodes(cluster3):
    members = []
    for name in "AB":
        m = Client(f"worker-{name}", version=5)
        m.connect(cluster3[name].port)
        m.subscribe("$share/workers/jobs/#", 1)
        members.append(m)
    wait_route(cluster3.values(), "$share/workers/jobs/#", {"A", "B"})
    pub = Client("p", version=5)
    pub.connect(cluster3["C"].port)
    for i in range(20):
        pub.publish(f"jobs/{i}", str(i).encode(), qos=1)
    time.sleep(1.0)
    got = [[int(m.payload) for m in s.expect(s.messages.qsize(), timeout=1)] for s in members]
    assert sorted(got[0] + got[1]) == list(range(20))  # each job once, cluster-wide
    assert len(got[0]) == len(got[1]) == 10  # round-robin over the nodes with members


def test_retained_is_cluster_wide(cluster3):
    pub = Client("p", version=5)
    pub.connect(cluster3["C"].port)
    pub.publish("state/valve", b"closed", qos=1, retain=True)
    sub = Client("late", version=5)
    sub.connect(cluster3["A"].port)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        sub.subscribe("state/#", 1)
        if not sub.messages.empty():
            break
        sub.unsubscribe("state/#")
        time.sleep(0.2)
    m = sub.expect(1)[0]
    assert (m.topic, m.payload, m.retain) == ("state/valve", b"closed", True)


def test_unsubscribe_removes_route_everywhere(cluster3):
    sub = Client("u", version=5)
    sub.connect(cluster3["A"].port)
    sub.subscribe("gone/soon", 1)
    wait_route(cluster3.values(), "gone/soon", {"A"})
    sub.unsubscribe("gone/soon")
    for n in cluster3.values():
        wait_for(lambda n=n: "gone/soon" not in routes(n), what=f"{n.node_id} drops gone/soon")


def test_kill9_of_b_removes_its_routes(cluster3):
    sub = Client("b-sub", version=5)
    sub.connect(cluster3["B"].port)
    sub.subscribe("b/only", 1)
    wait_route(cluster3.values(), "b/only", {"B"})
    cluster3["B"].kill()
    for name in "AC":
        wait_for(lambda n=cluster3[name]: "b/only" not in routes(n), what=f"{name} drops B's routes")
    # Publishing towards the dead node's old route does not hang the publisher.
    pub = Client("p", version=5)
    pub.connect(cluster3["A"].port)
    pub.publish("b/only", b"x", qos=1)


def effective(node: MeshdProcess, key: str):
    status, body = request_json(node.http_addr, "GET", f"/api/v1/config/{key}")
    return body.get("value") if status == 200 else None


def test_config_set_on_a_is_applied_on_b_and_c(cluster3):
    out = run_cli(["ctl", "--http", cluster3["A"].http_addr, "config", "set", "max_queued_messages", "3"])
    assert out.returncode == 0, out.stderr
    for n in cluster3.values():
        wait_for(lambda n=n: effective(n, "max_queued_messages") == 3, what=f"{n.node_id} applies the change")
    # Applied for real on C: a persistent session there keeps only 3 queued messages.
    c = cluster3["C"]
    sub = Client("small-q", version=5, clean=False)
    sub.connect(c.port, expiry=600)
    sub.subscribe("cfg/#", 1)
    sub.disconnect()
    pub = Client("p", version=5)
    pub.connect(c.port)
    for i in range(6):
        pub.publish("cfg/x", str(i).encode(), qos=1)
    again = Client("small-q", version=5, clean=False)
    again.connect(c.port, expiry=600)
    assert [m.payload for m in again.expect(3)] == [b"3", b"4", b"5"]
    listing = run_cli(["ctl", "--http", cluster3["B"].http_addr, "config", "list"])
    assert "max_queued_messages" in listing.stdout and "origin=A" in listing.stdout


def test_bad_config_is_refused_where_it_is_set(cluster3):
    out = run_cli(["ctl", "--http", cluster3["A"].http_addr, "config", "set", "max_inflight", "0"])
    assert out.returncode == 2
    assert out.stderr.startswith("meshd ctl: max_inflight:")
    out = run_cli(["ctl", "--http", cluster3["A"].http_addr, "config", "set", "mqtt", "1.2.3.4:1"])
    assert out.returncode == 2 and "not a cluster setting" in out.stderr


def test_concurrent_conflicting_changes_converge(cluster3):
    import threading

    results = []

    def set_on(name, value):
        results.append(run_cli(["ctl", "--http", cluster3[name].http_addr, "config", "set", "max_inflight", value]))

    threads = [threading.Thread(target=set_on, args=(n, v)) for n, v in (("A", "11"), ("B", "22"), ("C", "33"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r.returncode == 0 for r in results)

    def one_value():
        values = {effective(n, "max_inflight") for n in cluster3.values()}
        return values if len(values) == 1 else None

    wait_for(one_value, what="one value everywhere")
    assert one_value() & {11, 22, 33}


def test_ctl_routes(cluster3):
    sub = Client("r", version=5)
    sub.connect(cluster3["B"].port)
    sub.subscribe("ctl/routes/#", 0)
    wait_route(cluster3.values(), "ctl/routes/#", {"B"})
    out = run_cli(["ctl", "--http", cluster3["A"].http_addr, "routes"])
    assert out.returncode == 0
    assert any(line.split() == ["ctl/routes/#", "B"] for line in out.stdout.splitlines())


def test_puback_waits_for_the_remote_node(cluster3):
    """QoS 1 across the hop: the publisher's PUBACK waits for the node that has the
    subscriber (here frozen with SIGSTOP), then comes once that node has it."""
    import signal

    b = cluster3["B"]
    sub = Client("frozen-sub", version=5)
    sub.connect(b.port)
    sub.subscribe("hold/#", 1)
    wait_route(cluster3.values(), "hold/#", {"B"})
    pub = Client("p", version=5)
    pub.connect(cluster3["A"].port)
    b.proc.send_signal(signal.SIGSTOP)
    try:
        info = pub.publish("hold/1", b"wait for me", qos=1, wait=False)
        info.wait_for_publish(0.4)
        assert not info.is_published()
    finally:
        b.proc.send_signal(signal.SIGCONT)
    info.wait_for_publish(10)
    assert info.is_published()
    assert sub.expect(1)[0].payload == b"wait for me"


def test_mesh_metrics_and_sys(cluster3):
    import re
    import urllib.request

    sub = Client("m", version=5)
    sub.connect(cluster3["A"].port)
    sub.subscribe("$SYS/mesh/#", 0)
    sub.subscribe("metrics/x", 1)
    wait_route(cluster3.values(), "metrics/x", {"A"})
    pub = Client("p", version=5)
    pub.connect(cluster3["C"].port)
    pub.publish("metrics/x", b"1", qos=1)
    text = urllib.request.urlopen(f"http://{cluster3['C'].http_addr}/metrics", timeout=5).read().decode()
    samples = dict(re.findall(r"^(meshd_[^\s]+) (\S+)$", text, re.M))
    assert samples['meshd_members{state="alive"}'] == "3"
    assert float(samples["meshd_forwarded_out_total"]) >= 1
    assert float(samples["meshd_routes"]) >= 1
    seen = {}
    deadline = time.monotonic() + 5
    while seen.get("$SYS/mesh/members/count") != b"3" and time.monotonic() < deadline:
        m = sub.expect(1)[0]
        seen[m.topic] = m.payload
    assert seen["$SYS/mesh/members/count"] == b"3"
    assert seen["$SYS/mesh/members"] == b'["A", "B", "C"]'


def test_cluster_wide_acl(cluster3, tmp_path):
    acl = tmp_path / "acl.toml"
    acl.write_text('[[rule]]\npermission = "deny"\naction = "subscribe"\ntopics = ["secret/#"]\n')
    out = run_cli(["ctl", "--http", cluster3["A"].http_addr, "config", "set", "acl", f"@{acl}"])
    assert out.returncode == 0, out.stderr
    for n in cluster3.values():
        wait_for(lambda n=n: effective(n, "acl") is not None, what=f"{n.node_id} has the ACL")
    c = Client("acl-c", version=5)
    c.connect(cluster3["C"].port)
    assert [rc.value for rc in c.subscribe("secret/plans", 1)] == [0x87]
    assert [rc.value for rc in c.subscribe("public/plans", 1)] == [1]
    bad = tmp_path / "bad.toml"
    bad.write_text('[[rule]]\npermission = "maybe"\n')
    out = run_cli(["ctl", "--http", cluster3["A"].http_addr, "config", "set", "acl", f"@{bad}"])
    assert out.returncode == 2 and "acl" in out.stderr
