"""Python function calls per delivered message in meshd, counted with cProfile.

    python scripts/bench/callcount.py                          # fanin-qos1, 2 s
    python scripts/bench/callcount.py --scenarios fanin-qos0,5to5-qos1 --top 40

py-spy (profile_meshd.py) says where the time goes; this says how much work there is:
meshd runs under cProfile (deterministic, every call counted; several times slower, so
the rates it reaches mean nothing), the scenario drives it, and on SIGTERM meshd dumps
its stats. Printed: calls per delivered message in total, and the functions called
most per message. A C broker makes no Python calls: each one removed per message is
work removed. Counting starts once the node listens (SIGUSR1); the clients' connects and
the shutdown are in the totals (noise next to the messages a run delivers).
"""

from __future__ import annotations

import argparse
import os
import pstats
import signal
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parents[1]))

import brokers  # noqa: E402
from scenarios import SCENARIOS  # noqa: E402

# Counting starts at SIGUSR1, once the node listens: start-up (imports, compiling the
# SQL dialect, ...) is left out.
_WRAPPER = (
    "import cProfile, signal, sys\n"
    "from mesh.cli import main\n"
    "profile = cProfile.Profile()\n"
    "signal.signal(signal.SIGUSR1, lambda *_: profile.enable())\n"
    "try:\n"
    "    main(sys.argv[2:])\n"
    "finally:\n"
    "    profile.disable()\n"
    "    profile.dump_stats(sys.argv[1])\n"
)


def _command(stats_path: Path):  # type: ignore[no-untyped-def]
    def command(port: int, workdir: Path) -> list[str]:
        plain = brokers.meshd_command(port, workdir)
        assert plain[1:3] == ["-m", "mesh.cli"]
        return [plain[0], "-c", _WRAPPER, str(stats_path), *plain[3:]]
    return command


def _label(func: tuple[str, int, str]) -> str:
    path, line, name = func
    for root in (str(brokers.MESHD_SOURCE) + "/", str(brokers.REPO) + "/"):
        if path.startswith(root):
            path = path[len(root):]
    if "site-packages/" in path:
        path = path.split("site-packages/", 1)[1]
    if "/lib/python3" in path:
        path = path.split("/lib/python3", 1)[1].split("/", 1)[-1]
    return f"{name} ({path}:{line})" if line else name


def count(scenario_name: str, top: int, quick: bool = True, keep: Path | None = None) -> dict[str, float]:
    scenario = SCENARIOS[scenario_name]
    assert scenario.run is not None, f"{scenario_name} starts its own brokers"
    with tempfile.TemporaryDirectory(prefix="meshd-callcount-") as tmp:
        stats_path = Path(tmp) / "meshd.prof"
        spec = brokers.BrokerSpec("meshd", _command(stats_path), lambda: None, brokers.meshd_version)
        broker = brokers.start(spec, Path(tmp) / "run")
        os.kill(broker.pid, signal.SIGUSR1)
        try:
            result = scenario.run(broker.port, broker.pid, quick)
        finally:
            broker.stop(timeout=30.0)
        stats = pstats.Stats(str(stats_path))
        if keep is not None:
            stats.dump_stats(str(keep.with_name(f"{keep.name}-{scenario_name}.prof")))
    delivered = int(result.get("delivered") or result.get("connected") or 0)
    raw = stats.stats  # type: ignore[attr-defined]
    total = sum(entry[1] for entry in raw.values())  # primitive + recursive calls
    per = total / delivered if delivered else float("nan")
    unit = "connection" if "connected" in result else "delivered message"
    print(f"\n### {scenario_name}: {total:,} calls, {delivered:,} per {unit}: {per:.1f} calls each "
          f"(lost {result.get('lost', 0)})\n")
    print(f"| calls per {unit} | own s | function |\n|---:|---:|---|")
    rows = sorted(raw.items(), key=lambda kv: kv[1][1], reverse=True)[:top]
    for func, (_cc, nc, tt, _ct, _callers) in rows:
        print(f"| {nc / delivered:.2f} | {tt:.2f} | `{_label(func)}` |")
    return {"calls": total, "delivered": delivered, "per": per}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenarios", default="fanin-qos1")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--full", action="store_true", help="4 s scenarios instead of 2 s")
    parser.add_argument("--keep", type=Path, help="also write the stats to KEEP-<scenario>.prof (pstats)")
    args = parser.parse_args()
    for name in args.scenarios.split(","):
        count(name, args.top, quick=not args.full, keep=args.keep)


if __name__ == "__main__":
    main()
