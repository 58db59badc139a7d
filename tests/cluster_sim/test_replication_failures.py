"""A replica whose disk write fails (issue 29, bad input): it says so, refuses the
copies it cannot keep, and its owner marks it failed and puts the session's copy on
another member; the acknowledgements wait for that one, not for ever."""

from __future__ import annotations

import errno
import logging

import pytest
import trio

from simulation.cluster import SimCluster
from tests.cluster_sim.helpers import numbers, sim, wait_route
from tests.cluster_sim.test_replication import EXPIRY, replication, wait_dead


def replicas_of(c: SimCluster, owner: str, client_id: str) -> list[str]:
    replicas = (replication(c, owner).describe(client_id) or {}).get("replicas")
    assert isinstance(replicas, list)
    return [str(r["node"]) for r in replicas]


def test_a_replica_whose_writes_fail_is_marked_failed_replaced_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="meshd")

    async def scenario(c: SimCluster) -> None:
        sub = await c.connect("n0", "full", clean_start=False, session_expiry=EXPIRY)
        await sub.subscribe("full/q", 1)
        await wait_route(c, "full/q", {"n0"})
        await sub.disconnect()
        await c.wait_for(lambda: len(replicas_of(c, "n0", "full")) == 1 and replicas_of(c, "n0", "full")[0] in
                         {n for n in ("n1", "n2") if replication(c, n).copies_held.get("full") is not None},
                         10, "the session's copy on its replica")
        [broken] = replicas_of(c, "n0", "full")
        other = "n1" if broken == "n2" else "n2"
        c.fail_disk(broken, OSError(errno.ENOSPC, "No space left on device"))
        pub = await c.connect(other, "full-pub")
        start = c.clock.now()
        assert await pub.publish("full/q", b"0", qos=1) == 0
        # Bounded: at most the replica's time to answer, then the new copy's snapshot.
        assert c.clock.now() - start < 3.0, f"acknowledged after {c.clock.now() - start:.3f} s"
        assert replicas_of(c, "n0", "full") == [other]
        assert replication(c, "n0").stats.replaced == 1
        for i in range(1, 5):
            assert await pub.publish("full/q", str(i).encode(), qos=1) == 0
        logged = [(r.levelname, r.getMessage()) for r in caplog.records]
        assert any(level == "ERROR" and "No space left on device" in text for level, text in logged), logged
        assert any(level == "WARNING" and f"replica {broken} failed" in text for level, text in logged), logged
        # The copy that counts is the new one: the owner dies, nothing acknowledged is lost.
        await c.crash("n0")
        await wait_dead(c, "n0")
        await sub.reconnect(other, session_expiry=EXPIRY)
        assert sub.session_present
        await c.wait_for(lambda: len(sub.received) >= 5, 10, "the 5 acknowledged messages")
        assert numbers(sub.received) == list(range(5))

    sim(scenario, session_replicas=2)


def test_a_node_whose_disk_fails_keeps_its_batch_and_writes_it_when_the_disk_is_back() -> None:
    """The committer does not die with a failed write: it says so, keeps the batch and
    tries again every second; acknowledgements wait meanwhile, none is lost."""

    async def scenario(c: SimCluster) -> None:
        sub = await c.connect("n0", "keep", clean_start=False, session_expiry=EXPIRY)
        await sub.subscribe("keep/q", 1)
        await sub.disconnect()
        pub = await c.connect("n0", "keep-pub")
        c.fail_disk("n0", OSError(errno.EIO, "Input/output error"))
        acked: list[int] = []

        async def publish() -> None:
            acked.append(await pub.publish("keep/q", b"0", qos=1) or 0)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(publish)
            await c.run_for(3.0)
            assert acked == [] and c.running("n0").store.write_failed
            c.fail_disk("n0", None)
            await c.wait_for(lambda: acked == [0], 3, "the acknowledgement once the disk is back")
        assert c.running("n0").store.write_failed is None
        await sub.reconnect("n0", session_expiry=EXPIRY)
        await c.wait_for(lambda: len(sub.received) == 1, 5, "the message")

    sim(scenario, nodes=1, session_replicas=1)
