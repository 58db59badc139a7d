"""Summarise raw JSON lines into the markdown table: median [min..max] per broker and ratios.

    python scripts/bench/table.py scripts/bench/results/run-*.jsonl
    python scripts/bench/table.py scripts/bench/RESULTS.md --section "full run"
    python scripts/bench/table.py scripts/bench/RESULTS.md --section "full run" --raw

A path ending in `.md` is read for its ```jsonl blocks (RESULTS.md keeps every result's
raw lines in one); `--section NAME` takes only the blocks under the headings whose text
contains NAME (case-insensitive), up to the next heading of the same or a higher level.
`--raw` prints the lines themselves (header lines included), as run.py wrote them.

Runs of different meshd commits or batch windows (an A/B, a window sweep) are never
merged: each gets its own table, titled by its header line.

Pure functions over the records (`summarise`, `markdown`), so the table can be rebuilt
from any kept run.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from typing import Any, Iterable

from scenarios import SCENARIOS, Metric

BROKER_ORDER = ("meshd", "amqtt", "mosquitto")


Record = dict[str, Any]

_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def raw_lines(path: str, section: str | None = None) -> list[str]:
    """The non-empty lines of a .jsonl file, or of the ```jsonl blocks of a markdown file
    (only those under headings containing `section`, when given)."""
    with open(path) as f:
        text = f.read()
    if not path.endswith(".md"):
        if section is not None:
            raise ValueError(f"--section reads markdown, {path} is not")
        return [line for line in text.splitlines() if line.strip()]
    return markdown_blocks(text, section)


def markdown_blocks(text: str, section: str | None = None) -> list[str]:
    lines: list[str] = []
    fence: str | None = None  # the info string of the open ``` block ("jsonl", "sh", ...)
    taking = section is None
    level_taken = 0  # heading level of the matched section; 0: none
    for line in text.splitlines():
        stripped = line.strip()
        if fence is not None:
            if stripped.startswith("```"):
                fence = None
            elif fence == "jsonl" and taking and stripped:
                lines.append(line)
            continue
        if stripped.startswith("```"):
            fence = stripped[3:].strip()
            continue
        m = _HEADING.match(line)
        if m and section is not None:
            level = len(m.group(1))
            if section.lower() in m.group(2).lower():
                taking, level_taken = True, min(level, level_taken or level)
            elif level_taken and level <= level_taken:
                taking, level_taken = False, 0
    return lines


def markdown_headings(text: str) -> list[str]:
    return [m.group(2) for m in map(_HEADING.match, text.splitlines()) if m]


Run = tuple[Record, list[Record]]  # run.py's header line and the records after it


def load_runs(paths: Iterable[str], section: str | None = None) -> list[Run]:
    """(header, its records) per run.py header line, in file order."""
    return [run for path in paths for run in _runs(raw_lines(path, section))]


def load_runs_from_text(markdown_text: str, section: str | None = None) -> list[Run]:
    return _runs(markdown_blocks(markdown_text, section))


def _runs(lines: Iterable[str]) -> list[Run]:
    """Lines before any header get an empty one; lines that are not run.py records
    (handoff.py, netsplit_soak.py, ...) are skipped."""
    runs: list[Run] = []
    current: Run | None = None
    for line in lines:
        r = json.loads(line)
        if r.get("kind") == "header":  # run.py's machine/versions/commit line
            current = (r, [])
            runs.append(current)
        elif "scenario" in r and "broker" in r:
            if current is None:
                current = ({}, [])
                runs.append(current)
            current[1].append(r)
    return runs


def load(paths: Iterable[str], section: str | None = None) -> list[Record]:
    return [r for _, records in load_runs(paths, section) for r in records]


def variant(header: Record, records: list[Record]) -> str:
    """What a run measured: meshd's commit and, for persist-batch, the batch window."""
    source = header.get("source") or {}
    title = f"meshd at {source.get('commit', '?')}" + (" + uncommitted edits" if source.get("dirty") else "")
    windows = sorted({r["result"]["batch_ms"] for r in records
                      if r["scenario"] == "persist-batch" and isinstance(r.get("result"), dict)
                      and r["result"].get("batch_ms") is not None})
    if windows:
        title += ", persist-batch window " + "/".join(f"{w} ms" for w in windows)
    return title


