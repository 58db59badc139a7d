"""`session_replicas` and `session_replication`: every way in, and refusals naming the key."""

from __future__ import annotations

import argparse

import pytest

from mesh.config import ConfigError, add_setting_arguments, flags_from_namespace, load_settings


def test_defaults_are_two_copies_acknowledged_in_sync() -> None:
    s = load_settings({}, env={})
    assert (s.session_replicas, s.session_replication) == (2, "sync")
    s = load_settings({}, env={"MESHD_SESSION_REPLICAS": "1"})
    assert s.session_replicas == 1  # one copy: on its owner only


def test_toml_environment_and_flags(tmp_path) -> None:
    cfg = tmp_path / "meshd.toml"
    cfg.write_text('session_replicas = 3\nsession_replication = "async"\n')
    s = load_settings({"config": str(cfg)}, env={})
    assert (s.session_replicas, s.session_replication) == (3, "async")
    s = load_settings({}, env={"MESHD_SESSION_REPLICAS": "4", "MESHD_SESSION_REPLICATION": "sync"})
    assert (s.session_replicas, s.session_replication) == (4, "sync")
    parser = argparse.ArgumentParser()
    add_setting_arguments(parser)
    flags = flags_from_namespace(parser.parse_args(["--session-replicas", "2", "--session-replication", "async"]))
    s = load_settings(flags, env={"MESHD_SESSION_REPLICAS": "3"})
    assert (s.session_replicas, s.session_replication) == (2, "async")


@pytest.mark.parametrize("key,value", [("session_replicas", "0"), ("session_replicas", "two"),
                                       ("session_replicas", "99"), ("session_replication", "quorum")])
def test_bad_values_are_refused_naming_the_key(key: str, value: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_settings({}, env={f"MESHD_{key.upper()}": value})
    assert e.value.key == key
