"""The brokers under test: how to install, start (fresh, pinned, on 127.0.0.1) and stop each.

A broker is a `BrokerSpec`: a name, an install check and a command line for a port and
a scratch directory. `start()` runs it under `taskset`, waits until the port accepts a
TCP connection and hands back a `RunningBroker`; `stop()` signals that PID only.
amqtt lives in its own virtualenv under ~/.cache/meshd-bench so its dependencies never
touch the project's environment.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

REPO = Path(__file__).resolve().parents[2]
# Where meshd's code is imported from: the working tree, or a copy of one commit that
# `export_commit` made (so a run measures one commit while others edit the tree).
MESHD_SOURCE = REPO
CACHE = Path(os.environ.get("BENCH_CACHE_DIR", Path.home() / ".cache" / "meshd-bench"))
AMQTT_VENV = CACHE / "amqtt-venv"
AMQTT_REQUIREMENT = "amqtt>=0.12,<0.13"
BROKER_CORE = 1
GENERATOR_CORE = 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# idle-50000 needs 50,000 sockets on each end, beyond many machines' hard limit (20,000
# here): raised when we may (root), else the soft limit goes up to the hard one.
WANTED_FDS = 120_000


def raise_fd_limit() -> None:
    """Idle-connection runs need thousands of sockets, on both ends."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < WANTED_FDS:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (WANTED_FDS, WANTED_FDS))
            return
        except (ValueError, OSError):
            pass  # not allowed: what the hard limit gives
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def can_pin() -> bool:
    return shutil.which("taskset") is not None and (os.cpu_count() or 1) >= 2


# ----------------------------------------------------------------------------- install

def ensure_mosquitto() -> str:
    path = shutil.which("mosquitto") or ("/usr/sbin/mosquitto" if os.path.exists("/usr/sbin/mosquitto") else None)
    if path:
        return path
    print("bench: installing mosquitto (Debian package)", file=sys.stderr)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-q"], check=True, env=env, stdout=subprocess.DEVNULL)
    subprocess.run(["apt-get", "install", "-y", "-q", "mosquitto"], check=True, env=env, stdout=subprocess.DEVNULL)
    path = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    if not os.path.exists(path):
        raise RuntimeError("mosquitto is not installed and apt-get could not install it")
    return path


def ensure_amqtt() -> Path:
    exe = AMQTT_VENV / "bin" / "amqtt"
    if exe.exists():
        return exe
    print(f"bench: installing {AMQTT_REQUIREMENT} into {AMQTT_VENV}", file=sys.stderr)
    AMQTT_VENV.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(AMQTT_VENV)], check=True)
    subprocess.run([str(AMQTT_VENV / "bin" / "pip"), "install", "-q", AMQTT_REQUIREMENT], check=True)
    return exe


def amqtt_version() -> str:
    out = subprocess.run([str(AMQTT_VENV / "bin" / "python"), "-c", "import amqtt; print(amqtt.__version__)"],
                         capture_output=True, text=True)
    return out.stdout.strip() or "?"


def mosquitto_version() -> str:
    out = subprocess.run([ensure_mosquitto(), "-h"], capture_output=True, text=True)
    first = (out.stdout or out.stderr).splitlines()[:1]
    return first[0].replace("mosquitto version ", "") if first else "?"


def export_commit(rev: str, dest: Path) -> str:
    """Copy the tree of `rev` to `dest` and import meshd from there; return the short hash."""
    global MESHD_SOURCE
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    MESHD_SOURCE = dest
    if (dest / "native").is_dir():  # compile the hot cores as `pip install` would (setup.py)
        subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=dest, check=True,
                       stdout=subprocess.DEVNULL)
    return subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", rev], check=True,
                          capture_output=True, text=True).stdout.strip()


def meshd_version(env: Mapping[str, str] = {}) -> str:
    """The version and which build of the hot cores it runs (`native`: compiled or why not)."""
    code = "import mesh, native; print(mesh.__version__, native.status().reason)"
    run_env = {k: v for k, v in os.environ.items() if k != "MESHD_PURE_PYTHON"}
    run_env.update(env, PYTHONPATH=str(MESHD_SOURCE))
    out = subprocess.run([sys.executable, "-c", code], env=run_env, cwd="/", capture_output=True, text=True)
    version, _, build = out.stdout.strip().partition(" ")
    return f"{version} ({build})" if build else version or "?"


# ----------------------------------------------------------------------------- commands

def meshd_command(port: int, workdir: Path) -> list[str]:
    return [
        sys.executable, "-m", "mesh.cli",
        "--mqtt", f"127.0.0.1:{port}", "--ws", "off", "--http", "off", "--no-mdns", "--no-trace",
        "--gossip", f"127.0.0.1:{free_port()}", "--data-dir", str(workdir / "data"), "--log-level", "warning",
    ]


