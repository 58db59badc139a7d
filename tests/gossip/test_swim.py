"""The SWIM + Lifeguard state machine, driven with explicit time."""

from __future__ import annotations

import random

import cbor2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gossip import wire
from gossip.config import LAN
from gossip.events import ALIVE, DEAD, LEFT, SUSPECT, BroadcastReceived, MemberChanged
from gossip.formulas import retransmit_limit, suspicion_age_cap, suspicion_bounds
from gossip.swim import Swim, frame_body

from .helpers import Cluster, addr_of, packet

CFG = LAN.with_(push_pull_interval=1000.0)  # keep push-pull out of the way unless tested


def lone(name: str = "a", **kw) -> Swim:
    sw = Swim(name, addr_of(name), now=0.0, rng=random.Random(1), config=kw.pop("config", CFG), **kw)
    sw.bootstrap([("b", addr_of("b")), ("c", addr_of("c")), ("d", addr_of("d"))], 0.0)
    sw.events()
    return sw


def alive(node: str, inc: int) -> list:
    return ["alive", node, inc, node, 7946, 1, 0]


def suspect(node: str, inc: int, by: str = "c", ots: int = 1, hops: int = 0) -> list:
    return ["suspect", node, inc, by, ots, hops]


def dead(node: str, inc: int, by: str = "c") -> list:
    return ["dead", node, inc, by, 1, 0]


def sent_parts(sw: Swim, now: float) -> list[list]:
    return [m for _, d in sw.datagrams_to_send(now) for m in wire.decode_packet(d)[1]]


def feed(sw: Swim, *msgs: list, now: float = 0.1, sender: str = "c") -> None:
    sw.receive(packet(sender, *msgs), addr_of(sender), now)


def us(t: float) -> int:
    """A trace timestamp (µs) for time t: what an accuser stamps a suspicion with."""
    return int(round(t * 1_000_000))


# ---------------------------------------------------------------- precedence

@pytest.mark.parametrize(
    "first, second, expected_state, expected_inc",
    [
        # alive(i) overrides suspect(j) iff i > j
        (suspect("b", 2), alive("b", 3), ALIVE, 3),
        (suspect("b", 2), alive("b", 2), SUSPECT, 2),
        (suspect("b", 2), alive("b", 1), SUSPECT, 2),
        # suspect(i) overrides alive(j) iff i >= j
        (alive("b", 2), suspect("b", 2), SUSPECT, 2),
        (alive("b", 2), suspect("b", 3), SUSPECT, 3),
        (alive("b", 2), suspect("b", 1), ALIVE, 2),
        # alive(i) overrides alive(j) iff i > j (state stays alive, incarnation moves)
        (alive("b", 2), alive("b", 5), ALIVE, 5),
        (alive("b", 5), alive("b", 2), ALIVE, 5),
        # dead wins over alive and suspect of the same or older incarnation
        (alive("b", 2), dead("b", 2), DEAD, 2),
        (suspect("b", 2), dead("b", 2), DEAD, 2),
        (alive("b", 2), dead("b", 1), ALIVE, 2),
        (dead("b", 2), suspect("b", 3), DEAD, 2),
        # a dead member comes back only with a newer incarnation
        (dead("b", 2), alive("b", 2), DEAD, 2),
        (dead("b", 2), alive("b", 3), ALIVE, 3),
        # dead "by" the member itself is a graceful leave
        (alive("b", 1), dead("b", 1, by="b"), LEFT, 1),
    ],
)
def test_incarnation_precedence(first: list, second: list, expected_state: str, expected_inc: int) -> None:
    sw = lone()
    feed(sw, first)
    feed(sw, second, now=0.2)
    m = sw.members["b"]
    assert (m.state, m.incarnation) == (expected_state, expected_inc)


def test_state_changes_are_reported_with_origin_and_hops() -> None:
    sw = lone()
    feed(sw, suspect("b", 0, by="d", ots=12345, hops=2), now=1.0)
    evs = [e for e in sw.events() if isinstance(e, MemberChanged)]
    assert len(evs) == 1
    ev = evs[0]
    assert (ev.member, ev.state, ev.origin, ev.origin_ts_us, ev.hops, ev.ts_us) == ("b", SUSPECT, "d", 12345, 3, 1_000_000)


def test_unknown_member_learned_from_alive_and_rebroadcast() -> None:
    sw = lone()
    feed(sw, alive("z", 4))
    assert sw.members["z"].state == ALIVE and sw.members["z"].addr == addr_of("z")
    # the news is passed on, piggybacked on the next packet we send
    sw.handle_timer(5.0)
    assert ["alive", "z", 4, "z", 7946, 1, 1] in sent_parts(sw, 5.0)


def test_suspect_and_dead_of_unknown_member_ignored() -> None:
    sw = lone()
    feed(sw, suspect("zz", 1), dead("zz", 1))
    assert "zz" not in sw.members


# ---------------------------------------------------------------- refutation

