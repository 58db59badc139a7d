"""A whole node on Trio's MockClock: every timer of the node reads the one injected
clock, so virtual time drives `$SYS` rounds and session expiry to the exact instant."""

from __future__ import annotations

from pathlib import Path
from typing import Awaitable, Callable

import trio
import trio.testing

from clock import TrioClock
from mesh.compose import build_node
from mesh.node import Node
from session_store.store import StoredSession
from tests.support import node_settings

EPOCH = 1_800_000_000.0  # the node's wall time at virtual time 0


def retained_text(node: Node, topic: str) -> str | None:
    msg = node.broker.retained.get(topic)
    return None if msg is None else msg.payload.decode()


def run_on_mock_clock(tmp_path: Path, test: Callable[[Node], Awaitable[None]], **overrides: object) -> None:
    async def main() -> None:
        node = build_node(node_settings(str(tmp_path / "node"), **overrides), clock=TrioClock(wall_epoch=EPOCH))
        async with trio.open_nursery() as nursery:
            await nursery.start(node.serve)
            await test(node)
            node.request_shutdown()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_sys_rounds_follow_virtual_time(tmp_path: Path) -> None:
    async def check(node: Node) -> None:
        start = node.started_at - EPOCH  # virtual time the node was built at
        await trio.sleep_until(start + 29.999)
        assert retained_text(node, "$SYS/broker/uptime") == "20 seconds"
        await trio.sleep_until(start + 30.001)
        assert retained_text(node, "$SYS/broker/uptime") == "30 seconds"
        assert retained_text(node, "$SYS/broker/node") == "test-node"

    run_on_mock_clock(tmp_path, check, sys_interval=10)


def test_an_offline_session_expires_at_its_virtual_deadline(tmp_path: Path) -> None:
    async def check(node: Node) -> None:
        now = node.clock.wall()
        node.broker.install_session(StoredSession(client_id="sleeper", expiry_interval=60, protocol_level=5), now)
        start = trio.current_time()
        await trio.sleep_until(start + 59.999)
        assert "sleeper" in node.broker.sessions
        await trio.sleep_until(start + 60.001)
        assert "sleeper" not in node.broker.sessions

    run_on_mock_clock(tmp_path, check)
