"""Fixtures shared by the whole suite."""

from __future__ import annotations

from typing import Any, Callable, Iterator

import pytest

from tests.support import RunningNode, node_settings


@pytest.fixture
def node_factory(tmp_path: Any) -> Iterator[Callable[..., RunningNode]]:
    """Start real nodes (in background threads) with the given setting overrides."""
    started: list[RunningNode] = []

    def start(**overrides: Any) -> RunningNode:
        data_dir = tmp_path / f"node{len(started)}"
        node = RunningNode(node_settings(str(data_dir), **overrides)).start()
        started.append(node)
        return node

    yield start
    for node in started:
        node.stop()


@pytest.fixture
def node(node_factory: Callable[..., RunningNode]) -> RunningNode:
    return node_factory()