def test_suspicion_about_ourselves_is_refuted_with_higher_incarnation() -> None:
    sw = lone()
    assert sw.incarnation == 0 and sw.health == 0
    feed(sw, suspect("a", 3))
    assert sw.incarnation == 4
    assert sw.members["a"].state == ALIVE
    assert sw.health == 1  # Lifeguard: being accused counts against our own health
    sw.handle_timer(5.0)
    assert any(m[:3] == ["alive", "a", 4] for m in sent_parts(sw, 5.0))


def test_dead_about_ourselves_is_refuted_too() -> None:
    sw = lone()
    feed(sw, dead("a", 7))
    assert sw.incarnation == 8 and sw.members["a"].state == ALIVE


def test_declared_dead_starts_a_burst_of_push_pulls_suspected_does_not() -> None:
    from gossip.swim import HEAL_BURST_PUSH_PULLS

    def push_pulls(sw: Swim, until: float) -> int:
        count, t = 0, 0.1
        while t < until:
            sw.handle_timer(t)
            for _, frame in sw.streams_to_open():
                # reconnects to lost members build their frame lazily (callables)
                if isinstance(frame, bytes) and wire.decode_frame_body(frame)["t"] == wire.PUSH_PULL:
                    count += 1
            sw.datagrams_to_send(t)
            t += 0.05
        return count

    calm = lone()
    feed(calm, suspect("a", 0))
    assert push_pulls(calm, 10 * CFG.probe_interval) == 0
    healed = lone()
    feed(healed, dead("a", 0))
    assert push_pulls(healed, 10 * CFG.probe_interval) == HEAL_BURST_PUSH_PULLS


def test_refutation_spreads_and_clears_the_suspicion() -> None:
    c = Cluster(["a", "b", "c", "d"], CFG)
    c.drop = lambda src, dst, types: dst == "b" or src == "b"
    c.run_until(5.0)  # b unreachable: somebody suspects it
    assert any(c.state(n, "b") == SUSPECT for n in "acd")
    c.drop = lambda src, dst, types: False
    c.run_until(8.0)
    for n in "acd":
        assert c.state(n, "b") == ALIVE
    assert c.nodes["b"].incarnation >= 1


# ---------------------------------------------------------------- suspicion timeouts

def test_lone_accuser_waits_the_maximum_suspicion_timeout() -> None:
    sw = lone()
    n = sw.num_members()
    lo, hi = suspicion_bounds(CFG.suspicion_mult, CFG.suspicion_max_timeout_mult, n, CFG.probe_interval)
    # with 4 members k = min(mult-2, n-2) = 2 confirmations expected
    feed(sw, suspect("b", 0, by="c", ots=us(10.0)), now=10.0)
    sw.handle_timer(10.0 + hi - 0.01)
    assert sw.members["b"].state == SUSPECT
    sw.handle_timer(10.0 + hi)
    assert sw.members["b"].state == DEAD


def test_independent_confirmations_shrink_the_timeout_to_the_minimum() -> None:
    sw = lone()
    lo, hi = suspicion_bounds(CFG.suspicion_mult, CFG.suspicion_max_timeout_mult, sw.num_members(), CFG.probe_interval)
    feed(sw, suspect("b", 0, by="c", ots=us(10.0)), now=10.0)
    feed(sw, suspect("b", 0, by="d"), now=10.5, sender="d")
    feed(sw, suspect("b", 0, by="c"), now=10.6)  # the same accuser again does not count
    sw.handle_timer(10.0 + lo + 1.0)
    assert sw.members["b"].state == SUSPECT
    feed(sw, suspect("b", 0, by="a2"), now=11.0)  # second independent confirmation: k reached
    sw.handle_timer(10.0 + lo - 0.01)
    assert sw.members["b"].state == SUSPECT
    sw.handle_timer(10.0 + lo + 1.01)
    assert sw.members["b"].state == DEAD


def test_without_lifeguard_the_suspicion_timeout_is_fixed_at_min() -> None:
    sw = lone(config=CFG.with_(lifeguard=False))
    lo, _ = suspicion_bounds(CFG.suspicion_mult, CFG.suspicion_max_timeout_mult, sw.num_members(), CFG.probe_interval)
    feed(sw, suspect("b", 0, by="c", ots=us(10.0)), now=10.0)
    sw.handle_timer(10.0 + lo - 0.01)
    assert sw.members["b"].state == SUSPECT
    sw.handle_timer(10.0 + lo)
    assert sw.members["b"].state == DEAD
    assert [e.origin for e in sw.events() if isinstance(e, MemberChanged) and e.state == DEAD] == ["a"]


def _dead_at(sw: Swim, start: float, stop: float, step: float = 0.01) -> float | None:
    t = start
    while t <= stop:
        sw.handle_timer(t)
        if sw.members["b"].state == DEAD:
            return t
        t = round(t + step, 6)
    return None


