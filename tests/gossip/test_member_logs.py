"""The member lines (README "Logs"): real GossipService drivers on the in-memory
network in virtual time; each change of another member is one line, with the
member's incarnation."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import trio
import trio.testing

from gossip.service import GossipService
from gossip.trace import NullTraceWriter
from gossip.memory_network import MemoryNetwork
from oplog import EVENT_ATTR, FIELDS_ATTR
from tests.support import until


def lines_about(caplog: pytest.LogCaptureFixture, member: str) -> list[tuple[str, dict[str, Any]]]:
    """(event, fields) of the member lines about `member`, in order."""
    out = []
    for r in caplog.records:
        event = getattr(r, EVENT_ATTR, None)
        if event is not None and event.startswith("member.") and getattr(r, FIELDS_ATTR)["member"] == member:
            assert r.getMessage().startswith(f"{event} member={member} ")
            out.append((event, getattr(r, FIELDS_ATTR)))
    return out


def view(svc: GossipService) -> dict[str, str]:
    return {m["id"]: m["state"] for m in svc.members()}


def test_joined_suspect_dead_rejoined_left(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="meshd.gossip")

    async def main() -> None:
        net = MemoryNetwork(latency=0.002, seed=1)
        scopes: dict[str, trio.CancelScope] = {}
        services: dict[str, GossipService] = {}
        async with trio.open_nursery() as nursery:
            await nursery.start(net.run)

            async def start(node: str, seeds: list[tuple[str, int]]) -> None:
                svc = GossipService(node_id=node, bind_host=node, bind_port=7946, seeds=seeds, mdns=False,
                                    trace=NullTraceWriter(), preset="lan", transport=net.transport(node),
                                    seed=len(scopes))
                services[node] = svc
                scope = scopes[node] = trio.CancelScope()

                async def runner(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
                    with scope:
                        await svc.run(task_status=task_status)

                await nursery.start(runner)

            # Two members: every line about v1 is v0's (each node logs what it sees).
            await start("v0", [])
            await start("v1", [("v0", 7946)])
            v0 = services["v0"]
            await until(lambda: view(v0) == {"v0": "alive", "v1": "alive"}, 30)
            ((event, joined),) = lines_about(caplog, "v1")
            assert event == "member.joined" and joined["address"] == "v1:7946"

            # v1 crashes: v0 suspects it, then holds it dead
            scopes["v1"].cancel()
            net.transports[("v1", 7946)].close()
            await until(lambda: view(v0)["v1"] == "dead", 120)
            assert [e for e, _ in lines_about(caplog, "v1")] == ["member.joined", "member.suspect", "member.dead"]
            dead = lines_about(caplog, "v1")[-1][1]
            assert dead["incarnation"] >= joined["incarnation"]

            # v1 comes back on the same address: rejoined, with a higher incarnation
            await start("v1", [("v0", 7946)])
            await until(lambda: view(v0)["v1"] == "alive", 60)
            event, back = lines_about(caplog, "v1")[-1]
            assert event == "member.rejoined" and back["incarnation"] > dead["incarnation"]

            # v1 leaves: left, not dead
            await services["v1"].leave()
            await until(lambda: view(v0)["v1"] == "left", 60)
            assert [e for e, _ in lines_about(caplog, "v1")][-2:] == ["member.rejoined", "member.left"]
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
