"""The build: setup.cfg's metadata plus the hot typed cores compiled with mypyc.

`pip install .`, `pip install -e .` and a wheel build compile COMPILED with mypyc (from
mypy, a build requirement in pyproject.toml) when a C compiler works. Without one, or
with MESHD_PURE_PYTHON=1 in the build's environment, the package is the pure-Python
one, and the build says why.

Each compiled module's extension lands in `_compiled/` inside its package (not beside
its source, where it would always win the import), the code they share in `native/`,
and `native/compiled.json` records each source's SHA-256: `native` (the package) picks
compiled or pure at import from that, so MESHD_PURE_PYTHON=1 also switches an installed
compiled build back to the sources.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# What profiles show hot per message (scripts/bench/PROFILE.md): the codec, the server
# connection machine, the topic trie and the route table; a forward's share and its link
# item and frame (scripts/bench/RESULTS.md, "cross-node forward path"). All strictly
# typed (setup.cfg).
COMPILED = [
    "mqtt/_wire.py",
    "mqtt/decoder.py",
    "mqtt/encoder.py",
    "mqtt/errors.py",
    "mqtt/packets.py",
    "mqtt/properties.py",
    "mqtt/reason_codes.py",
    "mqtt/server.py",
    "mqtt/topics.py",
    "routing/trie.py",
    "routing/topic_index.py",
    "routing/table.py",
    "routing/forward.py",
    "routing/batch.py",
]
# The shared library of the compiled group (mypyc appends "__mypyc").
GROUP = "native.cores"
PURE_ENV = "MESHD_PURE_PYTHON"
MANIFEST = os.path.join("native", "compiled.json")
COMPILED_DIR = "_compiled"


def _say(message: str) -> None:
    print(f"meshd build: {message}", file=sys.stderr, flush=True)


def _compiler_works() -> str | None:
    """None when a C compiler builds a trivial file, else why not."""
    from setuptools._distutils import ccompiler, sysconfig  # noqa: PLC0415

    compiler = ccompiler.new_compiler()
    sysconfig.customize_compiler(compiler)
    with tempfile.TemporaryDirectory() as tmp:
        source = os.path.join(tmp, "probe.c")
        with open(source, "w") as f:
            f.write("int main(void) { return 0; }\n")
        try:
            compiler.compile([source], output_dir=tmp)
        except Exception as exc:  # CompileError, or the compiler's binary missing
            return f"no working C compiler ({exc})".replace("\n", " ")
    return None


def _will_compile() -> bool:
    """Whether to compile at all: decided up front, as it is cheap (mypyc is not)."""
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        _say(f"{PURE_ENV}={os.environ[PURE_ENV]}: pure Python, nothing compiled")
        return False
    why_not = _compiler_works()
    if why_not is not None:
        _say(f"{why_not}: pure Python, nothing compiled")
        return False
    return True


def _mypyc_extensions() -> list[Extension]:
    """The compiled cores' extensions, or [] (pure Python) with the reason said."""
    try:
        from mypyc.build import mypycify  # noqa: PLC0415
    except ImportError as exc:
        _say(f"mypyc not importable ({exc}): pure Python, nothing compiled")
        return []
    _say(f"compiling {len(COMPILED)} modules with mypyc ({PURE_ENV}=1 skips it)")
    try:
        extensions = mypycify(COMPILED, group_name=GROUP, opt_level="3", debug_level="0")
    except (Exception, SystemExit) as exc:  # mypy's errors end in SystemExit
        _say(f"mypyc failed ({exc!r}): pure Python, nothing compiled")
        return []
    for ext in extensions:
        package, _, module = ext.name.rpartition(".")
        if ext.name != f"{GROUP}__mypyc":  # a module's shim: into its package's _compiled/
            ext.name = f"{package}.{COMPILED_DIR}.{module}"
    return extensions


# Stands for the compiled extensions until build_ext runs: setup.py runs several times
# per `pip install` (metadata, requirements, build) and only the build needs mypyc.
_PLACEHOLDER = Extension(f"{GROUP}__mypyc", sources=[])


class BuildCompiledCores(build_ext):
    """build_ext that runs mypyc, falls back to pure Python, writes the manifest."""

    def finalize_options(self) -> None:
        ext_modules = self.distribution.ext_modules or []
        if _PLACEHOLDER in ext_modules:
            self.distribution.ext_modules = _mypyc_extensions()
        super().finalize_options()

    def run(self) -> None:
        manifest = self._output_path(MANIFEST)
        if os.path.exists(manifest):
            os.remove(manifest)  # no manifest: pure, whatever an older build left
        if not self.extensions:
            return
        if self.inplace:  # setuptools copies into existing package folders only
            for ext in self.extensions:
                os.makedirs(os.path.dirname(self.get_ext_fullpath(ext.name)), exist_ok=True)
        try:
            super().run()
        except Exception as exc:  # CompileError, LinkError, ... : a build must not fail
            _say(f"compiling failed ({exc}): pure Python")
            return
        modules = {}
        for path in COMPILED:
            with open(path, "rb") as f:
                modules[path[: -len(".py")].replace("/", ".")] = hashlib.sha256(f.read()).hexdigest()
        os.makedirs(os.path.dirname(manifest), exist_ok=True)
        with open(manifest, "w", encoding="utf-8") as f:
            json.dump({"modules": modules}, f, indent=1, sort_keys=True)
        _say(f"compiled: {', '.join(sorted(modules))}")

    def _output_path(self, relative: str) -> str:
        # In place for `pip install -e .` (the source tree), else the build's lib folder.
        return relative if self.inplace else os.path.join(self.build_lib, relative)


setup(
    ext_modules=[_PLACEHOLDER] if _will_compile() else [],
    cmdclass={"build_ext": BuildCompiledCores},
)
