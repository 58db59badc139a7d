"""Ten real meshd processes: a subscription on one node is reached from every other
node (the timing figures come from scripts/bench/route_convergence.py, not from here)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench" / "route_convergence.py"


def load_script():
    spec = importlib.util.spec_from_file_location("route_convergence", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_node_reaches_a_new_subscription():
    result = load_script().run(10, 2, "local", 20.0)
    assert result["missing"] == 0
    assert result["samples"] == 18
