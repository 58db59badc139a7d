"""Fixtures shared by the whole suite."""

from __future__ import annotations

from typing import Any, Callable, Iterator

import pytest

from tests.support import LAUNCHED, RunningNode, node_settings


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


# The suite runs on two pytest-xdist workers (scripts/test). Tests that share something
# the machine has only once run on one worker, one after another: the network
# namespace labs (fixed namespace names), mDNS on the host's LAN interface, and Spark
# (one JVM, started once, instead of one per worker), and headless Chromium (one
# browser at a time next to the real meshd processes it looks at).
_SERIAL_GROUPS = {"netns": "netns", "spark": "spark", "browser": "browser"}
_SERIAL_MODULES = {"test_mdns": "mdns", "test_mdns_port": "mdns"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        group = next((g for marker, g in _SERIAL_GROUPS.items() if item.get_closest_marker(marker)), None)
        group = group or _SERIAL_MODULES.get(item.module.__name__.rsplit(".", 1)[-1] if item.module else "")
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(autouse=True)
def no_meshd_process_crashed() -> Iterator[None]:
    """After each test: a `meshd` child process (tests.support.MeshdProcess) that ended
    by itself with a traceback fails the test with that traceback, even when what the
    test asserted still held (a node that died was only seen as "no message came").
    Processes ended by the test (SIGKILL, SIGTERM) do not count."""
    yield
    crashes = []
    for proc in list(LAUNCHED):
        if proc.proc is None or proc.proc.poll() is None:
            continue  # still running (a module's cluster): looked at after a later test
        LAUNCHED.remove(proc)
        run = proc.crash()
        if run is not None:
            crashes.append(f"meshd {proc.node_id or proc.data_dir} exited with code {proc.proc.returncode}:\n{run[-4000:]}")
    if crashes:
        pytest.fail("\n\n".join(crashes), pytrace=False)
