"""Where meshd's memory per idle connection goes: tracemalloc by allocation site.

    python scripts/bench/memprofile_meshd.py --connections 2000

Starts meshd through a small wrapper that turns tracemalloc on and, on SIGUSR1, writes
a snapshot; takes one snapshot with no client, opens N idle connections (the same
generator as `idle-5000`), takes another, and prints the allocation sites that grew,
per connection. tracemalloc sees Python allocations only (not the kernel's socket
buffers, not malloc arenas' slack), so its total is below the RSS delta; both are shown.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import tracemalloc
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parents[1]))

import brokers  # noqa: E402
import loadgen  # noqa: E402
import procstat  # noqa: E402

WRAPPER = """
import os, signal, sys, tracemalloc
tracemalloc.start(1)
count = 0
def dump(signum, frame):
    global count
    count += 1
    tracemalloc.take_snapshot().dump(os.path.join(os.environ["BENCH_SNAPSHOT_DIR"], f"snap{count}.bin"))
signal.signal(signal.SIGUSR1, dump)
from mesh.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _snapshot(pid: int, directory: Path, index: int) -> tracemalloc.Snapshot:
    path = directory / f"snap{index}.bin"
    os.kill(pid, signal.SIGUSR1)
    for _ in range(200):
        if path.exists():
            time.sleep(0.3)  # let the dump finish writing
            return tracemalloc.Snapshot.load(str(path))
        time.sleep(0.05)
    raise RuntimeError("meshd wrote no tracemalloc snapshot")


def main(argv: list[str] | None = None) -> int:
    args = brokers.memory_probe_args(argv, __doc__, connections=2000)
    broker, work = brokers.start_wrapped_meshd("meshd-traced", WRAPPER, "BENCH_SNAPSHOT_DIR")
    try:
        time.sleep(0.5)
        before = _snapshot(broker.pid, work, 1)
        rss0 = procstat.rss_bytes(broker.pid)
        result: dict = {}

        def snapshot() -> None:
            result["after"] = _snapshot(broker.pid, work, 2)
            result["rss1"] = procstat.rss_bytes(broker.pid)

        idle = loadgen.idle_connections(broker.port, broker.pid, count=args.connections, settle=0.5,
                                        while_held=snapshot)
    finally:
        broker.stop()
    n = idle["connected"]
    after = result["after"]
    by_line = after.compare_to(before, "lineno")
    grown = sum(s.size_diff for s in by_line)
    print(f"{n} idle connections: RSS +{(result['rss1'] - rss0) / 1024 / n:.2f} KB/conn (tracemalloc's own "
          f"bookkeeping included), Python heap (tracemalloc) +{grown / 1024 / n:.2f} KB/conn\n")
    for title, key in (("By file", "filename"), ("By line (where the object was allocated)", "lineno")):
        print(f"{title}:\n\n| KB/conn | objects/conn | where |\n|---:|---:|---|")
        for s in after.compare_to(before, key)[: args.top]:
            f = s.traceback[-1]
            where = _short(f.filename) + (f":{f.lineno}" if key == "lineno" else "")
            print(f"| {s.size_diff / 1024 / n:.2f} | {s.count_diff / n:.1f} | `{where}` |")
        print()
    return 0


def _short(path: str) -> str:
    for marker in ("site-packages/", "/lib/python3.11/"):
        if marker in path:
            return path.split(marker, 1)[1]
    for root in (str(brokers.REPO) + "/", str(brokers.MESHD_SOURCE) + "/"):
        if path.startswith(root):
            return path[len(root):]
    return path


if __name__ == "__main__":
    raise SystemExit(main())
