"""Gossip configuration presets.

Every number is explained where it is set, because each one trades detection speed
against false positives or bandwidth.  LAN follows hashicorp/memberlist's
``DefaultLANConfig``; WAN follows its ``DefaultWANConfig``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, cast


@dataclass(frozen=True)
class GossipConfig:
    # How often we probe one member (SWIM protocol period).  Lifeguard's local
    # health multiplier scales this up to ``awareness_max_multiplier`` times.
    probe_interval: float = 1.0
    # How long we wait for a direct ack before asking ``indirect_checks`` others to
    # ping-req.  Should sit well above the 99th percentile round trip.
    probe_timeout: float = 0.5
    # Members asked to probe indirectly when the direct probe times out (SWIM's k).
    indirect_checks: int = 3
    # Broadcasts are also pushed to ``gossip_nodes`` random members every
    # ``gossip_interval``, on top of piggybacking on pings and acks.
    gossip_interval: float = 0.2
    gossip_nodes: int = 3
    # Dead members still receive gossip this long, so they learn they were declared
    # dead and can refute; they are forgotten (reaped) after ``dead_reclaim_time``.
    gossip_to_the_dead_time: float = 30.0
    dead_reclaim_time: float = 60.0
    # Each broadcast is sent retransmit_mult * ceil(log10(N + 1)) times; 4 reaches
    # every member of a lossy 1,000-node cluster with high probability.
    retransmit_mult: int = 4
    # Suspicion lasts suspicion_mult * max(1, log10 N) * probe_interval when enough
    # independent confirmations arrive, and up to suspicion_max_timeout_mult times that
    # when the accuser is alone (Lifeguard's dynamic suspicion).
    suspicion_mult: int = 4
    suspicion_max_timeout_mult: int = 6
    # A suspicion heard from others starts as old as its accusation (the accuser's
    # timestamp, or the sender's for a push-pull), up to suspicion_age_credit *
    # max(1, log10 N) probe intervals: the dissemination time the timeout's log N
    # factor budgets.  So every member declares the accused dead about one timeout
    # after the first accusation, not one timeout after gossip happened to reach
    # it.  The cap bounds what clock skew can take off a suspicion (at most a
    # quarter of the timeout at suspicion_mult 4).  0: start at receipt (memberlist).
    suspicion_age_credit: float = 1.0
    # Full state exchange over TCP with one random member; scaled up above 32 members
    # so the total push-pull load stays flat as the cluster grows.
    push_pull_interval: float = 30.0
    # Lifeguard local health: probes and suspicion timeouts of an unhealthy node
    # stretch by up to this factor (score 0 .. max-1).
    awareness_max_multiplier: int = 8
    # Once three members are suspect at once, probe sweep_mult * ceil(log10 N) extra
    # members per interval for three intervals (0: never), so a netsplit's far side
    # is suspected within seconds instead of waiting for the round robin.
    sweep_mult: int = 8
    # Lifeguard master switch (local health, nack, dynamic suspicion, buddy system);
    # off gives classic SWIM, which the simulator compares against.
    lifeguard: bool = True
    # Broadcasts seen in the last broadcast_retain_time seconds (at most
    # broadcast_retain_count of them) are also exchanged in push-pull, so a member the
    # epidemic happened to miss still gets them (serf's event buffer).
    broadcast_retain_time: float = 300.0
    broadcast_retain_count: int = 512
    # After a direct probe times out, also ping the target over TCP (memberlist's
    # fallback): UDP loss alone then no longer makes a live member suspect.
    tcp_fallback: bool = True
    # A seed join is retried this often while we know no live member.
    rejoin_interval: float = 5.0
    # Every reconnect_interval we may try a push-pull with one member we consider
    # dead (serf's reconnect: with probability lost / alive, so the cluster as a
    # whole tries each lost member about once per interval).  Each lost member backs
    # off from reconnect_interval, doubling, up to reconnect_max_interval, and is
    # tried for reconnect_dead_for after we lost it (days: serf gives up after 24 h
    # and stays split for good), so the two sides of a healed partition find each
    # other again without an operator.  The cap bounds how long a heal waits for the
    # first contact after the link returns.
    reconnect_interval: float = 2.0
    reconnect_max_interval: float = 8.0
    reconnect_dead_for: float = 3 * 24 * 3600.0
    # mDNS: re-announce ourselves this often (0: never), so a member that lost us
    # (a healed split) finds us again by mDNS alone; members we already reach
    # ignore the announcements.
    mdns_reannounce_interval: float = 30.0
    # UDP payload bound: stays under a 1,500-byte Ethernet MTU with IP/UDP headers.
    udp_buffer_size: int = 1400

    def with_(self, **changes: float) -> "GossipConfig":
        """A copy with some settings changed (``replace`` refuses unknown names).
        The fields hold ints, floats and bools, so no one value type fits them all
        for mypy: the changes go through as ``Any``."""
        return replace(self, **cast(dict[str, Any], changes))


# memberlist DefaultLANConfig: a switched LAN, round trips well under 100 ms.
LAN = GossipConfig()

# memberlist DefaultWANConfig: round trips up to a few hundred ms and more loss, so
# probe less often, wait longer for acks, gossip less often to more members, and
# suspect for longer before declaring dead.
WAN = GossipConfig(
    probe_interval=5.0,
    probe_timeout=3.0,
    gossip_interval=0.5,
    gossip_nodes=4,
    gossip_to_the_dead_time=60.0,
    dead_reclaim_time=120.0,
    suspicion_mult=6,
    push_pull_interval=60.0,
    reconnect_interval=5.0,
    reconnect_max_interval=30.0,
)

# Loopback and tests: same shape as LAN, ten times faster.
LOCAL = GossipConfig(
    probe_interval=0.2,
    probe_timeout=0.1,
    gossip_interval=0.05,
    gossip_to_the_dead_time=5.0,
    dead_reclaim_time=10.0,
    suspicion_mult=3,
    push_pull_interval=5.0,
    rejoin_interval=0.5,
    reconnect_interval=0.2,
    reconnect_max_interval=0.8,
    mdns_reannounce_interval=3.0,
)

PRESETS: dict[str, GossipConfig] = {"lan": LAN, "wan": WAN, "local": LOCAL}


def preset(name: str) -> GossipConfig:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown gossip preset {name!r} (choose from {sorted(PRESETS)})") from None
