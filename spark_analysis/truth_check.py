"""The report against the simulator's ground truth (``truth.json`` beside the traces).

``meshd simulate`` writes who crashed and when, who restarted, the partition's sides
and the class of every death declaration (simulation/truth.py).  When the traces come
with that file, the report sets its own figures next to the truth's; any difference
is a bug in the report (or in the simulator's bookkeeping) and fails the run.
Plain Python over the summary: no Spark here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TRUTH_FILE = "truth.json"  # the name simulation/truth.py writes
TIME_TOLERANCE_S = 0.001  # traces carry µs, the truth rounds to µs: both sides round


@dataclass(frozen=True)
class Row:
    figure: str
    report: Any
    truth: Any
    ok: bool

    def as_json(self) -> dict[str, Any]:
        return {"figure": self.figure, "report": self.report, "truth": self.truth, "ok": self.ok}


def find_truth(paths: list[str]) -> Path | None:
    """The one ``truth.json`` at the top of the local input directories (or beside an
    input file); None if there is none, or several (several runs: no single truth)."""
    found: set[Path] = set()
    for raw in paths:
        p = Path(raw[len("file://"):] if raw.startswith("file://") else raw)
        for d in (p,) if p.is_dir() else (p.parent,) if p.is_file() else ():
            if (d / TRUTH_FILE).is_file():
                found.add((d / TRUTH_FILE).resolve())
    return found.pop() if len(found) == 1 else None


def _same_time(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return abs(a - b) <= TIME_TOLERANCE_S


def compare(summary: dict[str, Any], truth: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    det = summary["detection"]
    t_crashes = truth.get("crashes", [])
    rows.append(Row("crashes", det["crashes"], len(t_crashes), det["crashes"] == len(t_crashes)))
    r_restarts = sum(1 for c in det.get("list", []) if c["restart_ts_us"] is not None)
    t_restarts = sum(1 for c in t_crashes if c["restart_s"] is not None)
    rows.append(Row("restarts", r_restarts, t_restarts, r_restarts == t_restarts))
    by_node: dict[str, list[dict[str, Any]]] = {}
    for c in det.get("list", []):
        by_node.setdefault(c["member"], []).append(c)
    for t in t_crashes:
        mine = [c for c in by_node.get(t["node"], []) if _same_time(c["crash_ts_us"] / 1e6, t["crash_s"])]
        label = f"crash of {t['node']} at {t['crash_s']:g} s: dead everywhere after (s)"
        if not mine:
            rows.append(Row(label, None, t["all_dead_s"], False))
            continue
        got = mine[0]["all_dead_s"]
        rows.append(Row(label, got, t["all_dead_s"], _same_time(got, t["all_dead_s"])))
    mine_by_class = summary.get("declarations", {}).get("by_class", {})
    for cls, n in truth.get("declarations", {}).get("by_class", {}).items():
        got = mine_by_class.get(cls, 0)
        rows.append(Row(f"declarations: {cls.replace('_', ' ')}", got, n, got == n))
    fp = summary["false_positives"]["count"]
    t_fp = truth.get("declarations", {}).get("by_class", {}).get("false_positive", 0)
    rows.append(Row("false positives", fp, t_fp, fp == t_fp))
    return rows


def check(summary: dict[str, Any], paths: list[str]) -> dict[str, Any] | None:
    """``summary.json``'s ``truth_check``: the file, every row, and ``ok``; None
    without a truth file."""
    path = find_truth(paths)
    if path is None:
        return None
    truth = json.loads(path.read_text(encoding="utf-8"))
    rows = compare(summary, truth)
    return {
        "file": str(path),
        "ok": all(r.ok for r in rows),
        "rows": [r.as_json() for r in rows],
        "partition": truth.get("partition"),
    }


def disagreements(result: dict[str, Any]) -> list[str]:
    return [f"{r['figure']}: report {r['report']}, truth {r['truth']}" for r in result["rows"] if not r["ok"]]
