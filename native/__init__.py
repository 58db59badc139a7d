"""Compiled or pure: which build of the hot typed cores this process imports.

The build (setup.py) compiles the hot modules of `mqtt` and `routing` with mypyc when a
C compiler works. Their extension modules do not sit next to their sources (an `.so`
beside a `.py` always wins the import): they go to a `_compiled/` folder inside the
package, and the build writes MANIFEST (below) with the SHA-256 of each compiled
module's source. A package with compiled modules calls `add_compiled(__path__)` first
thing in its `__init__`; when `status()` says compiled, the folder goes in front of the
package's search path and the compiled modules win, the others come from the sources.

The choice is made once per process and for every compiled module together (compiled
code calls compiled code directly, so a pure module among compiled ones would meet
objects of the other build): pure when MESHD_PURE_PYTHON is set to anything but "" or
"0", when nothing was compiled, or when any compiled module's source changed since the
build (an edited tree with an old build; a warning says so, and a rebuild,
`pip install -e .`, brings the compiled modules back).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import warnings
from dataclasses import dataclass
from typing import Mapping

__all__ = ["PURE_ENV", "MANIFEST", "COMPILED_DIR", "Status", "status", "decide", "add_compiled"]

PURE_ENV = "MESHD_PURE_PYTHON"
# Written by the build beside this file: {"modules": {"mqtt.decoder": "<sha256>", ...}}.
MANIFEST = "compiled.json"
COMPILED_DIR = "_compiled"


@dataclass(frozen=True)
class Status:
    compiled: bool
    reason: str  # why: "compiled", "MESHD_PURE_PYTHON=1", "not compiled", "stale: ..."
    modules: tuple[str, ...] = ()  # the compiled modules in use (empty when pure)


def decide(root: str, env: Mapping[str, str]) -> Status:
    """The choice for a tree whose packages sit in `root` (this package's parent)."""
    if env.get(PURE_ENV, "") not in ("", "0"):
        return Status(False, f"{PURE_ENV}={env[PURE_ENV]}")
    try:
        with open(os.path.join(root, "native", MANIFEST), encoding="utf-8") as f:
            modules: dict[str, str] = json.load(f)["modules"]
    except FileNotFoundError:
        return Status(False, "not compiled")
    for module, digest in sorted(modules.items()):
        source = os.path.join(root, *module.split(".")) + ".py"
        try:
            with open(source, "rb") as f:
                current = hashlib.sha256(f.read()).hexdigest()
        except FileNotFoundError:
            current = ""
        if current != digest:
            return Status(False, f"stale: {os.path.relpath(source, root)} changed since the build")
    return Status(True, "compiled", tuple(sorted(modules)))


@functools.cache
def status() -> Status:
    """This process's choice (made at the first import of a compiled package)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    found = decide(root, os.environ)
    if found.reason.startswith("stale"):
        warnings.warn(
            f"meshd runs pure Python: {found.reason[len('stale: '):]} "
            "(rebuild with pip install -e . to use the compiled modules)",
            RuntimeWarning,
            stacklevel=2,
        )
    return found


def add_compiled(package_path: list[str]) -> None:
    """Put the package's compiled modules in front of its sources, when in use."""
    if status().compiled:
        compiled = os.path.join(package_path[0], COMPILED_DIR)
        if os.path.isdir(compiled) and compiled not in package_path:
            package_path.insert(0, compiled)
