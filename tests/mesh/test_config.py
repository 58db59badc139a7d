"""Settings: precedence, parsing, validation errors, node id, argparse flags."""

from __future__ import annotations

import argparse
import dataclasses
import re

import pytest

from mesh.config import (
    SETTINGS,
    ConfigError,
    HostPort,
    Settings,
    add_setting_arguments,
    flags_from_namespace,
    load_settings,
    parse_host_port,
    resolve_node_id,
)


def parse_flags(argv: list[str]) -> dict[str, object]:
    parser = argparse.ArgumentParser()
    add_setting_arguments(parser)
    return flags_from_namespace(parser.parse_args(argv))


def test_defaults_match_the_table() -> None:
    s = load_settings({}, env={})
    assert s == Settings()
    assert s.node_id is None
    assert s.data_dir == "./meshd-data"
    assert s.mqtt == HostPort("0.0.0.0", 1883)
    assert s.ws == HostPort("0.0.0.0", 8083)
    assert s.ws_path == "/mqtt"
    assert s.http == HostPort("127.0.0.1", 18083)
    assert s.gossip == HostPort("0.0.0.0", 7946)
    assert s.seed == ()
    assert s.mdns is True and s.trace is True and s.retain_available is True
    assert s.queue_qos0 is False
    assert s.cluster_name == "meshd" and s.cluster_key is None
    assert s.log_level == "info"
    assert (s.max_keepalive, s.max_packet_size, s.receive_maximum, s.max_inflight) == (65535, 1048576, 1024, 32)
    assert (s.max_queued_messages, s.topic_alias_maximum) == (1000, 64)
    assert (s.connect_timeout, s.sys_interval, s.shutdown_timeout) == (10.0, 10.0, 5.0)
    assert (s.durability, s.durability_batch_ms) == ("sync", 50)
    # One table row per dataclass field.
    assert [x.name for x in SETTINGS] == [f.name for f in dataclasses.fields(Settings) if f.name != "origins"]


def test_precedence_flag_env_toml_default(tmp_path) -> None:
    cfg = tmp_path / "meshd.toml"
    cfg.write_text('max_inflight = 7\nreceive_maximum = 9\ntopic_alias_maximum = 11\n')
    env = {"MESHD_MAX_INFLIGHT": "8", "MESHD_RECEIVE_MAXIMUM": "10"}
    s = load_settings({"config": str(cfg), "max_inflight": "6"}, env=env)
    assert s.max_inflight == 6  # flag beats env and TOML
    assert s.receive_maximum == 10  # env beats TOML
    assert s.topic_alias_maximum == 11  # TOML beats default
    assert s.max_packet_size == 1048576  # default


