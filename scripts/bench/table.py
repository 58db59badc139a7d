"""Summarise raw JSON lines into the markdown table: median [min..max] per broker and ratios.

    python scripts/bench/table.py scripts/bench/results/run-*.jsonl

Pure functions over the records (`summarise`, `markdown`), so the table can be rebuilt
from any kept run.
"""

from __future__ import annotations

import json
import statistics
import sys
from typing import Any, Iterable

from scenarios import SCENARIOS, Metric

BROKER_ORDER = ("meshd", "amqtt", "mosquitto")


def load(paths: Iterable[str]) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    for path in paths:
        with open(path) as f:
            lines = (json.loads(line) for line in f if line.strip())
            records.extend(r for r in lines if r.get("kind") != "header")  # run.py's machine/versions line
    return records


def summarise(records: list[dict[str, Any]]) -> dict[tuple[str, str, str], tuple[float, float, float, int]]:
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


def _lookup(result: dict[str, Any], key: str) -> Any:
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


def markdown(records: list[dict[str, Any]]) -> str:
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
    if not argv:
        print(__doc__)
        return 2
    print(markdown(load(argv)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