def _suspected_at(now: float, ots_s: float, **cfg: object) -> float | None:
    """When a lone node declares b dead after hearing at `now` of a suspicion stamped
    `ots_s` (with enough confirmations at once for the minimum timeout)."""
    sw = lone(config=CFG.with_(**cfg))
    feed(sw, suspect("b", 0, by="c", ots=us(ots_s)), now=now)
    feed(sw, suspect("b", 0, by="d"), suspect("b", 0, by="e"), now=now, sender="d")
    return _dead_at(sw, now, now + 20.0)


def test_a_suspicion_heard_late_counts_from_its_accusation() -> None:
    lo, _ = suspicion_bounds(CFG.suspicion_mult, CFG.suspicion_max_timeout_mult, 4, CFG.probe_interval)
    cap = suspicion_age_cap(CFG.suspicion_age_credit, 4, CFG.probe_interval)
    assert cap == 1.0 and lo == 4.0
    # accused at 9.4, heard here at 10.0: dead at 9.4 + lo, as at the accuser
    assert _suspected_at(10.0, 9.4) == pytest.approx(9.4 + lo)
    # heard at once: the full timeout from now
    assert _suspected_at(10.0, 10.0) == pytest.approx(10.0 + lo)
    # an old accusation (or a clock far ahead of the accuser's) is credited at most cap
    assert _suspected_at(10.0, 2.0) == pytest.approx(10.0 - cap + lo)
    # a stamp from the future (our clock behind the accuser's) gives no credit
    assert _suspected_at(10.0, 12.0) == pytest.approx(10.0 + lo)
    # credit 0: memberlist's rule, the timeout runs from when we heard
    assert _suspected_at(10.0, 9.4, suspicion_age_credit=0.0) == pytest.approx(10.0 + lo)


def test_push_pull_credits_a_senders_suspicion_but_not_its_dead() -> None:
    lo, _ = suspicion_bounds(CFG.suspicion_mult, CFG.suspicion_max_timeout_mult, 4, CFG.probe_interval)

    def merged(state: str) -> float | None:
        sw = lone()
        d = Swim("d", addr_of("d"), now=0.0, rng=random.Random(2), config=CFG)
        d.bootstrap([(n, addr_of(n)) for n in "abc"], 0.0)
        m = d.members["b"]
        m.state, m.state_change_us = state, us(9.5)  # d began to suspect b (or held it dead) at 9.5
        sw.handle_stream(d._push_pull_frame(10.0, join=False), 10.0)
        assert sw.members["b"].state == SUSPECT  # another node's "dead" is only a suspicion here
        feed(sw, suspect("b", 0, by="c", ots=us(10.0)), suspect("b", 0, by="e", ots=us(10.0)), now=10.0)
        return _dead_at(sw, 10.0, 30.0)

    assert merged(SUSPECT) == pytest.approx(9.5 + lo)
    # a sender's dead dates from its verdict: the accused still gets the whole timeout here
    assert merged(DEAD) == pytest.approx(10.0 + lo)


def test_a_dead_verdict_made_across_a_split_is_only_a_suspicion() -> None:
    sw = lone()
    feed(sw, dead("c", 0, by="d"), now=5.0, sender="d")  # d's verdict: d was with us all along
    assert sw.members["c"].state == DEAD
    # the link returns; c's verdict about b (made while cut off) arrives before c's own news
    feed(sw, ["dead", "b", 0, "c", us(7.0), 0], now=9.9, sender="d")
    assert sw.members["b"].state == SUSPECT and sw.stats.stale_verdicts == 1
    feed(sw, alive("b", 1), now=9.95, sender="b")  # b refutes
    feed(sw, alive("c", 1), now=10.0)  # c is back
    # c declared b dead at 8.0, while it was cut off from us: b may well be alive here
    feed(sw, ["dead", "b", 1, "c", us(8.0), 0], now=10.1, sender="c")
    assert sw.members["b"].state == SUSPECT and sw.stats.stale_verdicts == 2
    # what c decides after it came back counts as usual
    feed(sw, ["dead", "d", 0, "c", us(10.5), 0], now=10.6, sender="c")
    assert sw.members["d"].state == DEAD and sw.stats.stale_verdicts == 2
    # an accused that refutes in time stays alive
    feed(sw, alive("b", 2), now=11.0, sender="b")
    sw.handle_timer(40.0)
    assert sw.members["b"].state == ALIVE


def test_a_dead_verdict_by_a_member_we_do_not_know_or_just_met_is_only_a_suspicion() -> None:
    sw = lone()
    feed(sw, ["dead", "b", 0, "zz", us(0.05), 0], now=0.1, sender="zz")
    assert sw.members["b"].state == SUSPECT
    feed(sw, alive("e", 0), now=2.0)  # e is new to us: its older verdicts were made out of our sight
    feed(sw, ["dead", "d", 0, "e", us(1.5), 0], now=2.1, sender="e")
    assert sw.members["d"].state == SUSPECT and sw.stats.stale_verdicts == 2
    # a graceful leave is the member's own word, wherever it comes from
    feed(sw, ["dead", "c", 0, "c", us(0.05), 0], now=2.2, sender="zz")
    assert sw.members["c"].state == LEFT


# ---------------------------------------------------------------- dissemination

