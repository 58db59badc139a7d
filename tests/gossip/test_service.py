"""Real GossipService instances on 127.0.0.1 (UDP + TCP), in one Trio run."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
import trio

import gossip.__main__ as gossip_main
from gossip.keyring import Keyring, parse_key
from gossip.service import GossipService
from mesh.config import load_settings
from gossip.trace import NullTraceWriter, TraceWriter
from tests.support import until

KEY_A = base64.b64encode(b"A" * 32).decode()
KEY_B = base64.b64encode(b"B" * 32).decode()


class Node:
    def __init__(self, nursery: trio.Nursery, svc: GossipService) -> None:
        self.nursery = nursery
        self.svc = svc
        self.scope = trio.CancelScope()
        self.port = 0

    async def start(self) -> "Node":
        async def runner(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
            with self.scope:
                await self.svc.run(task_status=task_status)

        self.port = await self.nursery.start(runner)
        return self

    def crash(self) -> None:
        self.scope.cancel()  # no leave message: to the others this is kill -9


def make(node_id: str, seeds: list[tuple[str, int]], trace: Any = None, port: int = 0, **kw: Any) -> GossipService:
    return GossipService(
        node_id=node_id, bind_host="127.0.0.1", bind_port=port, seeds=seeds, mdns=False,
        trace=trace if trace is not None else NullTraceWriter(), preset="local", **kw,
    )


def view(svc: GossipService) -> dict[str, str]:
    return {m["id"]: m["state"] for m in svc.members()}


async def test_five_nodes_converge_detect_crash_rejoin_leave(tmp_path: Path) -> None:
    ids = [f"s{i}" for i in range(5)]
    changes: list[tuple[str, str, str]] = []
    got: dict[str, list[tuple[str, object]]] = {i: [] for i in ids}
    merged: list[object] = []
    async with trio.open_nursery() as nursery:
        nodes: dict[str, Node] = {}
        seed: list[tuple[str, int]] = []
        for i in ids:
            svc = make(i, seed, trace=TraceWriter(tmp_path, i))
            svc.on_member_change(lambda m, s, me=i: changes.append((me, m, s)))
            svc.on_broadcast("cfg", lambda origin, p, me=i: got[me].append((origin, p)))
            svc.register_push_pull("routes", lambda me=i: {"from": me}, merged.append)
            assert not svc.has_peers()  # not running yet
            nodes[i] = await Node(nursery, svc).start()
            if i == "s0":
                assert not svc.has_peers()  # alone in its view
            seed = [("127.0.0.1", nodes["s0"].port)]

        # one view everywhere
        await until(lambda: all(view(nodes[i].svc) == {j: "alive" for j in ids} for i in ids))
        assert all(nodes[i].svc.has_peers() for i in ids)
        m = {x["id"]: x for x in nodes["s1"].svc.members()}["s2"]
        assert m["address"] == f"127.0.0.1:{nodes['s2'].port}" and m["last_change_ts_us"] > 0

        # broadcast reaches every other node once
        nodes["s1"].svc.broadcast("cfg", "max_conn", {"v": 10})
        await until(lambda: all(got[i] == [("s1", {"v": 10})] for i in ids if i != "s1"))
        assert got["s1"] == []

        # kill -9 s3: the others mark it dead
        crashed_port = nodes["s3"].port
        nodes["s3"].crash()
        await until(lambda: all(view(nodes[i].svc).get("s3") == "dead" for i in ids if i != "s3"))
        assert ("s0", "s3", "dead") in changes
        dead_inc = {x["id"]: x for x in nodes["s0"].svc.members()}["s3"]["incarnation"]

        # restart it on the same port: it rejoins, with a higher incarnation
        nodes["s3"] = await Node(nursery, make("s3", seed, port=crashed_port)).start()
        await until(lambda: all(view(nodes[i].svc).get("s3") == "alive" for i in ids))
        assert {x["id"]: x for x in nodes["s0"].svc.members()}["s3"]["incarnation"] > dead_inc
        await until(lambda: view(nodes["s3"].svc) == {j: "alive" for j in ids})

        # graceful leave of s4: "left", not "dead"
        await nodes["s4"].svc.leave()
        await until(lambda: all(view(nodes[i].svc).get("s4") == "left" for i in ids if i != "s4"))
        nodes["s4"].crash()
        assert not [c for c in changes if c[1] == "s4" and c[2] == "dead"]

        # push-pull (the joins) carried the registered state both ways
        assert {"from": "s0"} in merged and {"from": "s4"} in merged
        nursery.cancel_scope.cancel()

    records = [json.loads(line) for f in tmp_path.glob("*.jsonl") for line in f.read_text().splitlines()]
    kinds = {r["kind"] for r in records}
    assert {"node_start", "member_alive", "member_dead", "member_left", "broadcast", "node_stop"} <= kinds
    assert all(r["sim"] is False for r in records)
    own = [r for r in records if r["kind"] == "broadcast" and r["hops"] == 0]
    assert len(own) == 1 and own[0]["node"] == "s1" and own[0]["ts_us"] == own[0]["origin_ts_us"]


async def test_cluster_key_keeps_outsiders_out_and_rotates() -> None:
    async with trio.open_nursery() as nursery:
        a = await Node(nursery, make("k0", [], cluster_key=KEY_A)).start()
        seed = [("127.0.0.1", a.port)]
        b = await Node(nursery, make("k1", seed, cluster_key=KEY_A)).start()
        plain = await Node(nursery, make("p0", seed)).start()
        wrong = await Node(nursery, make("w0", seed, cluster_key=KEY_B)).start()
        await until(lambda: set(view(a.svc)) == {"k0", "k1"} and set(view(b.svc)) == {"k0", "k1"})
        await trio.sleep(1.0)
        assert set(view(a.svc)) == {"k0", "k1"}
        assert set(view(plain.svc)) == {"p0"} and set(view(wrong.svc)) == {"w0"}
        assert a.svc.decrypt_failures > 0  # plaintext and foreign-key packets were refused

        # rotation without restart: install B everywhere, switch k0 to it, drop A on k1
        for n in (a, b):
            n.svc.install_key(KEY_B)
        a.svc.use_key(KEY_B)
        b.svc.use_key(KEY_B)
        b.svc.remove_key(KEY_A)
        a.svc.broadcast("cfg", "k", 1)
        got: list[object] = []
        b.svc.on_broadcast("cfg", lambda o, p: got.append(p))
        await until(lambda: got == [1])
        # and now w0 (key B only) can join
        wrong.svc.join([("127.0.0.1", a.port)])
        await until(lambda: "w0" in view(a.svc) and set(view(wrong.svc)) == {"k0", "k1", "w0"})
        nursery.cancel_scope.cancel()


async def test_malformed_datagrams_are_counted_not_fatal() -> None:
    async with trio.open_nursery() as nursery:
        a = await Node(nursery, make("m0", [])).start()
        sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
        with sock:
            for junk in (b"", b"\xff" * 10, b"\xa1\x61v\x02"):
                await sock.sendto(junk, ("127.0.0.1", a.port))
        with trio.fail_after(5):
            while a.svc.stats["malformed"] + a.svc.stats["bad_version"] < 2:
                await trio.sleep(0.05)
        # and a garbage TCP frame is dropped too
        stream = await trio.open_tcp_stream("127.0.0.1", a.port)
        async with stream:
            await stream.send_all(b"\x00\x00\x00\x03abc")
            assert await stream.receive_some(10) == b""
        assert view(a.svc) == {"m0": "alive"}
        nursery.cancel_scope.cancel()


async def test_registered_stream_handler_owns_streams_of_its_frame_type() -> None:
    from gossip import wire

    seen: list[dict] = []

    async def handler(stream: trio.abc.Stream, envelope: dict) -> None:
        seen.append(envelope)
        await stream.send_all(svc.seal_frame(wire.encode_frame_body("link_ok", "k0", {"n": envelope["n"] + 1})))

    svc = make("k0", [], cluster_key=KEY_A)
    svc.register_stream_handler("link_hello", handler)
    async with trio.open_nursery() as nursery:
        node = await Node(nursery, svc).start()
        stream = await trio.open_tcp_stream("127.0.0.1", node.port)
        async with stream:
            await stream.send_all(svc.seal_frame(wire.encode_frame_body("link_hello", "x", {"n": 1})))
            header = await stream.receive_some(4)
            body = b""
            while len(body) < wire.frame_length(header):
                body += await stream.receive_some(65536)
        opened = svc.open_frame(body)
        assert opened is not None and wire.decode_frame_body(opened)["n"] == 2
        assert seen and seen[0]["t"] == "link_hello"
        assert svc.member_address("k0") == ("127.0.0.1", node.port)
        nursery.cancel_scope.cancel()


def test_the_cluster_key_comes_from_the_caller_not_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MESHD_CLUSTER_KEY", KEY_A)
    assert make("x", []).keyring is None  # the service reads no environment
    # the node: mesh.config resolves MESHD_CLUSTER_KEY and hands it over
    settings = load_settings({}, env={"MESHD_CLUSTER_KEY": KEY_A})
    keyring = make("x", [], cluster_key=settings.cluster_key).keyring
    assert keyring is not None
    assert Keyring([parse_key(KEY_A)]).open(keyring.seal(b"hello", b"aad"), b"aad") == b"hello"
    # python -m gossip: the same variable, resolved by its command line
    assert gossip_main.parser().parse_args(["--node-id", "g"]).cluster_key == KEY_A
    assert gossip_main.parser().parse_args(["--node-id", "g", "--cluster-key", KEY_B]).cluster_key == KEY_B

