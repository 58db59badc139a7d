"""A node's process runs with a young-generation GC threshold that forwarded messages
in flight on a mesh link do not reach (mesh.run.YOUNG_GC_THRESHOLD)."""

from __future__ import annotations

import gc

import pytest

import mesh.run
from mesh.config import Settings


def test_a_node_runs_with_the_raised_young_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[int, int, int]] = []
    monkeypatch.setattr(mesh.run.trio, "run", lambda *args: seen.append(gc.get_threshold()))
    before = gc.get_threshold()
    try:
        assert mesh.run.run_node(Settings()) == 0
    finally:
        gc.set_threshold(*before)
    # The older generations keep theirs; only the young one waits longer.
    assert seen == [(mesh.run.YOUNG_GC_THRESHOLD, before[1], before[2])]
    assert mesh.run.YOUNG_GC_THRESHOLD > 10 * 700