def test_broadcast_retransmit_limit_then_dropped() -> None:
    sw = lone()
    sw.broadcast("cfg", "k1", {"x": 1}, 0.0)
    limit = retransmit_limit(CFG.retransmit_mult, sw.num_members())
    carried = 0
    t = 0.0
    for _ in range(200):
        t += CFG.gossip_interval
        sw.handle_timer(t)
        for _, d in sw.datagrams_to_send(t):
            carried += sum(1 for m in wire.decode_packet(d)[1] if m[0] == "user")
    assert carried == limit == 4


def test_newer_broadcast_with_same_key_invalidates_older() -> None:
    sw = lone()
    sw.broadcast("cfg", "k", 1, 0.0)
    sw.broadcast("cfg", "k", 2, 0.0)
    sw.broadcast("cfg", "other", 3, 0.0)
    sw.handle_timer(1.0)
    payloads = sorted(m[6] for m in sent_parts(sw, 1.0) if m[0] == "user")
    assert set(payloads) == {2, 3}


def test_receiver_delivers_each_broadcast_once_and_ignores_older_versions() -> None:
    sender = lone("b")
    rx = lone("a")
    sender.broadcast("route", "f/1", "v1", 1.0)
    sender.broadcast("route", "f/1", "v2", 2.0)
    v2 = [d for _, d in (sender.handle_timer(3.0) or sender.datagrams_to_send(3.0))]
    assert v2
    for d in v2 * 2:  # duplicates too
        rx.receive(d, addr_of("b"), 3.1)
    got = [e for e in rx.events() if isinstance(e, BroadcastReceived)]
    assert [(e.key, e.payload, e.origin, e.hops) for e in got] == [("f/1", "v2", "b", 1)]
    # an older version arriving late is not delivered
    old = packet("b", ["user", "route", "f/1", "b", 1_000_000, 1, "v1", 0])
    rx.receive(old, addr_of("b"), 3.2)
    assert not [e for e in rx.events() if isinstance(e, BroadcastReceived)]


def test_packets_never_exceed_the_size_bound() -> None:
    sw = lone()
    for i in range(300):
        sw.broadcast("k", f"key{i}", "x" * (i % 200), 0.0)
    sizes = []
    t = 0.0
    for _ in range(100):
        t += 0.2
        sw.handle_timer(t)
        sizes += [len(d) for _, d in sw.datagrams_to_send(t)]
    assert sizes and max(sizes) <= 1400
    assert max(sizes) > 1200  # and they are filled
    with pytest.raises(ValueError):
        sw.broadcast("k", "huge", "y" * 1400, t)


def test_packet_limit_leaves_room_for_encryption() -> None:
    sw = Swim("a", addr_of("a"), now=0.0, rng=random.Random(1), config=CFG, packet_limit=1400 - 33)
    sw.bootstrap([("b", addr_of("b"))], 0.0)
    for i in range(100):
        sw.broadcast("k", f"key{i}", "x" * 100, 0.0)
    sw.handle_timer(1.0)
    assert max(len(d) for _, d in sw.datagrams_to_send(1.0)) <= 1367


def test_broadcast_reaches_everyone_in_a_cluster() -> None:
    names = [f"n{i}" for i in range(12)]
    c = Cluster(names, CFG)
    c.nodes["n3"].broadcast("cfg", "k", {"v": 1}, 0.0)
    c.run_until(3.0)
    for n in names:
        if n != "n3":
            got = [e for e in c.events[n] if isinstance(e, BroadcastReceived)]
            assert [(e.origin, e.payload) for e in got] == [("n3", {"v": 1})]


# ---------------------------------------------------------------- probes, acks, nacks

def test_direct_ack_keeps_member_alive_and_improves_health() -> None:
    c = Cluster(["a", "b"], CFG)
    c.nodes["a"].health = 2
    c.run_until(10.0)
    assert c.state("a", "b") == ALIVE and c.nodes["a"].health == 0
    assert c.nodes["a"].stats.probes >= 2


def test_indirect_probe_ack_is_forwarded_and_prevents_suspicion() -> None:
    c = Cluster(["a", "b", "c", "d"], CFG)
    # the direct path a<->b is broken, every other path works
    c.drop = lambda src, dst, types: {src, dst} == {"a", "b"}
    c.run_until(10.0)
    assert c.state("a", "b") == ALIVE
    kinds = {tuple(t) for s, d, t in c.delivered if s in "cd" and d == "a"}
    assert any("ack" in t for t in kinds)
    assert any("ping_req" in t for s, d, t in c.delivered if s == "a")


def test_nacks_from_helpers_when_target_is_down() -> None:
    c = Cluster(["a", "b", "c", "d"], CFG)
    c.down.add("b")
    c.run_until(4.0)
    nacks = [(s, d) for s, d, t in c.delivered if "nack" in t]
    assert nacks and all(d in "acd" and s in "acd" for s, d in nacks)
    # the nacks show a's helpers are fine: a's own health is not blamed for b
    a = c.nodes["a"]
    if a.stats.probe_failures:
        assert a.health == 0


