"""Bridge tables: what is refused, naming the key; the node refuses a bad one at start."""

from __future__ import annotations

import json
from typing import Any

import pytest

from bridges.config import BridgeConfigError, parse_bridge
from mesh.bridging import bridge_configs
from mesh.config import ConfigError
from tests.support import node_settings, run_cli


def test_a_full_mqtt_table() -> None:
    c = parse_bridge({"id": "cloud", "type": "mqtt", "url": "mqtts://broker.example:8883", "egress": ["a/#"],
                      "ingress": ["cmd/+"], "remote_prefix": "site1/", "protocol_version": "5",
                      "username": "u", "password": "p", "queue_max_bytes": 4096, "clean_start": True})
    assert (c.host, c.port, c.tls, c.protocol_version, c.egress, c.ingress) == (
        "broker.example", 8883, True, 5, ("a/#",), ("cmd/+",))
    assert c.as_table()["password"] == "***"
    assert parse_bridge({"id": "h", "type": "http", "url": "http://127.0.0.1/x?y=1", "egress": "a"}).path == "/x?y=1"


@pytest.mark.parametrize("table, key", [
    ({"type": "mqtt", "url": "mqtt://h"}, "id"),
    ({"id": "a b", "type": "mqtt", "url": "mqtt://h"}, "id"),
    ({"id": "a", "type": "kafka", "url": "mqtt://h"}, "type"),
    ({"id": "a", "type": "mqtt", "url": "http://h"}, "url"),
    ({"id": "a", "type": "mqtt", "url": "mqtt://h:99999"}, "url"),
    ({"id": "a", "type": "mqtt", "url": "mqtt://h", "egress": ["a/#/b"]}, "egress"),
    ({"id": "a", "type": "mqtt", "url": "mqtt://h", "queue_max_bytes": "lots"}, "queue_max_bytes"),
    ({"id": "a", "type": "mqtt", "url": "mqtt://h", "protocol_version": 3}, "protocol_version"),
    ({"id": "a", "type": "mqtt", "url": "mqtt://h", "remote_prefix": "x/#"}, "remote_prefix"),
    ({"id": "a", "type": "http", "url": "http://h", "ingress": ["x"]}, "ingress"),
    ({"id": "a", "type": "mqtt", "url": "mqtt://h", "egres": ["x"]}, "egres"),
])
def test_refused_naming_the_key(table: dict[str, Any], key: str) -> None:
    with pytest.raises(BridgeConfigError) as info:
        parse_bridge(table)
    assert info.value.key == key


def test_the_node_names_the_bridge_and_key(tmp_path: Any) -> None:
    settings = node_settings(str(tmp_path), bridges=json.dumps([
        {"id": "ok", "type": "mqtt", "url": "mqtt://127.0.0.1:1"},
        {"id": "bad", "type": "mqtt", "url": "mqtt://127.0.0.1:1", "queue_max_bytes": 0},
    ]))
    with pytest.raises(ConfigError) as info:
        bridge_configs(settings)
    assert info.value.key == "bridges[1].queue_max_bytes"


def test_meshd_refuses_a_bad_bridges_table_at_start(tmp_path: Any) -> None:
    config = tmp_path / "meshd.toml"
    config.write_text('[[bridges]]\nid = "cloud"\ntype = "mqtt"\nurl = "ftp://example"\n')
    result = run_cli(["run", "--config", str(config), "--data-dir", str(tmp_path / "d"), "--mqtt", "127.0.0.1:0",
                      "--http", "off", "--ws", "off", "--gossip", "127.0.0.1:0", "--no-mdns"])
    assert result.returncode == 2
    assert "bridges[0].url" in result.stderr