def by_variant(runs: list[Run]) -> dict[str, list[Record]]:
    """Records grouped by `variant`, in order of first appearance."""
    groups: dict[str, list[Record]] = {}
    for header, records in runs:
        if records:
            groups.setdefault(variant(header, records), []).extend(records)
    return groups


def summarise(records: list[Record]) -> dict[tuple[str, str, str], tuple[float, float, float, int]]:
    """(scenario, broker, metric) -> (median, min, max, runs) over the successful runs."""
    values: dict[tuple[str, str, str], list[float]] = {}
    for r in records:
        if r.get("error"):
            continue
        scenario = SCENARIOS.get(r["scenario"])
        if scenario is None:
            continue
        for m in scenario.metrics:
            v = _lookup(r["result"], m.key)
            if isinstance(v, (int, float)):
                values.setdefault((r["scenario"], r["broker"], m.key), []).append(float(v))
    return {k: (statistics.median(v), min(v), max(v), len(v)) for k, v in values.items()}


def _lookup(result: Record, key: str) -> Any:
    """`a.b` reads result["a"]["b"]: the measurements a meshd-only scenario nests per run."""
    v: Any = result
    for part in key.split("."):
        v = v.get(part) if isinstance(v, dict) else None
    return v


def _fmt(m: Metric, v: float) -> str:
    return m.fmt.format(v)


def _cell(m: Metric, stat: tuple[float, float, float, int] | None) -> str:
    if stat is None:
        return "—"
    med, lo, hi, n = stat
    if n == 1 or _fmt(m, lo) == _fmt(m, hi):
        return _fmt(m, med)
    return f"{_fmt(m, med)} [{_fmt(m, lo)}..{_fmt(m, hi)}]"


def _ratio(a: tuple | None, b: tuple | None) -> str:
    if a is None or b is None or not b[0]:
        return "—"
    return f"{a[0] / b[0]:.2f}×"


_ARROW = {True: " ↑", False: " ↓", None: ""}  # None: a setting, neither better nor worse


def markdown(records: list[Record]) -> str:
    stats = summarise(records)
    present = {r["broker"] for r in records}
    brokers = [b for b in BROKER_ORDER if b in present] + sorted(present - set(BROKER_ORDER))
    head = ["scenario", "metric", *brokers]
    if "meshd" in brokers:
        head += [f"meshd/{b}" for b in brokers if b != "meshd"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    errors = [r for r in records if r.get("error")]
    for name, scenario in SCENARIOS.items():
        if not any(r["scenario"] == name for r in records):
            continue
        for i, m in enumerate(scenario.metrics):
            row = [f"**{name}**" if i == 0 else "", m.label + _ARROW[m.higher_is_better]]
            for b in brokers:
                row.append(_cell(m, stats.get((name, b, m.key))))
            if "meshd" in brokers and m.key not in ("lost", "gen_cpu_pct", "connected", "broker_cpu_pct"):
                row += [_ratio(stats.get((name, "meshd", m.key)), stats.get((name, b, m.key))) for b in brokers if b != "meshd"]
            elif "meshd" in brokers:
                row += [""] * (len(brokers) - 1)
            lines.append("| " + " | ".join(row) + " |")
    out = "\n".join(lines)
    if errors:
        out += "\n\nFailed runs:\n" + "\n".join(f"- {r['broker']} {r['scenario']} rep {r['rep']}: {r['error']}" for r in errors)
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", help="run.py's .jsonl files, or markdown with ```jsonl blocks")
    parser.add_argument("--section", help="markdown: only the blocks under headings containing this text")
    parser.add_argument("--raw", action="store_true", help="print the raw lines instead of the table")
    args = parser.parse_args(argv)
    if args.section is not None:
        for path in (p for p in args.paths if p.endswith(".md")):
            with open(path) as f:
                headings = markdown_headings(f.read())
            if not any(args.section.lower() in h.lower() for h in headings):
                parser.error(f"no heading in {path} contains {args.section!r}; headings:\n  " + "\n  ".join(headings))
    try:
        if args.raw:
            for path in args.paths:
                print("\n".join(raw_lines(path, args.section)))
            return 0
        groups = by_variant(load_runs(args.paths, args.section))
    except ValueError as e:
        parser.error(str(e))
    if not groups:
        print("no run.py lines there (other tools' lines have no table: --raw prints them)", file=sys.stderr)
        return 1
    if len(groups) == 1:
        print(markdown(next(iter(groups.values()))))
    else:
        print("\n\n".join(f"### {title}\n\n{markdown(records)}" for title, records in groups.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