def test_missing_nacks_count_against_our_own_health() -> None:
    c = Cluster(["a", "b", "c", "d"], CFG)
    # a hears nothing from anyone: its own network is the problem
    c.drop = lambda src, dst, types: dst == "a"
    c.run_until(3.0)
    assert c.nodes["a"].health >= 2


def test_crashed_member_is_suspected_then_declared_dead_everywhere() -> None:
    names = [f"n{i}" for i in range(6)]
    c = Cluster(names, CFG)
    c.run_until(2.0)
    c.down.add("n2")
    lo, hi = suspicion_bounds(CFG.suspicion_mult, CFG.suspicion_max_timeout_mult, 6, CFG.probe_interval)
    c.run_until(2.0 + hi + 8.0)
    for n in names:
        if n != "n2":
            assert c.state(n, "n2") == DEAD
    assert all(c.state(a, b) == ALIVE for a in names for b in names if "n2" not in (a, b))


def test_buddy_system_suspect_learns_on_next_probe() -> None:
    sw = lone()
    feed(sw, suspect("b", 0, by="c"), now=0.5)
    sent: list[tuple] = []
    t = 0.5
    def pinged_b() -> bool:
        return any(a == addr_of("b") and wire.decode_packet(d)[1][0][0] == "ping" for a, d in sent)

    while not pinged_b() and t < 20:
        t += 0.1
        sw.handle_timer(t)
        sent += sw.datagrams_to_send(t)
    to_b = [wire.decode_packet(d)[1] for a, d in sent if a == addr_of("b")]
    ping = next(p for p in to_b if p[0][0] == "ping")
    assert ping[1][:2] == ["suspect", "b"]


def test_loop_lag_stretches_a_probe_instead_of_accusing() -> None:
    sw = lone()
    sw.handle_timer(1.0)
    pings = [(a, wire.decode_packet(d)[1][0]) for a, d in sw.datagrams_to_send(1.0)]
    assert pings and pings[0][1][0] == "ping"
    target = pings[0][0][0]
    seq = pings[0][1][1]
    # our loop stalls 2.5 s; the ack arrived meanwhile and is read after the timers
    sw.note_loop_lag(2.5, 4.0)
    sw.handle_timer(4.0)
    sw.receive(packet(target, ["ack", seq]), addr_of(target), 4.0)
    sw.handle_timer(8.0)
    assert all(m.state == ALIVE for m in sw.members.values())
    assert sw.stats.probe_failures == 0


def test_without_lifeguard_a_stalled_prober_accuses() -> None:
    sw = lone(config=CFG.with_(lifeguard=False))
    sw.handle_timer(1.0)
    pings = [(a, wire.decode_packet(d)[1][0]) for a, d in sw.datagrams_to_send(1.0)]
    target, seq = pings[0][0][0], pings[0][1][1]
    sw.note_loop_lag(2.5, 4.0)
    sw.handle_timer(4.0)
    sw.receive(packet(target, ["ack", seq]), addr_of(target), 4.0)
    assert sw.members[target].state == SUSPECT


# ---------------------------------------------------------------- leave, join, rejoin, push-pull

def test_graceful_leave_is_left_not_dead() -> None:
    names = ["a", "b", "c", "d", "e"]
    c = Cluster(names, CFG)
    c.run_until(1.0)
    c.nodes["c"].leave(c.now)
    c.run_until(3.0)
    assert c.nodes["c"].leave_sent
    for n in names:
        assert c.state(n, "c") == LEFT
    evs = [e for e in c.events["a"] if isinstance(e, MemberChanged) and e.member == "c"]
    assert [e.state for e in evs] == [LEFT] and evs[0].origin == "c"


def test_join_through_a_seed_and_push_pull_merge() -> None:
    c = Cluster(["a", "b", "c"], CFG)
    merged: list[object] = []
    new = c.add("z", seed=9)
    new.push_pull_providers["routes"] = (lambda: {"z": 1}, merged.append)
    c.nodes["a"].push_pull_providers["routes"] = (lambda: {"a": 1}, merged.append)
    new.join([addr_of("a")], c.now)
    c.pump()
    assert set(new.members) == {"a", "b", "c", "z"}  # learned the seed's full view
    assert c.state("a", "z") == ALIVE
    assert {"a": 1} in merged and {"z": 1} in merged
    c.run_until(3.0)
    assert all(c.state(n, "z") == ALIVE for n in "abc")


def test_push_pull_from_another_cluster_is_refused() -> None:
    a = lone("a")
    other = Swim("x", addr_of("x"), now=0.0, rng=random.Random(2), config=CFG, cluster_name="other")
    other.join([addr_of("a")], 0.0)
    (_, body), = other.streams_to_open()
    assert a.handle_stream(body, 0.1) is None
    assert "x" not in a.members