def test_config_path_from_env(tmp_path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('cluster_name = "blue"\n')
    assert load_settings({}, env={"MESHD_CONFIG": str(cfg)}).cluster_name == "blue"
    # --config wins over MESHD_CONFIG.
    other = tmp_path / "d.toml"
    other.write_text('cluster_name = "green"\n')
    s = load_settings({"config": str(other)}, env={"MESHD_CONFIG": str(cfg)})
    assert s.cluster_name == "green"


def test_toml_native_types_and_seed_list(tmp_path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        "\n".join(
            [
                'seed = ["10.0.0.1:7946", "[fe80::1]:7946"]',
                "mdns = false",
                'mqtt = "off"',
                "connect_timeout = 3",
                "sys_interval = 0.5",
                'durability = "batch"',
                'node-id = "n1"',  # dashes are accepted for underscores
            ]
        )
    )
    s = load_settings({"config": str(cfg)}, env={})
    assert s.seed == (HostPort("10.0.0.1", 7946), HostPort("fe80::1", 7946))
    assert s.mdns is False and s.mqtt is None
    assert s.connect_timeout == 3.0 and s.sys_interval == 0.5
    assert s.durability == "batch" and s.node_id == "n1"


def test_seed_from_env_and_repeated_flags() -> None:
    s = load_settings({}, env={"MESHD_SEED": "a:1, b:2,,a:1"})
    assert s.seed == (HostPort("a", 1), HostPort("b", 2))
    flags = parse_flags(["--seed", "h1:7946", "--seed", "h2:7000,h3:1"])
    assert load_settings(flags, env={}).seed == (HostPort("h1", 7946), HostPort("h2", 7000), HostPort("h3", 1))
    assert load_settings({}, env={"MESHD_SEED": ""}).seed == ()


@pytest.mark.parametrize(
    "text,value",
    [("true", True), ("1", True), ("YES", True), ("on", True), ("false", False), ("0", False), ("No", False), ("off", False)],
)
def test_bool_spellings(text: str, value: bool) -> None:
    assert load_settings({}, env={"MESHD_QUEUE_QOS0": text}).queue_qos0 is value


def test_off_disables_listeners_but_not_gossip() -> None:
    s = load_settings({"mqtt": "off", "ws": "OFF", "http": "off"}, env={})
    assert (s.mqtt, s.ws, s.http) == (None, None, None)
    with pytest.raises(ConfigError) as e:
        load_settings({"gossip": "off"}, env={})
    assert e.value.key == "gossip"


@pytest.mark.parametrize(
    "text,expected",
    [
        ("127.0.0.1:1883", HostPort("127.0.0.1", 1883)),
        ("localhost:0", HostPort("localhost", 0)),
        ("[::1]:1883", HostPort("::1", 1883)),
        ("node-1.example:65535", HostPort("node-1.example", 65535)),
    ],
)
def test_parse_host_port_ok(text: str, expected: HostPort) -> None:
    hp = parse_host_port("k", text)
    assert hp == expected
    assert parse_host_port("k", str(hp)) == hp  # __str__ round-trips


def test_host_port_str() -> None:
    assert str(HostPort("::1", 1883)) == "[::1]:1883"
    assert str(HostPort("0.0.0.0", 7946)) == "0.0.0.0:7946"


@pytest.mark.parametrize(
    "text",
    ["x", ":1883", "host:", "host:65536", "host:-1", "host:abc", "::1:1883", "[::1]1883", "[1.2.3.4]:1", "bad host:1", "a..b:1"],
)
def test_parse_host_port_errors(text: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_host_port("mqtt", text)
    assert e.value.key == "mqtt"
    assert str(e.value).startswith("mqtt: bad address ")
    assert "\n" not in str(e.value)


def test_error_message_names_key_and_expectation() -> None:
    with pytest.raises(ConfigError) as e:
        load_settings({"mqtt": "x"}, env={})
    assert str(e.value) == "mqtt: bad address 'x' (expected HOST:PORT)"


@pytest.mark.parametrize(
    "name,text,expect",
    [
        ("max_inflight", "0", "1..65535"),
        ("max_inflight", "65536", "1..65535"),
        ("max_inflight", "many", "integer"),
        ("max_packet_size", "15", "16..268435460"),
        ("max_packet_size", "268435461", "16..268435460"),
        ("max_keepalive", "-1", "0..65535"),
        ("receive_maximum", "0", "1..65535"),
        ("topic_alias_maximum", "70000", "0..65535"),
        ("max_queued_messages", "-1", ">= 0"),
        ("durability_batch_ms", "0", ">= 1"),
        ("connect_timeout", "0", "> 0"),
        ("connect_timeout", "nan", "> 0"),
        ("sys_interval", "-1", ">= 0"),
        ("log_level", "loud", "debug, info, warning, error"),
        ("durability", "maybe", "sync, batch, off"),
        ("ws_path", "mqtt", "starting with /"),
        ("mdns", "perhaps", "true/false"),
        ("node_id", "has space", "[A-Za-z0-9_.-]"),
    ],
)
def test_bad_values_from_env(name: str, text: str, expect: str) -> None:
    env = {"MESHD_" + name.upper(): text}
    with pytest.raises(ConfigError) as e:
        load_settings({}, env=env)
    assert e.value.key == name
    msg = str(e.value)
    assert msg.startswith(f"{name}: ") and expect in msg and "MESHD_" + name.upper() in msg
    assert "\n" not in msg


def test_range_edges_accepted() -> None:
    env = {
        "MESHD_MAX_PACKET_SIZE": "268435460",
        "MESHD_MAX_KEEPALIVE": "0",
        "MESHD_MAX_QUEUED_MESSAGES": "0",
        "MESHD_SYS_INTERVAL": "0",
        "MESHD_LOG_LEVEL": "DEBUG",
    }
    s = load_settings({}, env=env)
    assert (s.max_packet_size, s.max_keepalive, s.max_queued_messages, s.sys_interval) == (268435460, 0, 0, 0.0)
    assert s.log_level == "debug"


def test_toml_type_errors(tmp_path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("max_inflight = 1.5\n")
    with pytest.raises(ConfigError) as e:
        load_settings({"config": str(cfg)}, env={})
    assert e.value.key == "max_inflight" and str(cfg) in str(e.value)
    cfg.write_text("mdns = 1\n")  # TOML has real booleans; 1 is an int
    with pytest.raises(ConfigError) as e:
        load_settings({"config": str(cfg)}, env={})
    assert e.value.key == "mdns"
    cfg.write_text("max_inflight = true\n")
    with pytest.raises(ConfigError):
        load_settings({"config": str(cfg)}, env={})


def test_unknown_toml_key_and_table(tmp_path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("max_infligt = 3\n")
    with pytest.raises(ConfigError) as e:
        load_settings({"config": str(cfg)}, env={})
    assert e.value.key == "max_infligt" and "unknown" in e.value.message
    cfg.write_text("[mqtt]\nport = 1\n")
    with pytest.raises(ConfigError) as e:
        load_settings({"config": str(cfg)}, env={})
    assert e.value.key == "mqtt"


def test_missing_or_broken_toml_is_config_error(tmp_path) -> None:
    with pytest.raises(ConfigError) as e:
        load_settings({"config": str(tmp_path / "nope.toml")}, env={})
    assert e.value.key == "config"
    bad = tmp_path / "bad.toml"
    bad.write_text("this is = = not toml")
    with pytest.raises(ConfigError) as e:
        load_settings({"config": str(bad)}, env={})
    assert e.value.key == "config" and "\n" not in str(e.value)


def test_unknown_env_is_error_but_config_env_is_not(tmp_path) -> None:
    with pytest.raises(ConfigError) as e:
        load_settings({}, env={"MESHD_MAX_INFLIHGT": "3"})
    assert e.value.key == "MESHD_MAX_INFLIHGT"
    # Unrelated variables are ignored.
    assert load_settings({}, env={"HOME": "/x", "MESHDX": "1"}) == Settings()


def test_env_defaults_to_os_environ(monkeypatch) -> None:
    monkeypatch.setenv("MESHD_CLUSTER_NAME", "from-env")
    assert load_settings({}).cluster_name == "from-env"


def test_secret_not_in_repr_and_redacted() -> None:
    s = load_settings({"cluster_key": "hunter2"}, env={})
    assert s.cluster_key == "hunter2"
    assert "hunter2" not in repr(s) and "hunter2" not in str(s)
    d = s.as_dict()
    assert d["cluster_key"] == "***" and d["mqtt"] == "0.0.0.0:1883" and d["seed"] == []
    assert s.as_dict(redact=False)["cluster_key"] == "hunter2"


def test_settings_frozen() -> None:
    s = Settings()
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(s, "max_inflight", 3)  # by name: the type checker knows Settings is frozen


# -- argparse -----------------------------------------------------------------


def test_absent_flags_are_not_given() -> None:
    assert parse_flags([]) == {}


def test_flags_parse_to_settings() -> None:
    flags = parse_flags(
        ["--max-inflight", "5", "--no-mdns", "--no-trace", "--mqtt", "127.0.0.1:0", "--node-id", "n7", "--config", "x.toml"]
    )
    assert flags == {
        "config": "x.toml",
        "max_inflight": "5",
        "mdns": False,
        "trace": False,
        "mqtt": "127.0.0.1:0",
        "node_id": "n7",
    }
    flags.pop("config")
    s = load_settings(flags, env={"MESHD_MDNS": "true", "MESHD_MAX_INFLIGHT": "9"})
    assert s.max_inflight == 5 and s.mdns is False and s.trace is False
    assert s.mqtt == HostPort("127.0.0.1", 0) and s.node_id == "n7"


def test_positive_bool_flag_overrides_env() -> None:
    flags = parse_flags(["--mdns"])
    assert load_settings(flags, env={"MESHD_MDNS": "off"}).mdns is True


def test_every_setting_has_a_flag_with_env_and_default_in_help() -> None:
    parser = argparse.ArgumentParser()
    add_setting_arguments(parser)
    text = parser.format_help()
    squashed = " ".join(text.split())
    for s in SETTINGS:
        assert s.flag in text
        assert s.env in squashed


def test_unknown_flag_key_rejected() -> None:
    with pytest.raises(ConfigError):
        load_settings({"max_infligt": 3}, env={})


# -- node id --------------------------------------------------------------------


def test_node_id_flag_wins(tmp_path) -> None:
    s = load_settings({"node_id": "alpha", "data_dir": str(tmp_path)}, env={})
    assert resolve_node_id(s) == "alpha"
    assert not (tmp_path / "node_id").exists()


def test_node_id_derived_stored_and_stable(tmp_path) -> None:
    d1 = tmp_path / "n1" / "data"  # created on demand
    d2 = tmp_path / "n2"
    s1 = load_settings({"data_dir": str(d1)}, env={})
    first = resolve_node_id(s1)
    assert (d1 / "node_id").read_text().strip() == first
    assert resolve_node_id(s1) == first  # a restart keeps it
    other = resolve_node_id(load_settings({"data_dir": str(d2)}, env={}))
    assert other != first  # two nodes on one host differ
    assert re.fullmatch(r"[A-Za-z0-9_.-]+", first)


def test_node_id_derived_from_sanitised_hostname(tmp_path, monkeypatch) -> None:
    import socket

    monkeypatch.setattr(socket, "gethostname", lambda: "My Host!.local")
    node_id = resolve_node_id(load_settings({"data_dir": str(tmp_path)}, env={}))
    assert re.fullmatch(r"My-Host-\.local-[0-9a-f]{6}", node_id)
    assert all(c.isalnum() or c in "_.-" for c in node_id)


def test_node_id_stored_file_is_used(tmp_path) -> None:
    (tmp_path / "node_id").write_text("kept-id\n")
    assert resolve_node_id(load_settings({"data_dir": str(tmp_path)}, env={})) == "kept-id"
    (tmp_path / "node_id").write_text("bad id\n")
    with pytest.raises(ConfigError) as e:
        resolve_node_id(load_settings({"data_dir": str(tmp_path)}, env={}))
    assert e.value.key == "node_id"


def test_node_id_unwritable_data_dir(tmp_path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    # A regular file in the way fails even for root, who ignores permissions.
    with pytest.raises(ConfigError) as e:
        resolve_node_id(load_settings({"data_dir": str(blocker / "sub")}, env={}))
    assert e.value.key == "data_dir"


def test_programmatic_flags_accept_native_values() -> None:
    # Callers building Settings in code (tests, embedding) pass typed values.
    s = load_settings(
        {
            "node_id": None,
            "mqtt": HostPort("127.0.0.1", 0),
            "ws": None,
            "seed": [HostPort("10.0.0.2", 7946)],
            "mdns": False,
            "max_inflight": 5,
            "sys_interval": 0,
        },
        env={},
    )
    assert s.node_id is None and s.mqtt == HostPort("127.0.0.1", 0) and s.ws is None
    assert s.seed == (HostPort("10.0.0.2", 7946),) and s.mdns is False
    assert s.max_inflight == 5 and s.sys_interval == 0.0 and isinstance(s.sys_interval, float)
    with pytest.raises(ConfigError):
        load_settings({"max_inflight": 5.5}, env={})


def test_describe_settings_masks_secret() -> None:
    from mesh.config import describe_settings

    lines = describe_settings(load_settings({"cluster_key": "s3cret", "mqtt": "off", "seed": ["a:1"]}, env={}))
    assert "cluster_key = ***" in lines and "mqtt = off" in lines and "seed = a:1" in lines
    assert not any("s3cret" in line for line in lines)
    assert len(lines) == len(SETTINGS)


def test_the_prefixed_variables_that_are_not_settings_are_accepted() -> None:
    # The test runner's worker count and the pure-Python switch reach every node started
    # under them; refusing them would stop those nodes at start.
    env = {"MESHD_TEST_WORKERS": "2", "MESHD_PURE_PYTHON": "1", "MESHD_REPORT_CLASS_ARCHIVE": "0"}
    assert load_settings({}, env=env) == Settings()
