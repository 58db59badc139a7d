"""The meshd console script: run, settings errors, subcommand dispatch, help."""

from __future__ import annotations

import io
import logging
import re
import subprocess
import sys
import types

import pytest

from mesh import __version__
from mesh.cli import main
from mesh.config import ConfigError, HostPort, Settings
from mesh.logs import setup_logging


@pytest.fixture(autouse=True)
def restore_logging():
    """main() installs a stderr handler; put the root logger back afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


class FakeNodeModule(types.ModuleType):
    """mesh.run with a run_node that records its settings and returns `rc`."""

    def __init__(self) -> None:
        super().__init__("mesh.run")
        self.calls: list[Settings] = []
        self.rc = 0

    def run_node(self, settings: Settings) -> int:
        self.calls.append(settings)
        return self.rc


@pytest.fixture
def fake_node(monkeypatch):
    """Stands in for mesh.run (which starts a real node) and records the settings."""
    module = FakeNodeModule()
    monkeypatch.setitem(sys.modules, "mesh.run", module)
    # Keep the test's environment from leaking in.
    for var in [v for v in __import__("os").environ if v.startswith("MESHD_")]:
        monkeypatch.delenv(var)
    return module, module.calls


def fake_module(monkeypatch, name: str, **functions) -> None:
    module = types.ModuleType(name)
    for fn_name, fn in functions.items():
        setattr(module, fn_name, fn)
    monkeypatch.setitem(sys.modules, name, module)


@pytest.mark.parametrize("prefix", [[], ["run"]])
def test_run_passes_settings_to_node(fake_node, prefix) -> None:
    module, calls = fake_node
    module.rc = 3
    rc = main([*prefix, "--mqtt", "127.0.0.1:0", "--no-mdns", "--max-inflight", "4", "--log-level", "warning"])
    assert rc == 3
    (settings,) = calls
    assert settings.mqtt == HostPort("127.0.0.1", 0)
    assert settings.mdns is False and settings.max_inflight == 4 and settings.log_level == "warning"


def test_run_reads_env(fake_node, monkeypatch) -> None:
    _, calls = fake_node
    monkeypatch.setenv("MESHD_CLUSTER_NAME", "envname")
    assert main([]) == 0
    assert calls[0].cluster_name == "envname"


def test_config_error_exit_2(fake_node, capsys) -> None:
    _, calls = fake_node
    assert main(["--mqtt", "x"]) == 2
    assert calls == []
    err = capsys.readouterr().err
    assert err == "meshd: config error: mqtt: bad address 'x' (expected HOST:PORT)\n"


def test_config_error_from_run_node(fake_node, capsys) -> None:
    module, _ = fake_node

    def run_node(settings: Settings) -> int:
        raise ConfigError("mqtt", "address 127.0.0.1:1883 in use")

    module.run_node = run_node
    assert main([]) == 2
    assert "meshd: config error: mqtt: address 127.0.0.1:1883 in use" in capsys.readouterr().err


def test_missing_toml_exit_2(fake_node, capsys, tmp_path) -> None:
    assert main(["--config", str(tmp_path / "none.toml")]) == 2
    assert "meshd: config error: config: file not found" in capsys.readouterr().err


def test_usage_error_exit_2(fake_node, capsys) -> None:
    assert main(["--no-such-flag"]) == 2
    assert "unrecognized arguments" in capsys.readouterr().err


def test_version(capsys) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"meshd {__version__}"


def test_help_lists_settings_env_and_subcommands(capsys) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    squashed = " ".join(out.split())
    for text in ["--max-inflight", "MESHD_MAX_INFLIGHT", "default 32", "--no-mdns", "--seed", "--config"]:
        assert text in squashed
    for sub in ["run", "report", "simulate", "members", "ctl", "passwd"]:
        assert f"\n  {sub} " in out


def test_run_help_is_node_help(capsys) -> None:
    assert main(["run", "--help"]) == 0
    assert "--max-inflight" in capsys.readouterr().out


@pytest.mark.parametrize(
    "sub,module,function",
    [
        ("report", "spark_analysis.cli", "main"),
        ("simulate", "simulation.cli", "simulate_main"),
        ("members", "mesh.members", "members_main"),
        ("ctl", "mesh.ctl", "main"),
        ("passwd", "mesh.passwd", "main"),
    ],
)
def test_subcommand_dispatch_passes_remaining_argv(monkeypatch, sub, module, function) -> None:
    seen: list[list[str]] = []

    def fn(argv: list[str]) -> int:
        seen.append(argv)
        return 7

    fake_module(monkeypatch, module, **{function: fn})
    assert main([sub, "--x", "1", "run"]) == 7
    assert seen == [["--x", "1", "run"]]


def test_missing_subcommand_module(monkeypatch, capsys) -> None:
    # None in sys.modules makes the import fail as if the module were absent.
    monkeypatch.setitem(sys.modules, "mesh.passwd", None)
    assert main(["passwd", "add"]) == 2
    assert "passwd: not available" in capsys.readouterr().err


def test_missing_function(monkeypatch, capsys) -> None:
    fake_module(monkeypatch, "simulation.cli")
    assert main(["simulate"]) == 2
    assert "simulation.cli.simulate_main" in capsys.readouterr().err


def test_report_without_pyspark_says_how_to_install(monkeypatch, capsys) -> None:
    def needs_spark(argv: list[str]) -> int:
        raise ModuleNotFoundError("No module named 'pyspark'", name="pyspark")

    fake_module(monkeypatch, "spark_analysis.cli", main=needs_spark)
    assert main(["report", "traces/"]) == 2
    err = capsys.readouterr().err
    assert "pyspark" in err and "pip install -e '.[spark]'" in err


def test_unrelated_import_error_is_not_hidden(monkeypatch) -> None:
    def broken(argv: list[str]) -> int:
        raise ModuleNotFoundError("No module named 'typo_mod'", name="typo_mod")

    fake_module(monkeypatch, "mesh.ctl", main=broken)
    with pytest.raises(ModuleNotFoundError):
        main(["ctl"])


def test_python_dash_m_runs() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "mesh.cli", "--version"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0 and out.stdout.strip() == f"meshd {__version__}"
    out = subprocess.run(
        [sys.executable, "-m", "mesh.cli", "--http", "nohost"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2
    assert out.stderr.startswith("meshd: config error: http: bad address 'nohost'")


def test_run_sets_up_logging_at_the_configured_level(fake_node) -> None:
    module, _ = fake_node
    levels: list[int] = []
    module.run_node = lambda settings: levels.append(logging.getLogger().level) or 0
    assert main(["--log-level", "debug"]) == 0
    assert levels == [logging.DEBUG]


def test_log_line_format() -> None:
    buf = io.StringIO()
    setup_logging("info", stream=buf)
    setup_logging("info", stream=buf)  # idempotent: still one handler
    log = logging.getLogger("mesh.test")
    log.info("hello %s", "world")
    log.debug("hidden at info")
    log.warning("two\nlines")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        log.exception("failed")
    lines = buf.getvalue().splitlines()
    stamp = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"
    assert re.fullmatch(stamp + r" INFO mesh\.test: hello world", lines[0])
    assert re.fullmatch(stamp + r" WARNING mesh\.test: two\\nlines", lines[1])
    assert re.fullmatch(stamp + r" ERROR mesh\.test: failed", lines[2])
    assert lines[3].startswith("  Traceback") and "RuntimeError: boom" in lines[-1]
    assert all(line.startswith("  ") for line in lines[3:])
    assert "hidden" not in buf.getvalue()
    with pytest.raises(ValueError):
        setup_logging("loud")
