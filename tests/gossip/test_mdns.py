"""mDNS discovery decisions (no multicast here: the namespace test covers the wire)."""

from __future__ import annotations

import random
from typing import Sequence

import trio

from clock import TrioClock
from gossip.config import LAN, LOCAL, GossipConfig
from gossip.mdns import MdnsDiscovery


class FakeService:
    node_id = "me"
    cluster_name = "c"
    address: tuple[str, int] | None = ("10.0.0.9", 7946)

    def __init__(self, config: GossipConfig = LAN) -> None:
        self.config = config
        self.alive: list[str] = []
        self.joined: list[list[tuple[str, int]]] = []

    def alive_members(self) -> list[str]:
        return list(self.alive)

    def join(self, addrs: Sequence[tuple[str, int]]) -> None:
        self.joined.append(list(addrs))


def props(node: str, cluster: str = "c", **extra: str) -> dict[str, str]:
    return {"node_id": node, "port": "7946", "cluster": cluster, **extra}


async def test_announcements_of_members_we_reach_are_ignored_lost_ones_joined(autojump_clock):
    svc = FakeService()
    d = MdnsDiscovery(svc, clock=TrioClock(), rng=random.Random(1))
    svc.alive = ["b"]
    d._found("10.0.0.2", 7946, props("b", seq="3"))  # a re-announcement of a live member
    assert svc.joined == []
    d._found("10.0.0.3", 7946, props("x", cluster="other"))
    d._found("10.0.0.1", 7946, props("me"))
    assert svc.joined == [] and d.ignored_other_cluster == 1
    svc.alive = []  # b was lost (a split): its next announcement brings it back
    d._found("10.0.0.2", 7946, props("b", seq="4"))
    assert svc.joined == [[("10.0.0.2", 7946)]]
    d._found("10.0.0.2", 7946, props("b", seq="5"))  # not again right away
    assert len(svc.joined) == 1
    await trio.sleep(LAN.mdns_reannounce_interval)
    d._found("10.0.0.2", 7946, props("b", seq="6"))
    assert len(svc.joined) == 2


async def test_fast_preset_rejoins_after_one_reannounce_interval(autojump_clock):
    svc = FakeService(LOCAL)
    d = MdnsDiscovery(svc, clock=TrioClock(), rng=random.Random(1))
    d._found("10.0.0.2", 7946, props("b"))
    await trio.sleep(LOCAL.mdns_reannounce_interval)
    d._found("10.0.0.2", 7946, props("b"))
    assert len(svc.joined) == 2
