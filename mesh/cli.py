"""The `meshd` console script.

`meshd` / `meshd run` start a node; the other subcommands are dispatched by
import, lazily, so a node never imports pyspark and a missing extra only breaks
the one subcommand that needs it.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from dataclasses import dataclass
from typing import Callable, Sequence

from mesh import __version__
from mesh.config import ConfigError, add_setting_arguments, flags_from_namespace, load_settings
from mesh.usage import Parser

__all__ = ["main", "SUBCOMMANDS", "build_parser"]


@dataclass(frozen=True)
class Subcommand:
    module: str
    function: str
    summary: str
    # Third-party packages it needs, and how to install them.
    extras: tuple[str, ...] = ()
    install_hint: str = ""


SUBCOMMANDS: dict[str, Subcommand] = {
    "report": Subcommand(
        "spark_analysis.cli",
        "main",
        "turn trace files into an HTML report with plots (needs PySpark)",
        extras=("pyspark", "matplotlib", "pyarrow"),
        install_hint="pip install -e '.[spark]'",
    ),
    "simulate": Subcommand("simulation.cli", "simulate_main", "run a simulated cluster in virtual time"),
    "members": Subcommand("mesh.members", "members_main", "list the members a running node sees"),
    "ctl": Subcommand("mesh.ctl", "main", "inspect and configure a running node over its HTTP API"),
    "passwd": Subcommand("mesh.passwd", "main", "manage the client password file"),
}

DESCRIPTION = """\
Start a meshd node: a peer-to-peer MQTT 3.1.1/5.0 broker. Every node runs the
same program; nodes find each other by mDNS on a LAN or by --seed, share
membership by SWIM gossip, gossip the route table, and move a client's session
to whichever node it reconnects to. Clients connect to any node over TCP
(--mqtt) or WebSocket (--ws); --http serves the JSON API and /metrics.

`meshd` and `meshd run` are the same."""


def _epilog() -> str:
    width = max(len(name) for name in SUBCOMMANDS)
    lines = ["subcommands (meshd SUBCOMMAND --help for theirs):"]
    lines.append(f"  {'run':<{width}}  start a node (the default)")
    for name, sub in SUBCOMMANDS.items():
        lines.append(f"  {name:<{width}}  {sub.summary}")
    lines.append("")
    lines.append("exit codes: 0 clean stop, 2 configuration error or missing component")
    return "\n".join(lines)


def build_parser() -> Parser:
    parser = Parser(
        prog="meshd",
        # The settings' flags are listed by --help; a usage line naming all of them would
        # be the 30 lines an error used to print before itself.
        usage="meshd [run] [--config FILE] [--SETTING VALUE ...] | meshd SUBCOMMAND ...",
        description=DESCRIPTION,
        epilog=_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"meshd {__version__}")
    add_setting_arguments(parser)
    return parser


def _err(message: str) -> None:
    print(f"meshd: {message}", file=sys.stderr)


def _dispatch(name: str, argv: list[str]) -> int:
    sub = SUBCOMMANDS[name]
    try:
        module = importlib.import_module(sub.module)
        fn: Callable[[list[str]], int] = getattr(module, sub.function)
    except ModuleNotFoundError as e:
        return _missing(name, sub, e)
    except AttributeError:
        _err(f"{name}: not available in this build ({sub.module}.{sub.function} is missing)")
        return 2
    try:
        rc = fn(argv)
    except ModuleNotFoundError as e:
        # An extra imported lazily inside the subcommand (e.g. pyspark).
        if _top(e.name) in sub.extras:
            return _missing(name, sub, e)
        raise
    return int(rc or 0)


def _top(module_name: str | None) -> str:
    return (module_name or "").split(".")[0]


def _missing(name: str, sub: Subcommand, e: ModuleNotFoundError) -> int:
    missing = e.name or ""
    if _top(missing) in sub.extras:
        hint = f"; install it with: {sub.install_hint}" if sub.install_hint else ""
        _err(f"{name}: needs the Python package {_top(missing)!r}, which is not installed{hint}")
        return 2
    if sub.module == missing or sub.module.startswith(missing + "."):
        _err(f"{name}: not available in this build (module {sub.module} is missing)")
        return 2
    raise e


def _run(argv: list[str]) -> int:
    parser = build_parser()
    ns = parser.parse(argv)
    try:
        settings = load_settings(flags_from_namespace(ns))
    except ConfigError as e:
        _err(f"config error: {e}")
        return 2
    from mesh.logs import setup_logging

    setup_logging(settings.log_level, log_format=settings.log_format)
    try:
        from mesh.run import run_node
    except ModuleNotFoundError as e:
        if e.name in ("mesh.run",):
            _err("the node is not available in this build (mesh.run is missing)")
            return 2
        raise
    try:
        return int(run_node(settings) or 0)
    except ConfigError as e:
        _err(f"config error: {e}")
        return 2
    except KeyboardInterrupt:
        return 130


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `meshd` console script; returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if args and args[0] in SUBCOMMANDS:
            return _dispatch(args[0], args[1:])
        if args and args[0] == "run":
            args = args[1:]
        return _run(args)
    except SystemExit as e:
        # argparse exits on --help, --version and usage errors; main returns codes.
        code = e.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        print(code, file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
