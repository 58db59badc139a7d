"""Profile meshd with py-spy while the load generator drives one or more scenarios.

    python scripts/bench/profile_meshd.py                      # fanin-qos1 and fanout-qos0
    python scripts/bench/profile_meshd.py --scenarios fanin-qos0 --rate 250 --svg

For each scenario: start meshd pinned to core 1, attach `py-spy record --pid` (raw
collapsed stacks; with --svg a flamegraph too, from a second recording), run the
scenario, stop both, and print the top functions by self time (the leaf frame of each
sample) and by total time (anywhere on the stack), with file:line. Idle samples (the
thread waiting in epoll, idle trio worker threads waiting for a job) are left out, so
shares are of the broker's busy time.
Raw stacks go to scripts/bench/profiles/<scenario>.txt.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parents[1]))

import brokers  # noqa: E402

FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


def ensure_py_spy() -> str:
    exe = shutil.which("py-spy")
    if exe:
        return exe
    print("profile: installing py-spy with pip", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "py-spy"], check=True)
    exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    return exe


def _short(path: str) -> str:
    for marker in ("site-packages/", "/lib/python3.11/"):
        if marker in path:
            return path.split(marker, 1)[1]
    for root in (str(brokers.REPO) + "/", str(brokers.MESHD_SOURCE) + "/"):
        if path.startswith(root):
            return path[len(root):]
    return path


def parse_collapsed(text: str) -> list[tuple[list[str], int]]:
    stacks = []
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        if _waiting_worker(frames[-1]):
            continue
        stacks.append((frames, int(count)))
    return stacks


def _waiting_worker(leaf: str) -> bool:
    """An idle trio worker thread blocked on its lock: py-spy does not count a lock wait
    with a timeout as idle, but it is (the thread's own self time is only that wait)."""
    return leaf.startswith("WorkerThread._work ") and "_thread_cache.py" in leaf


def _key(frame: str, with_line: bool) -> str:
    m = FRAME.match(frame)
    if not m:
        return frame
    where = _short(m["file"])
    if with_line and m["line"]:
        where += ":" + m["line"]
    return f"{m['func']} ({where})"


def top_tables(stacks: list[tuple[list[str], int]], n: int = 20) -> tuple[int, list, list, list]:
    """(samples, self time by function, self time by line, total time by function)."""
    total = sum(c for _, c in stacks)
    self_fn: Counter[str] = Counter()
    self_line: Counter[str] = Counter()
    total_fn: Counter[str] = Counter()
    for frames, count in stacks:
        if not frames:
            continue
        leaf = frames[-1]
        if "(<string>" in leaf and len(frames) > 1:
            # generated code (dataclass __init__): name it by who built the object
            self_fn["dataclass __init__ ← " + _key(frames[-2], False)] += count
            self_line["dataclass __init__ ← " + _key(frames[-2], True)] += count
        else:
            self_fn[_key(leaf, False)] += count
            self_line[_key(leaf, True)] += count
        for f in {_key(f, False) for f in frames}:
            total_fn[f] += count
    # frames on (nearly) every stack (runpy, cli, trio's run loop) say nothing: leave them out
    inclusive = [(k, c) for k, c in total_fn.most_common() if c < 0.97 * total][:n]
    return total, self_fn.most_common(n), self_line.most_common(n), inclusive


def render(name: str, stacks: list[tuple[list[str], int]], result: dict, n: int = 20) -> str:
    from scenarios import SCENARIOS  # here, not at the top: replication.py reuses the tables without it
    total, self_fn, self_line, total_fn = top_tables(stacks, n)
    out = [f"### {name}: {SCENARIOS[name].description}", ""]
    keys = ("msgs_per_s", "cpu_us_per_msg", "broker_cpu_pct", "lost")
    out.append("Run under the profiler: " + ", ".join(
        f"{k} = {result[k]:.1f}" if isinstance(result.get(k), float) else f"{k} = {result.get(k)}" for k in keys))
    out.append(f"({total} busy samples)")
    for title, rows in (("Self time by function", self_fn), ("Self time by line", self_line),
                        ("Total time by function (inclusive)", total_fn)):
        out += ["", f"{title}:", "", "| % | samples | where |", "|---:|---:|---|"]
        out += [f"| {100 * c / total:.1f} | {c} | `{k}` |" for k, c in rows] if total else []
    return "\n".join(out) + "\n"


def profile(name: str, py_spy: str, rate: int, svg: bool, quick: bool, outdir: Path) -> str:
    from scenarios import SCENARIOS
    work = Path(tempfile.mkdtemp(prefix="meshd-profile-"))
    broker = brokers.start(brokers.BROKERS["meshd"], work)
    raw = outdir / f"{name}.txt"
    cmds = [[py_spy, "record", "--pid", str(broker.pid), "--rate", str(rate), "--format", "raw", "-o", str(raw)]]
    if svg:
        cmds.append([py_spy, "record", "--pid", str(broker.pid), "--rate", str(rate), "-o", str(outdir / f"{name}.svg")])
    spies = []
    try:
        for cmd in cmds:
            if brokers.can_pin():
                cmd = ["taskset", "-c", str(brokers.GENERATOR_CORE), *cmd]
            spies.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        time.sleep(1.0)  # let py-spy attach before the load starts
        result = SCENARIOS[name].run(broker.port, broker.pid, quick)
    finally:
        for spy in spies:
            if spy.poll() is None:
                spy.send_signal(2)  # SIGINT: py-spy writes its output and exits
        for spy in spies:
            try:
                _, err = spy.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                spy.kill()
                err = b""
            if spy.returncode not in (0, None) and err:
                print(err.decode(errors="replace")[-500:], file=sys.stderr)
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)
    return render(name, parse_collapsed(raw.read_text()), result)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenarios", default="fanin-qos1,fanout-qos0")
    parser.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    parser.add_argument("--svg", action="store_true", help="also record a flamegraph SVG")
    parser.add_argument("--quick", action="store_true", help="2 s scenarios instead of 4 s")
    parser.add_argument("--out", type=Path, default=HERE / "profiles")
    parser.add_argument("--source", default="worktree",
                        help="'worktree' (default: the files as they are) or a git revision to export and profile")
    args = parser.parse_args(argv)
    py_spy = ensure_py_spy()
    import run  # the commit stamp, as the runner records it
    if args.source == "worktree":
        state = run.source_state()
    else:
        state = {"commit": brokers.export_commit(args.source, Path(tempfile.mkdtemp(prefix="meshd-src-"))), "dirty": []}
    args.out.mkdir(parents=True, exist_ok=True)
    brokers.raise_fd_limit()
    if brokers.can_pin():
        os.sched_setaffinity(0, {brokers.GENERATOR_CORE})
    reports = [profile(name, py_spy, args.rate, args.svg, args.quick, args.out) for name in args.scenarios.split(",")]
    stamp = f"meshd at {state['commit']}" + (f" + uncommitted edits in {', '.join(state['dirty'])}" if state["dirty"] else "")
    text = f"Profiled {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {stamp}; py-spy {args.rate} Hz.\n\n" + "\n".join(reports)
    (args.out / "latest.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