def test_rejoin_after_being_declared_dead() -> None:
    names = ["a", "b", "c", "d"]
    c = Cluster(names, CFG)
    c.run_until(1.0)
    c.down.add("d")
    c.run_until(40.0)
    assert all(c.state(n, "d") == DEAD for n in "abc")
    dead_inc = c.nodes["a"].members["d"].incarnation
    # d restarts from scratch (incarnation 0) and joins through a seed
    d = c.add("d", seed=77)
    d.join([addr_of("a")], c.now)
    c.run_until(45.0)
    assert d.incarnation > dead_inc
    for n in "abc":
        assert c.state(n, "d") == ALIVE


def test_lone_node_retries_its_seeds() -> None:
    c = Cluster(["a"], CFG.with_(rejoin_interval=2.0), converged=False)
    a = c.nodes["a"]
    a.join([addr_of("s")], 0.0)
    c.run_until(1.0)
    s = c.add("s", seed=3)  # the seed comes up later
    c.run_until(6.0)
    assert "s" in a.members and "a" in s.members


def test_a_seed_that_was_down_is_found_although_other_members_are_live() -> None:
    # b joins through its seed s while s is down, c joins through b; s then starts with
    # no seeds of its own. b knows a live member (c), yet must keep trying s.
    c = Cluster(["b", "c"], CFG.with_(rejoin_interval=2.0), converged=False)
    c.nodes["b"].join([addr_of("s")], 0.0)
    c.nodes["c"].join([addr_of("b")], 0.0)
    c.run_until(1.0)
    assert c.state("b", "c") == ALIVE
    s = c.add("s", seed=3)
    c.run_until(8.0)
    assert c.state("b", "s") == ALIVE and "b" in s.members and "c" in s.members


# ---------------------------------------------------------------- malformed input

@pytest.mark.parametrize(
    "data, counter",
    [
        (b"", "malformed"),
        (b"\xff\xff\xff", "malformed"),
        (cbor2.dumps([1, 2, 3]), "malformed"),
        (cbor2.dumps({"v": 2, "t": "compound", "from": "x", "m": []}), "bad_version"),
        (cbor2.dumps({"v": 1, "t": "compound", "m": []}), "malformed"),
        (cbor2.dumps({"v": 1, "t": "compound", "from": "x", "m": [1]}), "malformed"),
        (cbor2.dumps({"v": 1, "t": "compound", "from": "x", "m": [[]]}), "malformed"),
        (cbor2.dumps({"v": 1, "t": "ping", "from": "x"}), "malformed"),  # not compound
        (packet("x", ["ping"]), "malformed"),  # no seq
        (packet("x", ["alive", "q", "z", "q", 1, 1, 0]), "malformed"),
        (packet("x", ["alive", "q", 1, "q", "port", 1, 0]), "malformed"),
        (packet("x", ["user", "k", ["unhashable"], "o", 1, 1, None, 0]), "malformed"),
        (packet("x", ["user", "k", "key", 5, 1, 1, None, 0]), "malformed"),
        (packet("x", ["warp", 1]), "unknown_type"),
    ],
)
def test_malformed_packets_are_dropped_and_counted(data: bytes, counter: str) -> None:
    sw = lone()
    before = dict(vars(sw.stats))
    sw.receive(data, addr_of("x"), 1.0)
    assert getattr(sw.stats, counter) == before[counter] + 1
    assert set(sw.members) == {"a", "b", "c", "d"}


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_never_crash(data: bytes) -> None:
    sw = lone()
    sw.receive(data, addr_of("x"), 1.0)
    sw.handle_timer(2.0)


_field = st.one_of(st.sampled_from(["a", "b", "q", "c"]), st.integers(-2, 70000), st.none(), st.booleans(), st.lists(st.integers(), max_size=2))


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["ping", "ack", "nack", "ping_req", "alive", "suspect", "dead", "user"]), st.lists(_field, max_size=8)).map(
            lambda t: [t[0], *t[1]]
        ),
        max_size=5,
    )
)
def test_well_formed_envelopes_with_odd_fields_never_crash(msgs: list[list]) -> None:
    sw = lone()
    sw.receive(packet("x", *msgs), addr_of("x"), 1.0)
    sw.handle_timer(100.0)
    assert sw.members["a"].state == ALIVE


def test_tcp_fallback_ping_saves_a_member_behind_udp_loss() -> None:
    c = Cluster(["a", "b", "c", "d"], CFG)
    # every datagram to or from b is lost, streams still work
    c.drop = lambda src, dst, types: "b" in (src, dst) and types != ["stream"]
    c.run_until(10.0)
    assert all(c.state(n, "b") == ALIVE for n in "acd")
    assert sum(c.nodes[n].stats.fallback_acks for n in "acd") > 0


def test_stream_ping_for_someone_else_is_refused() -> None:
    a = lone("a")
    body = wire.encode_frame_body("ping", "b", {"seq": 4, "target": "zz"})
    assert a.handle_stream(body, 0.1) is None
    reply = a.handle_stream(wire.encode_frame_body("ping", "b", {"seq": 4, "target": "a"}), 0.1)
    assert reply is not None and wire.decode_frame_body(reply)["seq"] == 4


