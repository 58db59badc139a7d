"""TLS on node-to-node streams (cluster_tls_cert/key/ca): settings refused at start
when incomplete or unreadable; TlsStreams over the in-memory network (mutual
verification, refusals logged); and real meshd processes that form a mesh over TLS and
refuse a node whose certificate comes from another CA."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio
import trio.testing
import trustme

from gossip.memory_network import MemoryNetwork
from gossip.transport import StreamTls, TlsStreams
from mesh.compose import cluster_stream_tls
from mesh.config import ConfigError
from mesh.http_client import request_json
from mesh.tls import cluster_contexts
from tests.support import Client, MeshdProcess, free_port, node_settings, run_cli, until, wait_for


@dataclass
class NodeCert:
    cert: str
    key: str
    ca: str

    def flags(self) -> tuple[str, ...]:
        return ("--cluster-tls-cert", self.cert, "--cluster-tls-key", self.key, "--cluster-tls-ca", self.ca)

    def stream_tls(self) -> StreamTls:
        server, client = cluster_contexts(self.cert, self.key, self.ca)
        return StreamTls(server=server, client=client, handshake_timeout=5.0)


def issue(ca: trustme.CA, tmp: Path, name: str) -> NodeCert:
    leaf = ca.issue_cert("127.0.0.1", common_name=name)
    cert, key, ca_file = tmp / f"{name}.pem", tmp / f"{name}.key", tmp / f"{name}-ca.pem"
    leaf.private_key_pem.write_to_path(str(key))
    leaf.cert_chain_pems[0].write_to_path(str(cert))
    ca.cert_pem.write_to_path(str(ca_file))
    return NodeCert(str(cert), str(key), str(ca_file))


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, NodeCert]:
    tmp = tmp_path_factory.mktemp("cluster-pki")
    cluster_ca, other_ca = trustme.CA(), trustme.CA()
    return {
        "A": issue(cluster_ca, tmp, "A"),
        "B": issue(cluster_ca, tmp, "B"),
        "intruder": issue(other_ca, tmp, "intruder"),  # the right form, the wrong CA
    }


# --- settings ------------------------------------------------------------------------


def test_all_three_settings_or_none(tmp_path: Path, certs: dict[str, NodeCert]) -> None:
    a = certs["A"]
    assert cluster_stream_tls(node_settings(str(tmp_path))) is None
    tls = cluster_stream_tls(node_settings(str(tmp_path), cluster_tls_cert=a.cert, cluster_tls_key=a.key,
                                           cluster_tls_ca=a.ca))
    assert tls is not None
    cases: list[tuple[dict[str, str], str, str]] = [
        ({"cluster_tls_cert": a.cert}, "cluster_tls_key", "needs all of"),
        ({"cluster_tls_cert": a.cert, "cluster_tls_key": a.key}, "cluster_tls_ca", "needs all of"),
        ({"cluster_tls_ca": a.ca}, "cluster_tls_cert", "needs all of"),
        ({"cluster_tls_cert": str(tmp_path / "nope.pem"), "cluster_tls_key": a.key, "cluster_tls_ca": a.ca},
         "cluster_tls_cert", "no such file"),
        ({"cluster_tls_cert": a.cert, "cluster_tls_key": a.cert, "cluster_tls_ca": a.ca},
         "cluster_tls_key", "no private key found"),
        ({"cluster_tls_cert": a.cert, "cluster_tls_key": a.key, "cluster_tls_ca": str(tmp_path)},
         "cluster_tls_ca", "is a directory"),
        ({"cluster_tls_cert": a.cert, "cluster_tls_key": certs["B"].key, "cluster_tls_ca": a.ca},
         "cluster_tls_key", "does not belong to the certificate"),
    ]
    for given, key, words in cases:
        with pytest.raises(ConfigError) as caught:
            cluster_stream_tls(node_settings(str(tmp_path), **given))
        assert caught.value.key == key and words in caught.value.message, (given, caught.value)


def test_meshd_refuses_to_start_naming_the_key(tmp_path: Path, certs: dict[str, NodeCert]) -> None:
    # the environment and the TOML file are read like every other setting
    toml = tmp_path / "meshd.toml"
    toml.write_text(f'cluster_tls_cert = "{certs["A"].cert}"\n')
    out = run_cli(["--config", str(toml), "--data-dir", str(tmp_path), "--mqtt", "127.0.0.1:0", "--ws", "off",
                   "--http", "off", "--gossip", "127.0.0.1:0", "--no-mdns", "--cluster-tls-key", certs["A"].key])
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith("meshd: config error: cluster_tls_ca: ")


# --- TlsStreams over the in-memory network (virtual time) ----------------------------


@pytest.fixture
def mock_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


async def test_tls_streams_verify_both_sides(certs: dict[str, NodeCert], caplog: pytest.LogCaptureFixture,
                                             mock_clock: trio.testing.MockClock) -> None:
    caplog.set_level(logging.DEBUG, logger="meshd.transport")
    net = MemoryNetwork(latency=0.01, jitter=0.0)
    served: list[bytes] = []

    async def echo(stream: trio.abc.Stream) -> None:
        data = await stream.receive_some()
        served.append(data)
        await stream.send_all(data.upper())

    async with trio.open_nursery() as nursery:
        await nursery.start(net.run)
        server = TlsStreams(net.transport("b"), certs["B"].stream_tls())
        nursery.start_soon(server.serve_streams, echo)

        # a member: both certificates chain to the cluster CA
        member = TlsStreams(net.transport("a"), certs["A"].stream_tls())
        stream = await member.open_stream(("b", 7946))
        assert isinstance(stream, trio.SSLStream)
        await stream.send_all(b"hello")
        assert await stream.receive_some() == b"HELLO"
        assert served == [b"hello"]
        peer = stream.getpeercert()
        assert peer and ("commonName", "B") in [rdn[0] for rdn in peer["subject"]]

        # a certificate from another CA: the intruder's side refuses the server, and
        # the server refuses the intruder; both say so
        intruder = TlsStreams(net.transport("x"), certs["intruder"].stream_tls())
        with pytest.raises(OSError, match="TLS handshake with b:7946 failed"):
            await intruder.open_stream(("b", 7946))
        # no TLS at all: plain frames to a TLS port are refused
        plain = await net.transport("p").open_stream(("b", 7946))
        await plain.send_all(b"\x00\x00\x00\x05hello")
        await until(lambda: len([r for r in caplog.records if "refused a node-to-node stream" in r.getMessage()]) >= 2, 10)
        refused = [r for r in caplog.records if "refused a node-to-node stream" in r.getMessage()]
        assert {re.sub(r"^refused a node-to-node stream from (\S+): .*", r"\1", r.getMessage())
                for r in refused} == {"x:7946", "p:7946"}
        assert all(r.levelno == logging.WARNING for r in refused)
        client_side = [r for r in caplog.records if "TLS handshake with b:7946 failed" in r.getMessage()]
        assert len(client_side) == 1 and client_side[0].levelno == logging.WARNING
        assert served == [b"hello"]
        nursery.cancel_scope.cancel()


# --- real processes ------------------------------------------------------------------


class LogLines:
    """A node's output so far, line by line (MeshdProcess logs to a file)."""

    def __init__(self, node: MeshdProcess) -> None:
        self.node = node

    def has(self, words: str) -> bool:
        return any(words in line for line in self.node.output().splitlines())