def mosquitto_command(port: int, workdir: Path) -> list[str]:
    conf = workdir / "mosquitto.conf"
    # Debian defaults except max_queued_messages: with a limit (1000, even 10000) mosquitto
    # 2.0.11 dropped 0.2-1% of QoS 1 messages in fan-in although the generator keeps its
    # lag under 500; with 0 (no limit) it loses none, and the generator bounds the queue.
    conf.write_text(
        f"listener {port} 127.0.0.1\nallow_anonymous true\nmax_queued_messages 0\n"
        "persistence false\nlog_dest none\n"
    )
    return [ensure_mosquitto(), "-c", str(conf)]


def amqtt_command(port: int, workdir: Path) -> list[str]:
    conf = workdir / "amqtt.yaml"
    # Only the plugin that lets anonymous clients in: no packet logging, no $SYS.
    conf.write_text(
        "listeners:\n"
        "  default:\n"
        "    type: tcp\n"
        f"    bind: 127.0.0.1:{port}\n"
        "plugins:\n"
        "  amqtt.plugins.authentication.AnonymousAuthPlugin:\n"
        "    allow_anonymous: true\n"
    )
    return [str(ensure_amqtt()), "-c", str(conf)]


@dataclass(frozen=True)
class BrokerSpec:
    name: str
    command: Callable[[int, Path], list[str]]
    ensure: Callable[[], object]
    version: Callable[[], str]
    env: Mapping[str, str] = field(default_factory=dict)  # set for the broker's process


BROKERS: dict[str, BrokerSpec] = {
    "meshd": BrokerSpec("meshd", meshd_command, lambda: None, meshd_version),
    # The same meshd on the pure-Python modules (README "Compiled cores"): `--brokers
    # meshd,meshd-pure` puts the mypyc build and the sources side by side.
    "meshd-pure": BrokerSpec("meshd-pure", meshd_command, lambda: None,
                             lambda: meshd_version({"MESHD_PURE_PYTHON": "1"}), {"MESHD_PURE_PYTHON": "1"}),
    "mosquitto": BrokerSpec("mosquitto", mosquitto_command, ensure_mosquitto, mosquitto_version),
    "amqtt": BrokerSpec("amqtt", amqtt_command, ensure_amqtt, amqtt_version),
}


# ----------------------------------------------------------------------------- run

@dataclass
class RunningBroker:
    name: str
    pid: int
    port: int
    proc: subprocess.Popen
    log_path: Path

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 5.0) -> int | None:
        """SIGTERM this PID, SIGKILL it if it lingers; return the exit status."""
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.proc.wait(timeout)
        return self.proc.returncode


def start(spec: BrokerSpec, workdir: Path, *, pin: bool = True, startup_timeout: float = 30.0,
          extra: Sequence[str] = ()) -> RunningBroker:
    """`extra` flags go after the spec's own, so for meshd they override them (last wins)."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    cmd = [*spec.command(port, workdir), *extra]
    if pin and can_pin():
        cmd = ["taskset", "-c", str(BROKER_CORE), *cmd]  # taskset execs: same PID
    log_path = workdir / f"{spec.name}.log"
    env = dict(os.environ, PYTHONPATH=str(MESHD_SOURCE) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("MESHD_PURE_PYTHON", None)  # only as the spec says
    env.update(spec.env)
    if spec.name == "amqtt":
        env.pop("PYTHONPATH")  # its own venv, nothing of ours
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, preexec_fn=raise_fd_limit)
    broker = RunningBroker(spec.name, proc.pid, port, proc, log_path)
    deadline = time.monotonic() + startup_timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{spec.name} exited with {proc.returncode} at start; see {log_path}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return broker
        except OSError:
            time.sleep(0.05)
    broker.stop()
    raise RuntimeError(f"{spec.name} did not listen on 127.0.0.1:{port} within {startup_timeout:.0f} s")


def memory_probe_args(argv: list[str] | None, description: str, connections: int) -> argparse.Namespace:
    """The arguments of a memory probe (`memprofile_meshd.py`, `memcount_meshd.py`):
    --connections, --top, --source (a revision is exported and measured)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--connections", type=int, default=connections)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--source", default="worktree", help="'worktree' or a git revision to export and measure")
    args = parser.parse_args(argv)
    if args.source != "worktree":
        print(f"meshd at {export_commit(args.source, Path(tempfile.mkdtemp(prefix='meshd-src-')))}")
    return args


def start_wrapped_meshd(name: str, wrapper_source: str, dir_variable: str) -> tuple[RunningBroker, Path]:
    """meshd run by a wrapper script (`wrapper_source`: a tracer's, an object counter's)
    that finds its own folder in the environment variable `dir_variable`: the running
    broker and that folder."""
    raise_fd_limit()
    work = Path(tempfile.mkdtemp(prefix=f"{name}-"))
    wrapper = work / f"{name.replace('-', '_')}.py"
    wrapper.write_text(wrapper_source)
    os.environ[dir_variable] = str(work)

    def command(port: int, workdir: Path) -> list[str]:
        return [sys.executable, str(wrapper), *meshd_command(port, workdir)[3:]]

    spec = BrokerSpec(name, command, lambda: None, meshd_version)
    return start(spec, work / "node", pin=False), work