def test_push_pull_hands_over_a_broadcast_the_epidemic_missed() -> None:
    c = Cluster(["a", "b", "c"], CFG)
    c.drop = lambda src, dst, types: dst == "c" and types != ["stream"]  # c misses all gossip
    c.nodes["a"].broadcast("cfg", "k", "v", 0.0)
    c.run_until(5.0)
    assert not [e for e in c.events["c"] if isinstance(e, BroadcastReceived)]
    c.nodes["c"].join([addr_of("b")], c.now)  # any push-pull, here a manual one
    c.pump()
    got = [e for e in c.events["c"] if isinstance(e, BroadcastReceived)]
    assert [(e.origin, e.payload) for e in got] == [("a", "v")]


def test_restart_after_graceful_leave_is_alive_again_at_once() -> None:
    names = ["a", "b", "c", "d"]
    c = Cluster(names, CFG)
    c.run_until(1.0)
    c.nodes["d"].leave(c.now)
    c.run_until(3.0)
    assert all(c.state(n, "d") == LEFT for n in "abc")
    c.down.add("d")
    c.run_until(5.0)
    d = c.add("d", seed=5)  # restarted, incarnation 0 again
    d.join([addr_of("a")], c.now)
    c.run_until(7.0)
    assert all(c.state(n, "d") == ALIVE for n in "abc")
    assert d.incarnation >= 1


def test_being_declared_left_while_running_is_refuted() -> None:
    sw = lone()
    feed(sw, dead("a", 0, by="a"))
    assert sw.incarnation == 1 and sw.members["a"].state == ALIVE


def test_leave_of_a_lone_node_is_done_at_once() -> None:
    sw = Swim("solo", addr_of("solo"), now=0.0, rng=random.Random(1), config=CFG)
    assert not sw.leave_sent
    sw.leave(1.0)
    assert sw.leave_sent and sw.members["solo"].state == LEFT


def _model(state: str, inc: int, msg: list) -> tuple[str, int]:
    """The precedence rules, written out once more as a fold."""
    kind, i = msg[0], msg[2]
    if kind == "alive":
        return (ALIVE, i) if i > inc else (state, inc)
    if kind == "suspect":
        return (SUSPECT, i) if state == ALIVE and i >= inc else (state, inc)
    if state in (DEAD, LEFT) or i < inc:
        return state, inc
    return (LEFT if msg[3] == "b" else DEAD), i


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.integers(0, 6).map(lambda i: alive("b", i)),
            st.integers(0, 6).map(lambda i: suspect("b", i)),
            st.tuples(st.integers(0, 6), st.sampled_from(["c", "b"])).map(lambda t: dead("b", t[0], by=t[1])),
        ),
        max_size=12,
    )
)
def test_precedence_matches_the_model_for_any_message_sequence(msgs: list[list]) -> None:
    sw = lone()
    state, inc = ALIVE, 0
    for k, msg in enumerate(msgs):
        feed(sw, msg, now=0.1 + k * 0.001)  # no timer fires in between
        state, inc = _model(state, inc, msg)
        m = sw.members["b"]
        assert (m.state, m.incarnation) == (state, inc)


@pytest.mark.parametrize("name", ["lan", "wan", "local"])
def test_every_preset_detects_a_crash_and_gets_its_nacks_in_time(name: str) -> None:
    from gossip.config import preset

    cfg = preset(name)
    c = Cluster(["a", "b", "c", "d", "e"], cfg)
    c.run_until(cfg.probe_interval)
    c.down.add("e")
    _, hi = suspicion_bounds(cfg.suspicion_mult, cfg.suspicion_max_timeout_mult, 5, cfg.probe_interval)
    c.run_until(cfg.probe_interval + hi + 10 * cfg.probe_interval)
    # (dead members are forgotten after dead_reclaim_time, so look at the events)
    for n in "abcd":
        assert [e.state for e in c.events[n] if isinstance(e, MemberChanged) and e.member == "e"] == [SUSPECT, DEAD]
    # helpers' nacks arrived before the probers gave up, so nobody blamed itself
    assert all(c.nodes[n].stats.probes_inconclusive == 0 for n in "abcd")
    assert all(c.nodes[n].health == 0 for n in "abcd")


# ---------------------------------------------------------------- sweeps

def test_three_suspects_at_once_start_a_sweep_that_reaches_the_rest_of_a_cut() -> None:
    names = ["a"] + [f"n{i}" for i in range(1, 14)]
    c = Cluster(names, CFG, seed=3)
    c.run_until(1.0)
    far = {"n7", "n8", "n9", "n10", "n11", "n12", "n13"}
    c.drop = lambda src, dst, types: (src in far) != (dst in far)  # a clean cut
    a = c.nodes["a"]
    feed(a, suspect("n7", 0, by="n1"), suspect("n8", 0, by="n2"), now=c.now)
    assert a.stats.sweeps == 0  # two at once may be two slow members
    feed(a, suspect("n9", 0, by="n3"), now=c.now)
    assert a.stats.sweeps == 1
    swept = {m[2] for m in sent_parts(a, c.now) if m[0] == "ping"}
    # everyone else alive is pinged at once (sweep size here covers the cluster),
    # the suspects are left to the regular probe
    assert swept == set(names) - {"a", "n7", "n8", "n9"} - ({a._probe.target} if a._probe else set())
    health = a.health
    c.run_until(c.now + 1.05)
    # the sweep's failed probes had nacks from same-side helpers: conclusive
    assert {n for n in far if c.state("a", n) == SUSPECT} == far
    assert all(c.state("a", n) == ALIVE for n in names[1:7])
    assert a.health <= health  # sweeps leave the health score to the regular probe
    # one sweep per quiet period, however many more suspects show up
    feed(a, suspect("n13", 0, by="n3"), now=c.now)
    assert a.stats.sweeps == 1


