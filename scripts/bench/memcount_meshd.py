"""Where meshd's memory per idle connection goes, by object counts and allocator state.

    python scripts/bench/memcount_meshd.py --connections 19500

`memprofile_meshd.py` says where objects were allocated (tracemalloc, which slows meshd
and doubles its heap); this says what is alive and what the allocator holds, with no
tracing: meshd runs under a small wrapper that, on SIGUSR1, counts the objects the
garbage collector tracks by type (floats, ints and strings are not tracked: they show
in the allocator's figures only) and writes `sys._debugmallocstats()`. One snapshot
with no client, one with N idle clients connected (the `idle-5000` generator), and
per connection: RSS, the bytes in pymalloc's live blocks, the arenas (1 MiB each), and
the unused pools (16 KiB each: freed, but in arenas something else still holds).
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parents[1]))

import brokers  # noqa: E402
import loadgen  # noqa: E402
import procstat  # noqa: E402

WRAPPER = r"""
import collections, gc, os, signal, sys
count = 0
def dump(signum, frame):
    global count
    count += 1
    d = os.environ["BENCH_COUNT_DIR"]
    types = collections.Counter(type(o).__name__ for o in gc.get_objects())
    with open(os.path.join(d, f"types{count}.txt"), "w") as f:
        for name, n in types.most_common():
            f.write(f"{n} {name}\n")
    fd = os.open(os.path.join(d, f"malloc{count}.txt"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    saved = os.dup(2)
    os.dup2(fd, 2)
    sys._debugmallocstats()
    os.dup2(saved, 2)
    os.close(fd)
    os.close(saved)
    open(os.path.join(d, f"done{count}"), "w").close()
signal.signal(signal.SIGUSR1, dump)
from mesh.cli import main
sys.exit(main(sys.argv[1:]))
"""

_MALLOC_FIELDS = {
    "allocated": r"# bytes in allocated blocks\s*=\s*([\d,]+)",
    "arenas": r"# arenas allocated current\s*=\s*([\d,]+)",
    "unused_pools": r"(\d+) unused pools \*",
}


def _snapshot(pid: int, directory: Path, index: int) -> tuple[dict[str, int], dict[str, int]]:
    os.kill(pid, signal.SIGUSR1)
    done = directory / f"done{index}"
    for _ in range(600):
        if done.exists():
            break
        time.sleep(0.05)
    else:
        raise RuntimeError("meshd wrote no counts")
    types = {}
    for line in (directory / f"types{index}.txt").read_text().splitlines():
        n, name = line.split(" ", 1)
        types[name] = int(n)
    text = (directory / f"malloc{index}.txt").read_text()
    malloc = {}
    for key, pattern in _MALLOC_FIELDS.items():
        found = re.search(pattern, text)
        malloc[key] = int(found.group(1).replace(",", "")) if found else 0
    return types, malloc


def main(argv: list[str] | None = None) -> int:
    args = brokers.memory_probe_args(argv, __doc__, connections=5000)
    broker, work = brokers.start_wrapped_meshd("meshd-counted", WRAPPER, "BENCH_COUNT_DIR")
    counted: list[tuple[dict[str, int], dict[str, int]]] = []
    rss_after: list[int] = []
    try:
        time.sleep(1.0)
        types0, malloc0 = _snapshot(broker.pid, work, 1)
        rss0 = procstat.rss_bytes(broker.pid)

        def count() -> None:
            counted.append(_snapshot(broker.pid, work, 2))
            rss_after.append(procstat.rss_bytes(broker.pid))

        idle = loadgen.idle_connections(broker.port, broker.pid, count=args.connections, settle=0.5,
                                        timeout=60.0 * max(1, args.connections // 5000), while_held=count)
    finally:
        broker.stop()
    n = idle["connected"]
    if not n or not counted:
        print(f"no idle connection held ({idle})")
        return 1
    (types1, malloc1), rss1 = counted[0], rss_after[0]
    print(f"{n} idle connections in {idle['elapsed_s']:.1f} s; per connection:\n")
    print("| what | per connection |\n|---|---:|")
    print(f"| RSS | {(rss1 - rss0) / 1024 / n:.3f} KB |")
    print(f"| pymalloc live blocks | {(malloc1['allocated'] - malloc0['allocated']) / 1024 / n:.3f} KB |")
    print(f"| pymalloc arenas (1 MiB) | {(malloc1['arenas'] - malloc0['arenas']) * 1024 / n:.3f} KB |")
    print(f"| unused pools (16 KiB), before → after | {malloc0['unused_pools']} → {malloc1['unused_pools']} |")
    print("\nObjects the GC tracks, grown by (per connection):\n\n| type | per connection |\n|---|---:|")
    grown = sorted(((types1.get(t, 0) - types0.get(t, 0), t) for t in set(types0) | set(types1)), reverse=True)
    for diff, name in grown[: args.top]:
        print(f"| `{name}` | {diff / n:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
