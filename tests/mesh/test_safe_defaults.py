"""What a node says and refuses at start-up (README "Safe defaults"), its ready file,
and the `$SYS` retained messages counted apart from the users'."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from mesh.compose import build_node
from mesh.http_client import request_json
from tests.support import Client, RunningNode, node_settings, run_cli

WARNING_TEXT = "without an admin token"


def api_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and WARNING_TEXT in r.getMessage()]


def test_api_beyond_loopback_without_token_warns_how_to_set_one(node_factory, caplog):
    caplog.set_level(logging.INFO)
    node = node_factory(http="0.0.0.0:0")  # the command line still works: the node starts
    (line,) = api_warnings(caplog)
    assert "0.0.0.0" in line and "--api-token-file" in line and "MESHD_API_TOKEN_FILE" in line
    status, _ = request_json(f"127.0.0.1:{node.ports['http']}", "GET", "/api/v1/status")
    assert status == 200


@pytest.mark.parametrize("overrides", [{"http": "127.0.0.1:0"}, {"http": "0.0.0.0:0", "api_token": "t0ken-x"}])
def test_api_on_loopback_or_with_a_token_does_not_warn(node_factory, caplog, overrides):
    caplog.set_level(logging.INFO)
    node_factory(**overrides)
    assert api_warnings(caplog) == []
    assert "t0ken-x" not in caplog.text


@pytest.mark.parametrize(
    "content, says",
    [
        (b"\xff\xfe\x00bad", "is not UTF-8 text"),
        (b"", "holds nothing, not a node id"),
        (b"not an id!\n", "holds 'not an id!', not a node id"),
    ],
)
def test_a_bad_node_id_file_is_one_line_naming_it_exit_2(tmp_path: Path, content: bytes, says: str):
    data = tmp_path / "data"
    data.mkdir()
    (data / "node_id").write_bytes(content)
    out = run_cli(["--data-dir", str(data), "--mqtt", "127.0.0.1:0", "--ws", "off", "--http", "off",
                   "--gossip", "127.0.0.1:0", "--no-mdns", "--no-trace"])
    assert out.returncode == 2
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith(f"meshd: config error: node_id: {data / 'node_id'} {says}")
    assert "--node-id" in line


def test_mdns_port_from_flag_env_and_toml_reaches_discovery(tmp_path: Path):
    from mesh.cli import build_parser
    from mesh.config import flags_from_namespace, load_settings

    flags = flags_from_namespace(build_parser().parse_args(["--mdns-port", "5454"]))
    assert load_settings(flags, env={}).mdns_port == 5454
    toml = tmp_path / "meshd.toml"
    toml.write_text("mdns_port = 15353\n")
    assert node_settings(str(tmp_path), config=str(toml)).mdns_port == 15353
    assert load_settings({}, env={"MESHD_MDNS_PORT": "25353"}).mdns_port == 25353
    settings = node_settings(str(tmp_path / "n"), mdns_port=35353)
    assert build_node(settings).gossip.mdns_port == 35353
    assert node_settings(str(tmp_path)).mdns_port == 5353


def test_ready_file_holds_the_bound_ports_and_goes_on_a_clean_stop(tmp_path: Path):
    ready = tmp_path / "ready.json"
    ready.write_text("left by an earlier run")
    node = RunningNode(node_settings(str(tmp_path / "n"), ready_file=str(ready))).start()
    try:
        info = json.loads(ready.read_text())
        assert info["ports"] == node.ports and set(info["ports"]) == {"gossip", "mqtt", "ws", "http"}
        assert info["node_id"] == "test-node" and info["pid"] == os.getpid()
        c = Client("r", version=5)
        c.connect(info["ports"]["mqtt"])  # bound when the file says so
        c.disconnect()
    finally:
        node.stop()
    assert not ready.exists()


def test_status_counts_sys_retained_messages_apart(node_factory):
    node = node_factory(sys_interval=3600)  # one $SYS round at start-up
    http = f"127.0.0.1:{node.ports['http']}"
    _, before = request_json(http, "GET", "/api/v1/status")
    assert before["retained_messages"] == 0 and before["sys_retained_messages"] > 10
    c = Client("p", version=5)
    c.connect(node.mqtt_port)
    c.publish("user/state", b"on", qos=1, retain=True)
    c.disconnect()
    _, after = request_json(http, "GET", "/api/v1/status")
    assert after["retained_messages"] == 1 and after["sys_retained_messages"] == before["sys_retained_messages"]
