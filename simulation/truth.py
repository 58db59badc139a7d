"""The gossip simulator's ground truth, written next to its traces as ``truth.json``.

The simulator knows what no trace can say for certain: who crashed and when, who
restarted, which side of a cut every node was on, and so what each death
declaration really was.  ``meshd report`` reads this file when it sits beside the
traces, prints its own figures next to these and fails when they differ.

Declarations are classed as in spark_analysis/README.md, "Classification", when
their origin makes them (its own first record of the ``member_dead``):
``restart`` / ``true_detection`` (the member is down; it comes back later, or
never), ``partition`` (the member is up, on the other side of a cut that is on or
ended less than ``partition_grace_s`` ago: suspicions begun during the cut end after
the heal), else ``false_positive``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TRUTH_FILE = "truth.json"
CLASSES: tuple[str, ...] = ("true_detection", "restart", "leave", "partition", "false_positive", "unverified")


@dataclass
class Crash:
    node: str
    at: float
    restart_at: float | None  # scheduled comeback (None: stays down)
    observers: set[str]  # nodes up when it crashed
    dead_at: dict[str, float] = field(default_factory=dict)  # observer -> first death recorded, before the restart
    gone: set[str] = field(default_factory=set)  # observers that crashed before declaring


@dataclass
class GroundTruth:
    partition_grace_s: float
    crashes: list[Crash] = field(default_factory=list)
    declarations: dict[str, str] = field(default_factory=dict)  # event id -> class
    sides: tuple[list[str], list[str]] | None = None
    partition_at: float | None = None
    heal_at: float | None = None

    def _open_crash(self, node: str) -> Crash | None:
        for c in reversed(self.crashes):
            if c.node == node:
                return c
        return None

    def crashed(self, node: str, at: float, restart_at: float | None, up: set[str]) -> None:
        for c in self.crashes:
            if node in c.observers and node not in c.dead_at:
                c.gone.add(node)  # went away without declaring: not waited for
        self.crashes.append(Crash(node, at, restart_at, up - {node}))

    def dead_recorded(self, observer: str, member: str, now: float) -> None:
        """``observer`` recorded ``member`` dead while ``member`` was down."""
        c = self._open_crash(member)
        if c is not None and observer in c.observers:
            c.dead_at.setdefault(observer, now)

    def declared(self, event_id: str, *, down: bool, comes_back: bool, across: bool) -> None:
        if event_id in self.declarations:
            return
        if down:
            cls = "restart" if comes_back else "true_detection"
        else:
            cls = "partition" if across else "false_positive"
        self.declarations[event_id] = cls

    def as_json(self) -> dict[str, Any]:
        by_class = {c: 0 for c in CLASSES}
        for cls in self.declarations.values():
            by_class[cls] += 1
        crashes = []
        for c in self.crashes:
            waited = c.observers - c.gone
            complete = bool(waited) and all(o in c.dead_at for o in waited)
            crashes.append({
                "node": c.node,
                "crash_s": round(c.at, 6),
                "restart_s": None if c.restart_at is None else round(c.restart_at, 6),
                "all_dead_s": round(max(c.dead_at[o] for o in waited) - c.at, 6) if complete else None,
                "observers": len(waited),
                "declared": sum(1 for o in waited if o in c.dead_at),
            })
        return {
            "crashes": crashes,
            "declarations": {"count": len(self.declarations), "by_class": by_class},
            "partition": None if self.sides is None else {
                "sides": [sorted(s, key=_node_order) for s in self.sides],
                "at_s": self.partition_at,
                "heal_s": self.heal_at,
            },
        }

    def write(self, out_dir: Path) -> Path:
        path = out_dir / TRUTH_FILE
        path.write_text(json.dumps(self.as_json(), indent=2) + "\n", encoding="utf-8")
        return path


def _node_order(name: str) -> tuple[int, str]:
    digits = name.lstrip("n")
    return (int(digits), name) if digits.isdigit() else (1 << 30, name)
