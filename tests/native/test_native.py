"""Compiled or pure (native/, setup.py): which build a process imports, and the build
without a C compiler.

CI installs with `pip install -e .`, which compiles (scripts/test checks that it did),
then runs the suite compiled and the compiled modules' tests again with
MESHD_PURE_PYTHON=1.
"""

from __future__ import annotations

import configparser
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import native

REPO = Path(__file__).resolve().parents[2]
SHOW = (
    "import json, native, mqtt.decoder, mqtt.server, routing.trie; "
    "print(json.dumps([native.status().reason, mqtt.decoder.__file__, mqtt.server.__file__, "
    "routing.trie.__file__]))"
)


def _show(env_update: dict[str, str], pythonpath: Path = REPO) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "MESHD_PURE_PYTHON"}
    env.update(PYTHONPATH=str(pythonpath), **env_update)
    # From / so that nothing but PYTHONPATH can shadow the packages.
    out = subprocess.run([sys.executable, "-c", SHOW], env=env, cwd="/", capture_output=True,
                         text=True, check=True)
    result: list[str] = json.loads(out.stdout)
    return result


def test_meshd_pure_python_forces_the_sources() -> None:
    reason, *files = _show({"MESHD_PURE_PYTHON": "1"})
    assert reason == "MESHD_PURE_PYTHON=1"
    assert all(f.endswith(".py") for f in files), files


def test_without_the_switch_the_build_decides() -> None:
    # Compiled after `pip install -e .` with a C compiler (CI: scripts/test checks it),
    # the sources in a tree that was never built.
    reason, *files = _show({"MESHD_PURE_PYTHON": "0"})
    built = native.decide(str(REPO), {})
    assert reason == built.reason
    if built.compiled:
        assert all(f.endswith(".so") and f"{os.sep}_compiled{os.sep}" in f for f in files), files
    else:
        assert all(f.endswith(".py") for f in files), files


def _tree(root: Path, modules: dict[str, bytes]) -> None:
    for name, source in modules.items():
        path = root.joinpath(*name.split(".")).with_suffix(".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(source)
    (root / "native").mkdir(exist_ok=True)


def _manifest(root: Path, modules: dict[str, bytes]) -> None:
    digests = {name: hashlib.sha256(source).hexdigest() for name, source in modules.items()}
    (root / "native" / native.MANIFEST).write_text(json.dumps({"modules": digests}))


def test_decide(tmp_path: Path) -> None:
    modules = {"mqtt.decoder": b"x = 1\n", "routing.trie": b"y = 2\n"}
    _tree(tmp_path, modules)
    root = str(tmp_path)
    assert native.decide(root, {}) == native.Status(False, "not compiled")
    _manifest(tmp_path, modules)
    assert native.decide(root, {}) == native.Status(True, "compiled", ("mqtt.decoder", "routing.trie"))
    assert native.decide(root, {"MESHD_PURE_PYTHON": "0"}).compiled
    assert native.decide(root, {"MESHD_PURE_PYTHON": ""}).compiled
    assert native.decide(root, {"MESHD_PURE_PYTHON": "1"}) == native.Status(False, "MESHD_PURE_PYTHON=1")
    # A source edited after the build: every module pure, not only the edited one
    # (compiled code calls compiled code directly, the two builds must not mix).
    (tmp_path / "routing" / "trie.py").write_bytes(b"y = 3\n")
    assert native.decide(root, {}) == native.Status(
        False, f"stale: {os.path.join('routing', 'trie.py')} changed since the build")
    (tmp_path / "routing" / "trie.py").unlink()
    assert not native.decide(root, {}).compiled


def _copy_project(dest: Path) -> None:
    """What a source distribution holds: the build files and the packages."""
    for name in ("setup.py", "setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy(REPO / name, dest / name)
    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")
    skip = shutil.ignore_patterns("__pycache__", "_compiled", "*.so", native.MANIFEST)
    for package in config["options.packages.find"]["include"].split():
        if "*" not in package:
            shutil.copytree(REPO / package, dest / package, ignore=skip)


def test_without_a_c_compiler_the_wheel_is_pure_python_and_works(tmp_path: Path) -> None:
    src, out = tmp_path / "src", tmp_path / "wheel"
    src.mkdir()
    _copy_project(src)
    env = dict(os.environ, CC=str(tmp_path / "no-such-cc"))
    env.pop("MESHD_PURE_PYTHON", None)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-v", "--no-build-isolation", "--no-deps",
         "--disable-pip-version-check", "-w", str(out), str(src)],
        env=env, capture_output=True, text=True, cwd=tmp_path)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    assert "meshd build: no working C compiler" in built.stdout + built.stderr
    (wheel,) = out.glob("meshd-*.whl")
    assert wheel.name.endswith("-py3-none-any.whl")  # nothing platform-specific in it
    unpacked = tmp_path / "site"
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        zf.extractall(unpacked)
    assert not [n for n in names if n.endswith(".so") or n.endswith(native.MANIFEST)]
    reason, *files = _show({}, pythonpath=unpacked)
    assert reason == "not compiled"
    assert all(f.startswith(str(unpacked)) and f.endswith(".py") for f in files), files
    # The pure package works: a PUBLISH decoded through the server machine.
    code = (
        "from mqtt import Connect, Publish, encode\n"
        "from mqtt.server import ServerConnection, ServerSettings\n"
        "c = ServerConnection(ServerSettings(), 0.0)\n"
        "c.receive_data(encode(Connect('x'), 4) + encode(Publish('a/b', b'hi'), 4), 0.0)\n"
        "print(type(c.next_event()).__name__, c.accept(session_present=False).hex(), c.next_event().payload)\n"
    )
    ran = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=str(unpacked)),
                         cwd="/", capture_output=True, text=True, check=True)
    assert ran.stdout.split() == ["Connect", "20020000", "b'hi'"]
    # The whole node composes from the wheel alone (outside the source tree, as an
    # installed `meshd` runs): every package it imports was packaged.
    whole = subprocess.run([sys.executable, "-c", "import mesh.compose, mesh.cli; print(mesh.compose.__file__)"],
                           env=dict(os.environ, PYTHONPATH=str(unpacked)), cwd="/", capture_output=True, text=True)
    assert whole.returncode == 0 and whole.stdout.startswith(str(unpacked)), whole.stderr[-3000:]


def test_every_package_of_the_tree_is_in_the_distribution() -> None:
    """A package left out of setup.cfg's list still imports in the source tree (the
    tests run there) but not in an installed `meshd`, which then fails at start."""
    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")
    included = set(config["options.packages.find"]["include"].split())
    packages = {p.parent.name for p in REPO.glob("*/__init__.py")} - {"tests"}
    assert packages - included == set()
    assert {p + ".*" for p in packages if any((REPO / p).glob("*/__init__.py"))} - included == set()
