"""`mdns_port`: discovery on another port than 5353, on this host's LAN interface.
Nodes on one mDNS port find each other; a node on another port hears none of them
(two clusters, or two test runs, on one host keep discovery apart)."""

from __future__ import annotations

import random
import uuid
from typing import Sequence

import trio

from clock import TrioClock
from gossip.config import LOCAL
from gossip.mdns import MdnsDiscovery
from gossip.service import _advertise_guess
from tests.support import free_port, until


class Host:
    config = LOCAL

    def __init__(self, node_id: str, address: tuple[str, int], cluster: str) -> None:
        self.node_id = node_id
        self.address: tuple[str, int] | None = address
        self.cluster_name = cluster
        self.joined: list[tuple[str, int]] = []

    def alive_members(self) -> list[str]:
        return []

    def join(self, addrs: Sequence[tuple[str, int]]) -> None:
        self.joined.extend(addrs)


def test_nodes_find_each_other_only_on_the_same_mdns_port() -> None:
    lan = _advertise_guess("0.0.0.0")  # the interface meshd announces on
    cluster = f"t-{uuid.uuid4().hex[:8]}"  # another run of this test is another cluster
    shared, other = free_port(), free_port()
    a, b, c = (Host(n, (lan, 7000 + i), cluster) for i, n in enumerate(("a", "b", "c")))

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for host, port in ((a, shared), (b, shared), (c, other)):
                nursery.start_soon(MdnsDiscovery(host, clock=TrioClock(), rng=random.Random(1), port=port).run)
            await until(lambda: a.joined and b.joined, 20)
            # c announced and browsed all along: by now it would have heard a and b on 5353 or `shared`.
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert a.joined == [(lan, 7001)] and b.joined == [(lan, 7000)]
    assert c.joined == []