def alive(node: MeshdProcess) -> set[str]:
    status, body = request_json(node.http_addr, "GET", "/api/v1/members")
    assert status == 200
    return {m["id"] for m in body["members"] if m["state"] == "alive"}


def routes(node: MeshdProcess) -> dict[str, set[str]]:
    status, body = request_json(node.http_addr, "GET", "/api/v1/routes")
    assert status == 200
    return {r["filter"]: set(r["nodes"]) for r in body["routes"]}


def test_two_nodes_mesh_over_tls_and_refuse_another_ca(tmp_path: Path, certs: dict[str, NodeCert]) -> None:
    fast = ("--gossip-preset", "local")
    ports = {name: free_port() for name in ("A", "B", "X")}
    seed = ("--seed", f"127.0.0.1:{ports['A']}")
    nodes = {
        name: MeshdProcess(str(tmp_path / name), *fast, *seed, *certs[cert].flags(), http=True,
                           gossip_port=ports[name], node_id=name)
        for name, cert in (("A", "A"), ("B", "B"), ("X", "intruder"))
    }
    try:
        a, b = nodes["A"].start(), nodes["B"].start()
        assert a.proc is not None
        log_a = LogLines(a)
        wait_for(lambda: alive(a) == {"A", "B"} and alive(b) == {"A", "B"}, 30.0, "A and B see each other")

        sub = Client("tls-sub", version=5, clean=False)
        sub.connect(a.port, expiry=600)
        sub.subscribe("secure/#", 1)
        wait_for(lambda: routes(b).get("secure/#") == {"A"}, 30.0, "B learns A's route")
        pub = Client("tls-pub", version=5)
        pub.connect(b.port)
        for i in range(5):
            pub.publish(f"secure/{i}", str(i).encode(), qos=1)  # returns at the PUBACK
        got = sub.expect(5)
        assert [m.payload for m in got] == [str(i).encode() for i in range(5)]
        assert {m.qos for m in got} == {1}
        assert not log_a.has("refused a node-to-node stream")

        # X has a certificate of the right form from another CA: its join (a push-pull
        # stream) and any link it tries are refused, and both ends log it
        x = nodes["X"].start()
        assert x.proc is not None
        log_x = LogLines(x)
        wait_for(lambda: log_a.has("refused a node-to-node stream from 127.0.0.1"), 30.0, "A logs the refusal")
        wait_for(lambda: log_x.has(f"TLS handshake with 127.0.0.1:{ports['A']} failed"), 30.0, "X logs its failure")
        assert alive(x) == {"X"} and "secure/#" not in routes(x)  # it learned nothing
        assert alive(a) == {"A", "B"}
        pub.publish("secure/after", b"still", qos=1)
        assert [m.payload for m in sub.expect(1)] == [b"still"]
        sub.disconnect()
        pub.disconnect()
    finally:
        for n in nodes.values():
            n.__exit__()
