"""`meshd` as users run it: a real process, real signals, real exit codes."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.support import Client, meshd_command, run_cli, subprocess_env, wait_ready


def start_meshd(tmp_path: Path, *extra: str, run: tuple[str, ...] = (), data: str = "data") -> tuple[subprocess.Popen, int]:
    """meshd on port 0, started when its ready file says every listener is bound."""
    ready = tmp_path / f"{data}.ready.json"
    proc = subprocess.Popen(
        meshd_command() + [*run,
            "--data-dir", str(tmp_path / data), "--mqtt", "127.0.0.1:0", "--ws", "off",
            "--http", "off", "--gossip", "127.0.0.1:0", "--no-mdns", "--no-trace", "--ready-file", str(ready), *extra,
        ],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=subprocess_env(),
    )
    assert proc.stdout is not None  # stdout=PIPE
    info = wait_ready(proc, str(ready), proc.stdout.read)
    return proc, info["ports"]["mqtt"]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_disconnects_clients_with_0x8b_and_exits_0(tmp_path, signum):
    proc, port = start_meshd(tmp_path)
    try:
        c = Client("victim", version=5)
        c.connect(port)
        t0 = time.monotonic()
        proc.send_signal(signum)
        rc, _ = c.disconnects.get(timeout=10)
        assert rc.value == 0x8B
        assert proc.wait(timeout=10) == 0
        assert time.monotonic() - t0 < 6
        output = proc.stdout.read()
        assert "shutting down" in output and "stopped" in output
    finally:
        if proc.poll() is None:
            proc.kill()


def test_node_id_is_stable_across_restarts(tmp_path):
    ids = []
    for _ in range(2):
        proc, _ = start_meshd(tmp_path)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        m = re.search(r"node (\S+) \(meshd", proc.stdout.read())
        assert m
        ids.append(m.group(1))
    assert ids[0] == ids[1]
    assert (tmp_path / "data" / "node_id").read_text().strip() == ids[0]


def test_port_in_use_is_refused_with_exit_2(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = run_cli(["--data-dir", str(tmp_path), "--mqtt", f"127.0.0.1:{port}", "--ws", "off", "--http", "off", "--no-mdns"])
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1] == f"meshd: config error: mqtt: address 127.0.0.1:{port} is already in use"


@pytest.mark.parametrize(
    "args, key",
    [
        (["--mqtt", "nonsense"], "mqtt"),
        (["--max-inflight", "0"], "max_inflight"),
        (["--log-level", "loud"], "log_level"),
    ],
)
def test_bad_flags_name_the_key(tmp_path, args, key):
    out = run_cli(["--data-dir", str(tmp_path)] + args)
    assert out.returncode == 2
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith(f"meshd: config error: {key}:")


def test_unknown_toml_key_is_refused(tmp_path):
    cfg = tmp_path / "meshd.toml"
    cfg.write_text('mqtt = "127.0.0.1:0"\nmax_inflite = 3\n')
    out = run_cli(["--config", str(cfg), "--data-dir", str(tmp_path)])
    assert out.returncode == 2
    assert "max_inflite" in out.stderr


def test_run_subcommand_is_bare_meshd(tmp_path):
    proc, port = start_meshd(tmp_path)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=10)
    proc2, port2 = start_meshd(tmp_path, run=("run",), data="d2")
    try:
        c = Client("r", version=4)
        c.connect(port2)
        c.disconnect()
    finally:
        proc2.send_signal(signal.SIGTERM)
        assert proc2.wait(timeout=10) == 0


def test_store_in_use_by_another_node_is_refused(tmp_path):
    from tests.support import MeshdProcess

    with MeshdProcess(str(tmp_path / "shared")):
        out = run_cli(["--data-dir", str(tmp_path / "shared"), "--mqtt", "127.0.0.1:0", "--ws", "off",
                       "--http", "off", "--no-mdns", "--gossip", "127.0.0.1:0"])
    assert out.returncode == 2
    line = out.stderr.strip().splitlines()[-1]
    assert line.startswith("meshd: config error: data_dir: cannot open session store at")