def test_a_sweep_from_an_isolated_node_accuses_nobody() -> None:
    names = ["a"] + [f"n{i}" for i in range(1, 9)]
    c = Cluster(names, CFG, seed=5)
    c.run_until(1.0)
    c.drop = lambda src, dst, types: dst == "a"  # a's receive path is broken
    a = c.nodes["a"]
    feed(a, suspect("n1", 0, by="n2"), suspect("n2", 0, by="n3"), suspect("n3", 0, by="n4"), now=c.now)
    first_round = a.stats.sweep_probes
    assert a.stats.sweeps == 1 and first_round >= 4
    c.run_until(c.now + 1.05)
    # not one nack came back: the silence is a's own, so none of it is an accusation
    assert a.stats.probes_inconclusive >= first_round
    assert all(c.state("a", n) == ALIVE for n in names[4:])


def test_after_each_sweep_round_what_was_found_goes_out_in_a_push_pull() -> None:
    sw = lone()
    sw.bootstrap([(n, addr_of(n)) for n in "efgh"], 0.0)
    feed(sw, suspect("b", 0, by="c"), suspect("c", 0, by="d"), suspect("h", 0, by="d"), now=0.1)
    assert sw.stats.sweeps == 1
    kinds = lambda: [wire.decode_frame_body(frame_body(body))["t"] for _, body in sw.streams_to_open()]  # noqa: E731
    assert "push_pull" not in kinds()  # nothing found yet
    sw.handle_timer(1.15)  # round one over (nobody answered), round two begins
    assert "push_pull" in kinds()
    sw.handle_timer(1.65)  # and again half an interval later (what gossip brought meanwhile)
    assert "push_pull" in kinds()
    # no helper nacked: inconclusive, as for any probe
    assert [n for n in "defg" if sw.members[n].state != ALIVE] == []


@pytest.mark.parametrize("seed", [2, 4, 6])
def test_sweep_helpers_come_from_members_that_answered_so_a_small_side_still_gets_verdicts(seed: int) -> None:
    # a is on the small side: 3 others with it, 12 across the cut.  Helpers drawn at
    # random from a's stale view would all sit across the cut 40 % of the time (no
    # nack, no verdict: with these seeds, some of a's first-round probes); drawn
    # from the members that answered the sweep, they are on a's side and nack.
    near = ["n1", "n2", "n3"]
    far = [f"f{i}" for i in range(12)]
    c = Cluster(["a", *near, *far], CFG, seed=seed)
    c.run_until(1.0)
    c.drop = lambda src, dst, types: (src in far) != (dst in far)
    a = c.nodes["a"]
    feed(a, suspect("f0", 0, by="n1"), suspect("f1", 0, by="n2"), suspect("f2", 0, by="n3"), now=c.now)
    swept = {p.target for p in a._sweep.values()} & set(far)
    assert len(swept) >= 5
    c.run_until(c.now + 1.05)
    assert {f for f in swept if c.state("a", f) == SUSPECT} == swept
    assert all(c.state("a", n) == ALIVE for n in near)


def test_contact_ages_say_how_long_ago_each_member_last_sent_us_a_datagram() -> None:
    sw = lone()
    feed(sw, alive("c", 1), now=1.0, sender="c")
    feed(sw, alive("b", 1), now=2.0, sender="b")
    assert sw.contact_ages(4.5) == {"b": 2.5, "c": 3.5}  # d never sent us anything


def test_a_refutation_goes_in_the_next_packet_ahead_of_a_flood_of_user_broadcasts() -> None:
    """Member messages go before user broadcasts, which only fill the room left: a
    node that takes many subscriptions sends hundreds of ~900-byte route chunks, each
    newer than a refutation queued just before them; in one queue ordered newest first
    they buried it, and a member that was only slow was declared dead."""
    sw = lone()
    feed(sw, ["suspect", "a", 0, "c", us(0.05), 0], now=0.1)  # accused: a refutes
    for i in range(100):
        sw.broadcast("route", f"a:1:{i}", "x" * 850, 0.2)
    sw.handle_timer(0.3)
    first = [m for _, d in sw.datagrams_to_send(0.3)[:1] for m in wire.decode_packet(d)[1]]
    assert ["alive", "a", 1] in [m[:3] for m in first]
    assert sum(m[0] == "user" for m in first) == 1  # and a chunk in the room left
