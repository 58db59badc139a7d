"""Where each setting's value came from (flag, env, file, default, cluster-wide change),
as `load_settings` records it and `/api/v1/config` shows it; and the metavars that
name what each flag takes."""

from __future__ import annotations

import argparse

from mesh.config import SETTINGS, Float, Int, Origin, Settings, add_setting_arguments, load_settings
from mesh.cluster_config import ClusterConfig
from mesh.config_sync import setting_in_effect, settings_in_effect
from mesh.http_client import request_json


def test_each_value_remembers_its_source(tmp_path) -> None:
    toml = tmp_path / "meshd.toml"
    toml.write_text('max_inflight = 7\nlog_level = "debug"\nmax_queued_messages = 5\n')
    s = load_settings({"config": str(toml), "max_inflight": "9"},
                      env={"MESHD_LOG_LEVEL": "warning", "MESHD_API_TOKEN": "t0k3n"})
    assert s.origin("max_inflight") == Origin("flag", "--max-inflight")  # flag over file
    assert s.origin("log_level") == Origin("env", "MESHD_LOG_LEVEL")  # env over file
    assert s.origin("max_queued_messages") == Origin("file", str(toml))
    assert s.origin("receive_maximum") == Origin("default")
    assert s.origin("api_token") == Origin("env", "MESHD_API_TOKEN")


def test_settings_built_in_code_say_default_or_program() -> None:
    s = Settings(max_inflight=3)
    assert s.origin("max_inflight") == Origin("program") and s.origin("max_queued_messages") == Origin("default")


def test_in_effect_lists_every_setting_and_a_cluster_change_wins(tmp_path) -> None:
    s = load_settings({"max_inflight": "9", "api_token": "t0k3n"}, env={})
    config = ClusterConfig("node-b")
    config.set("max_inflight", "11", 1_000)
    config.set("acl", "", 1_001)
    entries = {e["key"]: e for e in settings_in_effect(s, config.registers.values())}
    assert set(entries) == {x.name for x in SETTINGS} | {"acl"}  # every setting, not only the changed ones
    assert entries["max_inflight"]["value"] == 11 and entries["max_inflight"]["source"] == "cluster"
    assert entries["max_inflight"]["origin"] == "node-b"
    assert entries["receive_maximum"] == {"key": "receive_maximum", "value": 1024, "source": "default"}
    assert entries["api_token"] == {"key": "api_token", "value": "***", "source": "flag", "source_detail": "--api-token"}
    assert entries["acl"]["source"] == "cluster"
    assert setting_in_effect(s, [], "max_inflight") == {"key": "max_inflight", "value": 9, "source": "flag",
                                                        "source_detail": "--max-inflight"}
    assert setting_in_effect(s, [], "no_such_key") is None


def test_api_config_shows_every_setting_with_its_source(node_factory) -> None:
    node = node_factory(max_inflight=5)
    http = f"127.0.0.1:{node.ports['http']}"
    status, body = request_json(http, "GET", "/api/v1/config")
    assert status == 200
    entries = {e["key"]: e for e in body["config"]}
    assert entries["max_inflight"] == {"key": "max_inflight", "value": 5, "source": "flag",
                                       "source_detail": "--max-inflight"}
    assert entries["topic_alias_maximum"]["source"] == "default"
    status, body = request_json(http, "PUT", "/api/v1/config/max_inflight", {"value": 6})
    assert status == 200 and body["source"] == "cluster" and body["origin"] == "test-node"
    status, body = request_json(http, "GET", "/api/v1/config/max_inflight")
    assert (status, body["value"], body["source"]) == (200, 6, "cluster")
    status, body = request_json(http, "GET", "/api/v1/config/nope")
    assert status == 404 and "nope" in body["error"]


def test_metavars_name_what_flags_take() -> None:
    parser = argparse.ArgumentParser()
    add_setting_arguments(parser)
    metavar = {a.dest: a.metavar for a in parser._actions}
    assert metavar["publish_rate"] == metavar["connection_rate"] == "PER_SECOND"
    for s in SETTINGS:
        if isinstance(s.kind, (Int, Float)) and s.kind.unit:
            # A number with a unit names the unit: SECONDS, BYTES, MS, PER_SECOND.
            assert metavar[s.name] == s.kind.unit.upper().replace(" ", "_"), s.name
        elif isinstance(s.kind, Int):
            assert metavar[s.name] == "N", s.name
