"""SWIM + Lifeguard membership as a sans-I/O state machine.

Shaped like aioquic's connection: the driver feeds datagrams with ``receive(data,
addr, now)``, collects ``datagrams_to_send(now)``, sleeps until ``next_timer()`` and
calls ``handle_timer(now)``.  Push-pull over TCP goes the same way:
``streams_to_open()`` lists request frames to deliver over a stream (push-pull
state exchanges and memberlist's TCP fallback pings), ``handle_stream(frame, now)``
answers one, ``receive_stream_reply(frame, now)`` takes the answer.  No sockets,
no clock reads, randomness from the injected ``random.Random``: the real Trio driver
and the discrete-event simulator run this exact code.

Messages arrive and leave as the typed records of ``gossip.messages`` (checked on
the way in: malformed input is counted by reason in ``stats`` and dropped, and a
bug in a handler propagates).  Timers are ``(deadline, seq, Timer, arg)`` in a heap;
``_TIMER_HANDLERS`` maps each ``Timer`` kind to the method that handles it.

Semantics follow hashicorp/memberlist (state.go, suspicion.go, awareness.go), with
``now`` passed in instead of read.
"""

from __future__ import annotations

import heapq
import logging
import random
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Callable, Hashable, Iterable, TypedDict, TypeVar

from . import wire
from .broadcasts import TransmitLimitedQueue
from .config import LAN, GossipConfig
from .events import ALIVE, DEAD, LEFT, SUSPECT, BroadcastReceived, MemberChanged, MemberState, ProbeFailed, SwimEvent
from .formulas import (
    push_pull_scale,
    remaining_suspicion_time,
    retransmit_limit,
    scale_timeout,
    suspicion_age_cap,
    suspicion_bounds,
    sweep_size,
)
from .messages import (
    Ack,
    Alive,
    Dead,
    MalformedMessage,
    MemberEntry,
    Nack,
    Ping,
    PingReq,
    PushPull,
    StreamAck,
    StreamPing,
    StreamRequest,
    Suspect,
    User,
    decode_stream,
    encode,
    member_entry_wire,
)

log = logging.getLogger("meshd.gossip.swim")

Addr = tuple[str, int]
PushPullProvider = tuple[Callable[[], object], Callable[[object], None]]


class Timer(IntEnum):
    """What a scheduled timer does when it fires (``Swim._TIMER_HANDLERS``)."""

    PROBE = 0  # the next probe of the round robin (and the verdict on the last one)
    DIRECT = 1  # a direct probe's ack is late: ask helpers (arg: probe seq)
    GOSSIP = 2  # push queued broadcasts to a few members
    PUSH_PULL = 3  # periodic full state exchange (arg: schedule token)
    SUSPECT = 4  # a suspicion's timeout (arg: (member, suspicion token))
    NACK = 5  # a relayed ping got no ack: nack the requester (arg: relay seq)
    RELAY_EXPIRE = 6  # forget a relayed ping (arg: relay seq)
    REAP = 7  # forget a dead or left member (arg: (member, when it changed))
    REJOIN = 8  # no live member known: join through the seeds again
    RECONNECT = 9  # try a member lost to a split again
    HEAL_BURST = 10  # one more push-pull of a heal burst
    SWEEP = 11  # the next round of a probe sweep
    SWEEP_DIRECT = 12  # a sweep probe's ack is late: ask helpers (arg: probe seq)
    SWEEP_END = 13  # a sweep probe's verdict (arg: probe seq)
    SWEEP_PUSH = 14  # push what the sweep found, half an interval later


# None, a sequence number or token, or (member, token or timestamp)
TimerArg = int | tuple[str, float] | None


class MemberInfo(TypedDict):
    """One member as ``Swim.members_view`` (and the node's API) shows it."""

    id: str
    address: str
    state: str
    incarnation: int
    last_change_ts_us: int

# Push-pulls a node makes, one per probe interval, once it learns the cluster had
# declared it dead, or sees a member it held dead come back (either side of a healed
# split): full-state exchanges carry the refutations of a whole side in one go, where
# gossip would spread them one piggyback at a time (a thousand after a large split).
HEAL_BURST_PUSH_PULLS = 5
HEAL_BURST_QUIET = 30  # probe intervals between two bursts

# Sweep: once three or more members are suspect at the same time (a correlated failure:
# a cut cable more likely than three crashes), every node probes `sweep_size(n)` extra
# members per probe interval for SWEEP_ROUNDS intervals, and after each round pushes
# what it found to one member in a push-pull, and again half an interval later.  One probe per node per
# interval leaves a member of the far side unprobed for many intervals (with 600 of
# 1,000 nodes probing, each far member is probed with p ~ 0.45 per interval, so the last
# of 400 waits ~10 s); a sweep has the whole far side suspected within a few seconds,
# and detection is then bounded by the suspicion timeout, not by the probe rate.
# A sweep probe's helpers are drawn first from members that answered this sweep: right
# after a cut our view still holds the far side alive, and helpers picked from it at
# random (60 % far on a 400-of-1,000 side) often all sit across the cut, leaving the
# probe without a nack and so without a verdict.
SWEEP_ROUNDS = 3
# Three, not two: with slow members about (event loops stalling for seconds, lossy
# links) two members are suspect at once often enough that sweeps became routine, and
# each one added accusers of members that were merely slow (simulated 100 nodes, 10 %
# stalling, 5 % loss, 12 runs: 2 false dead with two, none with three in 36 runs).
SWEEP_MIN_SUSPECTS = 3
SWEEP_QUIET = 30  # probe intervals between two sweeps


@dataclass(slots=True)
class Member:
    id: str
    addr: Addr
    state: MemberState
    incarnation: int
    state_change: float  # monotonic `now` of the last state change
    state_change_us: int  # the same instant on the trace clock
    # when we last saw it come back from dead (trace clock): what it said before
    # then, it said from across a split
    back_us: int = 0


@dataclass(slots=True)
class _Suspicion:
    incarnation: int
    start: float
    lo: float
    hi: float
    k: int
    confirmations: set[str]
    token: int
    accuser: str
    accused_ts_us: int
    deadline: float = 0.0


@dataclass(slots=True)
class _Probe:
    seq: int
    target: str
    start: float
    health_at_start: int
    acked: bool = False
    expected_nacks: int = 0
    nacks: int = 0


@dataclass(slots=True)
class _Relay:
    requester: Addr
    requester_seq: int
    want_nack: bool
    done: bool = False


@dataclass
class Stats:
    packets_sent: int = 0
    bytes_sent: int = 0
    packets_received: int = 0
    bytes_received: int = 0
    malformed: int = 0
    bad_version: int = 0
    unknown_type: int = 0
    refutations: int = 0
    probes: int = 0
    probe_failures: int = 0
    probes_inconclusive: int = 0
    sweeps: int = 0
    sweep_probes: int = 0
    fallback_acks: int = 0
    stale_verdicts: int = 0  # dead verdicts made across a split, taken as suspicions
    # malformed input by reason (``wire.WireError.reason``); ``malformed`` is the sum
    malformed_by_reason: dict[str, int] = field(default_factory=dict)


class Swim:
    """One member's SWIM + Lifeguard state."""

    def __init__(
        self,
        node_id: str,
        addr: Addr,
        *,
        now: float,
        rng: random.Random,
        config: GossipConfig = LAN,
        cluster_name: str = "meshd",
        incarnation: int = 0,
        clock_offset: float = 0.0,
        packet_limit: int | None = None,
        push_pull_providers: dict[str, PushPullProvider] | None = None,
    ) -> None:
        self.id = node_id
        self.addr = (addr[0], int(addr[1]))
        self.config = config
        self.cluster_name = cluster_name
        self.rng = rng
        # trace timestamps are (now + clock_offset) in µs: 0 in the simulator, the
        # wall-minus-monotonic offset in a real node
        self.clock_offset = clock_offset
        self.packet_limit = packet_limit if packet_limit is not None else config.udp_buffer_size
        self.push_pull_providers: dict[str, PushPullProvider] = push_pull_providers or {}
        self.stats = Stats()
        self.health = 0  # Lifeguard local health score, 0 .. awareness_max_multiplier-1
        self.incarnation = incarnation
        self.leaving = False
        self.seeds: list[Addr] = []

        self.members: dict[str, Member] = {}
        # `now` of the last datagram each member sent us (the dashboard's "last contact")
        self.last_heard: dict[str, float] = {}
        self._others: list[str] = []  # ids except ours, for random picks
        self._others_index: dict[str, int] = {}
        self._probe_list: list[str] = []
        self._probe_index = 0
        self._probe: _Probe | None = None
        self._relays: dict[int, _Relay] = {}
        self._suspicions: dict[str, _Suspicion] = {}
        self._seq = 0
        self._timers: list[tuple[float, int, Timer, TimerArg]] = []
        self._timer_seq = 0
        self._out: list[tuple[Addr, bytes]] = []
        self._pp_out: list[tuple[Addr, bytes | Callable[[], bytes]]] = []
        self._events: list[SwimEvent] = []
        self._queue = TransmitLimitedQueue()  # membership: alive, suspect, dead
        # User broadcasts (route deltas, claims, config) wait in a queue of their own and
        # only fill the room membership leaves in a packet (memberlist does the same):
        # thousands of route chunks (a node that takes 10,000 subscriptions sends ~330,
        # and every member relays them) in one queue with the member messages, newest
        # first, buried refutations, and members that were only slow were declared dead.
        self._user_queue = TransmitLimitedQueue()
        self._encoder = wire.PacketEncoder(node_id)
        self._user_seen: dict[tuple[str, str], tuple[int, int, str]] = {}
        self._user_seq = 0
        self._recent: dict[tuple[str, str], tuple[float, User]] = {}
        self._limit_n, self._limit = -1, 0

        ts = self._ts(now)
        self.members[node_id] = Member(node_id, self.addr, ALIVE, incarnation, now, ts)
        self._queue_alive(node_id, incarnation, self.addr, node_id, ts, 0)
        self._events.append(
            MemberChanged(ts, node_id, self.addr, ALIVE, incarnation, node_id, ts, _eid(node_id, ALIVE, node_id, incarnation, ts), 0)
        )
        p = config.probe_interval
        self._schedule(now + rng.uniform(0, p), Timer.PROBE, None)
        self._schedule(now + rng.uniform(0, config.gossip_interval), Timer.GOSSIP, None)
        # memberlist staggers the first push-pull randomly within one interval
        self._pp_token = 0
        self._schedule(now + config.push_pull_interval * rng.random(), Timer.PUSH_PULL, self._pp_token)
        self._schedule(now + config.reconnect_interval * (1 + rng.random()), Timer.RECONNECT, None)
        # members forgotten after being dead: id -> (address, when lost), for reconnect
        self._lost: dict[str, tuple[Addr, float]] = {}
        self._burst_left = 0
        self._burst_quiet_until = 0.0
        # lost member -> (next attempt, current backoff delay)
        self._reconnect_tries: dict[str, tuple[float, float]] = {}
        self._sweep: dict[int, _Probe] = {}  # seq -> sweep probe in flight
        self._sweep_left = 0
        self._sweep_quiet_until = 0.0
        self._sweep_reached: list[str] = []  # members that answered this sweep

    # ------------------------------------------------------------------ driver API

    def datagrams_to_send(self, now: float) -> list[tuple[Addr, bytes]]:
        out = self._out
        if out:
            self._out = []
        return out

    def streams_to_open(self) -> list[tuple[Addr, bytes | Callable[[], bytes]]]:
        """Request frames (bodies, not yet length-prefixed) to send over a new stream;
        the reply, if any, goes to ``receive_stream_reply``.  A body may be a
        callable that builds it: reconnect attempts to lost members mostly fail to
        connect, so their full-state frame is built only once the stream is open
        (``frame_body`` resolves either)."""
        out = self._pp_out
        if out:
            self._pp_out = []
        return out

    def events(self) -> list[SwimEvent]:
        out = self._events
        if out:
            self._events = []
        return out

    def next_timer(self) -> float | None:
        return self._timers[0][0] if self._timers else None

    def handle_timer(self, now: float) -> None:
        timers = self._timers
        while timers and timers[0][0] <= now:
            _, _, kind, arg = heapq.heappop(timers)
            _TIMER_HANDLERS[kind](self, arg, now)

    def join(self, addrs: Iterable[Addr], now: float, *, remember: bool = True) -> None:
        """Join through seed addresses: a push-pull (full state exchange) with each."""
        for addr in addrs:
            addr = (addr[0], int(addr[1]))
            if addr == self.addr:
                continue
            if remember and addr not in self.seeds:
                self.seeds.append(addr)
            self._pp_out.append((addr, self._push_pull_frame(now, join=True)))
        if self.seeds and not any(t[2] == Timer.REJOIN for t in self._timers):
            self._schedule(now + self.config.rejoin_interval, Timer.REJOIN, None)

    def bootstrap(self, members: Iterable[tuple[str, Addr]], now: float) -> None:
        """Start from an already converged view (simulator warm start): members alive at
        incarnation 0, learned without gossip or traces."""
        ts = self._ts(now)
        mem, others, index = self.members, self._others, self._others_index
        for node, addr in members:
            if node not in mem:
                mem[node] = Member(node, addr, ALIVE, 0, now, ts)
                index[node] = len(others)
                others.append(node)
        # a uniform shuffle; sorting on random keys is several times faster than
        # Random.shuffle, which matters when a simulator boots 1,000 x 1,000 members
        rnd = self.rng.random
        self._probe_list = sorted(others, key=lambda _: rnd())
        self._probe_index = 0
        # everyone already knows us: no need to announce
        self._queue = TransmitLimitedQueue()
        self._user_queue = TransmitLimitedQueue()
        # restagger push-pull for the size we now know
        self._pp_token += 1
        interval = push_pull_scale(self.config.push_pull_interval, len(mem))
        self._schedule(now + interval * self.rng.random(), Timer.PUSH_PULL, self._pp_token)

    def leave(self, now: float) -> None:
        """Graceful leave: tell everyone we left (dead about ourselves, from ourselves)."""
        if self.leaving:
            return
        self.leaving = True
        ts = self._ts(now)
        me = self.members[self.id]
        me.state, me.state_change, me.state_change_us = LEFT, now, ts
        self._queue_dead(self.id, self.incarnation, self.id, ts, 0)
        self._events.append(MemberChanged(ts, self.id, self.addr, LEFT, self.incarnation, self.id, ts, _eid(self.id, LEFT, self.id, self.incarnation, ts), 0))
        self._gossip(now)

    @property
    def leave_sent(self) -> bool:
        """The leave broadcast finished its retransmissions, or nobody is left to tell."""
        if not self.leaving:
            return False
        if ("m", self.id) not in self._queue:
            return True
        return not any(m.state in (ALIVE, SUSPECT) for m in self._iter_others())

    def broadcast(self, kind: str, key: str, payload: object, now: float) -> str:
        """Disseminate a user message; a newer one with the same (kind, key) wins."""
        self._user_seq += 1
        ts = self._ts(now)
        event_id = f"{self.id}:{ts}:{self._user_seq}"  # receivers rebuild it the same way
        msg = User(kind, key, self.id, ts, self._user_seq, payload, 0)
        data = encode(msg)
        if len(data) + self._encoder.overhead > self.packet_limit:
            raise ValueError(f"broadcast of {len(data)} bytes does not fit one packet")
        self._user_seen.pop((kind, key), None)
        self._user_seen[(kind, key)] = (ts, self._user_seq, self.id)
        self._user_queue.queue(("u", kind, key), data)
        self._remember(msg, now)
        self._events.append(BroadcastReceived(ts, kind, key, self.id, ts, event_id, 0, payload, True))
        return event_id

    def note_loop_lag(self, lag: float, now: float) -> None:
        """Lifeguard: our own event loop stalled for ``lag`` s; we are the unhealthy one."""
        if not self.config.lifeguard or lag <= self.config.probe_timeout / 2:
            return
        steps = int(lag / self.config.probe_interval) + 1
        self._health_delta(steps)

    def members_view(self) -> list[MemberInfo]:
        return [
            {
                "id": m.id,
                "address": f"{m.addr[0]}:{m.addr[1]}",
                "state": m.state.value,
                "incarnation": m.incarnation,
                "last_change_ts_us": m.state_change_us,
            }
            for m in sorted(self.members.values(), key=lambda m: m.id)
        ]

    def contact_ages(self, now: float) -> dict[str, float]:
        """Seconds since each member's last datagram reached us (members never heard
        from directly are absent)."""
        return {m: round(now - t, 3) for m, t in self.last_heard.items() if m in self.members}

    def num_members(self) -> int:
        return len(self.members)

    # ------------------------------------------------------------------ receive

    def receive(self, data: bytes, addr: Addr, now: float) -> None:
        """One datagram.  Malformed input (not CBOR, a wrong shape, a field of the
        wrong type) is counted by reason and dropped; an unknown message type is
        counted and skipped (a newer peer's); anything else raised here is a bug."""
        self.stats.packets_received += 1
        self.stats.bytes_received += len(data)
        try:
            sender, msgs = wire.decode_packet(data)
        except wire.UnsupportedVersion as exc:
            self.stats.bad_version += 1
            log.debug("dropped a datagram from %s: %s", addr, exc)
            return
        except wire.MalformedPacket as exc:
            self.count_malformed(exc, addr)
            return
        self.last_heard[sender] = now
        receivers = _RECEIVERS
        for raw in msgs:
            receiver = receivers.get(raw[0])
            if receiver is None:
                self.stats.unknown_type += 1
                continue
            try:
                receiver(self, raw, sender, addr, now)
            except MalformedMessage as exc:
                self.count_malformed(exc, addr)

    def count_malformed(self, exc: wire.WireError, addr: Addr | None) -> None:
        """Malformed input dropped (by us or by the driver): counted by reason, logged at debug."""
        stats = self.stats
        stats.malformed += 1
        stats.malformed_by_reason[exc.reason] = stats.malformed_by_reason.get(exc.reason, 0) + 1
        log.debug("dropped malformed gossip input from %s: %s", addr, exc)

    def _on_ping(self, msg: Ping, sender: str, addr: Addr, now: float) -> None:
        if msg.target != self.id:
            return  # addressed to whoever had this address before us
        self._send(addr, [encode(Ack(msg.seq))])

    def _on_ack(self, msg: Ack, sender: str, addr: Addr, now: float) -> None:
        seq = msg.seq
        probe = self._probe
        if probe is not None and probe.seq == seq:
            if not probe.acked:
                probe.acked = True
                self._health_delta(-1)
            return
        swept = self._sweep.get(seq)
        if swept is not None:
            if not swept.acked:
                swept.acked = True  # sweeps leave the health score to the regular probe
                self._sweep_reached.append(swept.target)
            return
        relay = self._relays.get(seq)
        if relay is not None and not relay.done:
            relay.done = True
            self._send(relay.requester, [encode(Ack(relay.requester_seq))])

    def _on_nack(self, msg: Nack, sender: str, addr: Addr, now: float) -> None:
        probe = self._probe
        if probe is None or probe.seq != msg.seq:
            probe = self._sweep.get(msg.seq)
        if probe is not None and not probe.acked:
            probe.nacks += 1

    def _on_ping_req(self, msg: PingReq, sender: str, addr: Addr, now: float) -> None:
        self._seq += 1
        seq = self._seq
        want_nack = msg.want_nack and self.config.lifeguard
        self._relays[seq] = _Relay(addr, msg.seq, want_nack)
        self._send((msg.host, msg.port), [encode(Ping(seq, msg.target))])
        if want_nack:
            # the requester sent this after its probe timeout and gives up at the end of
            # its probe interval: nack at 80 % of that window so it arrives in time
            window = min(self.config.probe_timeout, self.config.probe_interval - self.config.probe_timeout)
            self._schedule(now + max(window, 0.0) * 0.8, Timer.NACK, seq)
        self._schedule(now + self.config.probe_interval, Timer.RELAY_EXPIRE, seq)

    def _on_alive(self, msg: Alive, sender: str, addr: Addr, now: float) -> None:
        node, inc = msg.node, msg.incarnation
        m = self.members.get(node)
        if m is not None and inc <= m.incarnation and m.state == ALIVE and node != self.id:
            return  # old news, the common case
        self._alive(node, inc, (msg.host, msg.port), node, msg.origin_ts_us, msg.hops + 1, now)

    def _on_suspect(self, msg: Suspect, sender: str, addr: Addr, now: float) -> None:
        self._suspect(msg.node, msg.incarnation, msg.accuser, msg.origin_ts_us, msg.hops + 1, now, credit=True)

    def _on_dead(self, msg: Dead, sender: str, addr: Addr, now: float) -> None:
        node, inc, by, ots, hops = msg.node, msg.incarnation, msg.declared_by, msg.origin_ts_us, msg.hops + 1
        m = self.members.get(node)
        if node != self.id and m is not None and m.state == ALIVE and self._out_of_sight(by, node, ots):
            # after a heal the far side's stale verdicts about members we reach would
            # evict them before they could refute: as in a push-pull from such a
            # sender, it is only grounds for a suspicion the accused can refute
            self.stats.stale_verdicts += 1
            self._suspect(node, inc, by, ots, hops, now)
            return
        self._dead(node, inc, by, ots, hops, now)

    def _out_of_sight(self, by: str, node: str, ots: int) -> bool:
        """Was `by`'s verdict about `node` (made at `ots`) made where we could not hear
        it: by a member we hold dead, before we saw it come back, or by one we did not
        know?  A member's own leave and our own verdicts never are."""
        if by in (node, self.id):
            return False
        judge = self.members.get(by)
        return judge is None or judge.state in (DEAD, LEFT) or judge.back_us > ots

    def _on_user(self, msg: User, sender: str, addr: Addr, now: float) -> None:
        kind, key, origin, ots, seq = msg.kind, msg.key, msg.origin, msg.origin_ts_us, msg.origin_seq
        version = (ots, seq, origin)
        prev = self._user_seen.get((kind, key))
        if prev is not None and version <= prev:
            return  # duplicate or superseded: the common case
        self._user_seen.pop((kind, key), None)
        self._user_seen[(kind, key)] = version
        forwarded = User(kind, key, origin, ots, seq, msg.payload, msg.hops + 1)
        self._user_queue.queue(("u", kind, key), encode(forwarded))
        self._remember(forwarded, now)
        event_id = f"{origin}:{ots}:{seq}"
        self._events.append(BroadcastReceived(self._ts(now), kind, key, origin, ots, event_id, forwarded.hops, msg.payload, False))

    def _remember(self, msg: User, now: float) -> None:
        # recent broadcasts ride push-pull too (serf's event buffer): gossip alone
        # misses a member now and then, anti-entropy repairs it
        recent = self._recent
        name = (msg.kind, msg.key)
        recent.pop(name, None)
        recent[name] = (now, msg)
        if len(recent) > self.config.broadcast_retain_count:
            del recent[next(iter(recent))]
        seen = self._user_seen
        if len(seen) > 4 * self.config.broadcast_retain_count:
            # forget versions of keys nobody has updated for a long while (kept in
            # arrival order; a key updated again moves to the end)
            horizon = self._ts(now) - int(2 * self.config.broadcast_retain_time * 1_000_000)
            while seen:
                k = next(iter(seen))
                if seen[k][0] >= horizon:
                    break
                del seen[k]

    def _recent_broadcasts(self, now: float) -> list[list[object]]:
        recent = self._recent
        cutoff = now - self.config.broadcast_retain_time
        while recent:
            k = next(iter(recent))
            if recent[k][0] >= cutoff:
                break
            del recent[k]
        return [msg.retained() for _, msg in recent.values()]

    # ------------------------------------------------------------------ state changes

    def _alive(self, node: str, inc: int, addr: Addr, origin: str, ots: int, hops: int, now: float) -> None:
        if node == self.id:
            if inc > self.incarnation and not self.leaving:
                # someone holds a newer alive about us than we made: out-rank it
                self._refute(inc, now)
            return
        m = self.members.get(node)
        if m is None:
            if self.leaving:
                return
            ts = self._ts(now)
            # new to us (or back after we forgot it): what it said before now, it
            # said where we could not hear it
            m = Member(node, addr, ALIVE, inc, now, ts, ts)
            self.members[node] = m
            self._add_other(node)
            self._queue_alive(node, inc, addr, origin, ots, hops)
            self._events.append(MemberChanged(ts, node, addr, ALIVE, inc, origin, ots, _eid(origin, ALIVE, node, inc, ots), hops))
            return
        # a dead or left member may come back at the same incarnation from a new address
        readdressed = m.state in (DEAD, LEFT) and addr != m.addr
        if inc <= m.incarnation and not readdressed:
            return
        self._suspicions.pop(node, None)
        old = m.state
        m.incarnation = inc
        m.addr = addr
        self._queue_alive(node, inc, addr, origin, ots, hops)
        if old != ALIVE:
            m.state, m.state_change = ALIVE, now
            m.state_change_us = ts = self._ts(now)
            self._events.append(MemberChanged(ts, node, addr, ALIVE, inc, origin, ots, _eid(origin, ALIVE, node, inc, ots), hops))
            if old == DEAD:
                m.back_us = ts
                self._start_heal_burst(now)  # a lost member is back: the rest may be too

    def _suspect(self, node: str, inc: int, by: str, ots: int, hops: int, now: float, *, credit: bool = False) -> None:
        """`credit`: `ots` is when the suspicion began (an accuser's or a sender's
        timestamp), so a new suspicion starts that old (capped: see
        `GossipConfig.suspicion_age_credit`)."""
        if node == self.id:
            self._accused(inc, now)
            return
        m = self.members.get(node)
        if m is None or inc < m.incarnation:
            return
        if m.state == SUSPECT:
            s = self._suspicions.get(node)
            if s is not None and inc == s.incarnation and self._confirm(node, s, by, now):
                # a new independent accuser: pass it on so others can confirm too
                self._queue_suspect(node, inc, by, ots, hops, key_extra=by)
            return
        if m.state != ALIVE:
            return
        ts = self._ts(now)
        m.state, m.incarnation, m.state_change, m.state_change_us = SUSPECT, inc, now, ts
        self._queue_suspect(node, inc, by, ots, hops)
        self._events.append(MemberChanged(ts, node, m.addr, SUSPECT, inc, by, ots, _eid(by, SUSPECT, node, inc, ots), hops))
        n = len(self.members)
        lo, hi = suspicion_bounds(self.config.suspicion_mult, self.config.suspicion_max_timeout_mult, n, self.config.probe_interval)
        k = self.config.suspicion_mult - 2 if self.config.lifeguard else 0
        if n - 2 < k or k < 0:
            k = 0
        if k == 0:
            hi = lo
        start = now
        if credit:
            cap = suspicion_age_cap(self.config.suspicion_age_credit, n, self.config.probe_interval)
            start -= min(max((ts - ots) / 1_000_000, 0.0), cap)
        self._timer_seq += 1
        s = _Suspicion(inc, start, lo, hi, k, {by}, self._timer_seq, by, ots)
        s.deadline = start + remaining_suspicion_time(0, k, 0.0, lo, hi)
        self._suspicions[node] = s
        self._schedule(max(now, s.deadline), Timer.SUSPECT, (node, s.token))
        if len(self._suspicions) >= SWEEP_MIN_SUSPECTS:
            self._start_sweep(now)

    def _confirm(self, node: str, s: _Suspicion, by: str, now: float) -> bool:
        if len(s.confirmations) - 1 >= s.k or by in s.confirmations:
            return False
        s.confirmations.add(by)
        n = len(s.confirmations) - 1
        s.deadline = s.start + remaining_suspicion_time(n, s.k, 0.0, s.lo, s.hi)
        self._timer_seq += 1
        s.token = self._timer_seq
        self._schedule(max(now, s.deadline), Timer.SUSPECT, (node, s.token))
        return True

    def _dead(self, node: str, inc: int, by: str, ots: int, hops: int, now: float) -> None:
        if node == self.id:
            # dead or "left" about us while we are not leaving (e.g. we restarted after
            # a graceful stop): out-rank it
            self._accused(inc, now)
            self._start_heal_burst(now)
            return
        m = self.members.get(node)
        if m is None or inc < m.incarnation or m.state in (DEAD, LEFT):
            return
        state = LEFT if by == node else DEAD
        self._suspicions.pop(node, None)
        ts = self._ts(now)
        m.state, m.incarnation, m.state_change, m.state_change_us = state, inc, now, ts
        self._queue_dead(node, inc, by, ots, hops)
        self._events.append(MemberChanged(ts, node, m.addr, state, inc, by, ots, _eid(by, state, node, inc, ots), hops))
        self._schedule(now + self.config.dead_reclaim_time, Timer.REAP, (node, now))

    def _accused(self, inc: int, now: float) -> None:
        """Someone suspects us or declared us dead."""
        if self.leaving:
            return
        if inc >= self.incarnation:
            self._refute(inc, now)
        elif ("m", self.id) not in self._queue:
            # an accusation older than our last refutation still circulates: whoever
            # sent it missed the refutation, so announce our current incarnation again
            self._queue_alive(self.id, self.incarnation, self.addr, self.id, self._ts(now), 0)

    def _start_heal_burst(self, now: float) -> None:
        if self._burst_left > 0 or self.leaving or now < self._burst_quiet_until:
            return
        self._burst_left = HEAL_BURST_PUSH_PULLS
        # at most one burst per HEAL_BURST_QUIET probe intervals (a flapping member
        # must not turn into a stream of full-state exchanges)
        self._burst_quiet_until = now + HEAL_BURST_QUIET * self.config.probe_interval
        self._schedule(now + self.config.probe_interval * self.rng.random(), Timer.HEAL_BURST, None)

    def _heal_burst(self, now: float) -> None:
        if self._burst_left <= 0 or self.leaving:
            self._burst_left = 0
            return
        self._burst_left -= 1
        picked = self._random_members(1, exclude=None, states=(ALIVE,))
        if picked:
            self._pp_out.append((self.members[picked[0]].addr, self._push_pull_frame(now, join=False)))
        if self._burst_left > 0:
            self._schedule(now + self.config.probe_interval, Timer.HEAL_BURST, None)

    def _start_sweep(self, now: float) -> None:
        if self._sweep_left > 0 or self.leaving or now < self._sweep_quiet_until:
            return
        size = sweep_size(self.config.sweep_mult, len(self.members))
        if size <= 0:
            return
        self.stats.sweeps += 1
        self._sweep_reached = []
        self._sweep_left = SWEEP_ROUNDS
        self._sweep_quiet_until = now + SWEEP_QUIET * self.config.probe_interval
        self._sweep_round(now)

    def _sweep_push(self, now: float) -> None:
        # what the last round found (and gossip brought) goes out as one full-state
        # exchange: hundreds of fresh suspicions would queue for piggyback space
        picked = self._random_members(1, exclude=None, states=(ALIVE,))
        if picked:
            self._pp_out.append((self.members[picked[0]].addr, self._push_pull_frame(now, join=False)))

    def _sweep_round(self, now: float) -> None:
        if self._sweep_left <= 0 or self.leaving:
            self._sweep_left = 0
            return
        if self._sweep_left < SWEEP_ROUNDS:
            self._sweep_push(now)
            self._schedule(now + self.config.probe_interval / 2, Timer.SWEEP_PUSH, None)
        self._sweep_left -= 1
        busy = {p.target for p in self._sweep.values()}
        if self._probe is not None:
            busy.add(self._probe.target)
        want = sweep_size(self.config.sweep_mult, len(self.members))
        picked: list[str] = []
        # continue the randomized round robin, so the rounds of a sweep (and the
        # regular probes after it) reach different members; suspects are left to
        # the regular probe and to their accusers
        for _ in range(len(self._others)):
            if len(picked) >= want:
                break
            node = self._next_probe_target()
            if node is None:
                break
            if node not in busy and self.members[node].state == ALIVE:
                busy.add(node)
                picked.append(node)
        for node in picked:
            self._seq += 1
            probe = _Probe(self._seq, node, now, self.health)
            self._sweep[self._seq] = probe
            self.stats.sweep_probes += 1
            self._send(self.members[node].addr, [encode(Ping(self._seq, node))])
            self._schedule(now + self.config.probe_timeout, Timer.SWEEP_DIRECT, self._seq)
            self._schedule(now + self.config.probe_interval, Timer.SWEEP_END, self._seq)
        if self._sweep_left > 0:
            self._schedule(now + self.config.probe_interval, Timer.SWEEP, None)

    def _refute(self, accused_inc: int, now: float) -> None:
        self.incarnation = max(self.incarnation + 1, accused_inc + 1)
        me = self.members[self.id]
        me.incarnation = self.incarnation
        ts = self._ts(now)
        self.stats.refutations += 1
        self._queue_alive(self.id, self.incarnation, self.addr, self.id, ts, 0)
        # being accused is a sign we are the slow one (Lifeguard)
        self._health_delta(1)

    def _health_delta(self, delta: int) -> None:
        if not self.config.lifeguard:
            return
        self.health = min(max(self.health + delta, 0), self.config.awareness_max_multiplier - 1)

    # ------------------------------------------------------------------ broadcasts

    def _queue_alive(self, node: str, inc: int, addr: Addr, origin: str, ots: int, hops: int) -> None:
        self._queue.queue(("m", node), encode(Alive(node, inc, addr[0], addr[1], ots, hops)))

    def _suspect_part(self, node: str, inc: int, by: str, ots: int, hops: int) -> bytes:
        return encode(Suspect(node, inc, by, ots, hops))

    def _queue_suspect(self, node: str, inc: int, by: str, ots: int, hops: int, key_extra: str | None = None) -> None:
        # confirmations ride under their own key so they do not displace the suspicion
        key: Hashable = ("m", node) if key_extra is None else ("c", node, key_extra)
        self._queue.queue(key, self._suspect_part(node, inc, by, ots, hops))

    def _queue_dead(self, node: str, inc: int, by: str, ots: int, hops: int) -> None:
        self._queue.queue(("m", node), encode(Dead(node, inc, by, ots, hops)))

    def _send(self, addr: Addr, parts: list[bytes]) -> None:
        """Send ``parts`` plus as many queued broadcasts as fit in one packet."""
        overhead = self._encoder.overhead
        for p in parts:
            overhead += len(p)
        limit = self._transmit_limit()
        extra = self._queue.get(overhead, self.packet_limit, limit)
        if len(self._user_queue):
            for e in extra:
                overhead += len(e)
            extra += self._user_queue.get(overhead, self.packet_limit, limit)
        data = self._encoder.packet(parts + extra if extra else parts)
        self.stats.packets_sent += 1
        self.stats.bytes_sent += len(data)
        self._out.append((addr, data))

    def _transmit_limit(self) -> int:
        n = len(self.members)
        if n != self._limit_n:
            self._limit_n, self._limit = n, retransmit_limit(self.config.retransmit_mult, n)
        return self._limit

    # ------------------------------------------------------------------ timers

    def _schedule(self, when: float, kind: Timer, arg: TimerArg) -> None:
        self._timer_seq += 1
        heapq.heappush(self._timers, (when, self._timer_seq, kind, arg))

    # One handler per timer kind (``_TIMER_HANDLERS``), each given the timer's arg.

    def _t_probe(self, arg: TimerArg, now: float) -> None:
        self._probe_tick(now)

    def _t_direct(self, arg: TimerArg, now: float) -> None:
        self._direct_timeout(_seq_arg(arg), now)

    def _t_gossip(self, arg: TimerArg, now: float) -> None:
        self._gossip(now)
        self._schedule(now + self.config.gossip_interval, Timer.GOSSIP, None)

    def _t_suspect(self, arg: TimerArg, now: float) -> None:
        node, token = _member_arg(arg)
        s = self._suspicions.get(node)
        if s is not None and s.token == token:
            m = self.members[node]
            if m.state == SUSPECT and m.incarnation == s.incarnation:
                self._dead(node, s.incarnation, self.id, self._ts(now), 0, now)

    def _t_nack(self, arg: TimerArg, now: float) -> None:
        relay = self._relays.get(_seq_arg(arg))
        if relay is not None and not relay.done and relay.want_nack:
            self._send(relay.requester, [encode(Nack(relay.requester_seq))])

    def _t_relay_expire(self, arg: TimerArg, now: float) -> None:
        self._relays.pop(_seq_arg(arg), None)

    def _t_push_pull(self, arg: TimerArg, now: float) -> None:
        if arg == self._pp_token:  # else superseded by a restagger
            self._periodic_push_pull(now)

    def _t_reap(self, arg: TimerArg, now: float) -> None:
        node, since = _member_arg(arg)
        m = self.members.get(node)
        if m is not None and m.state in (DEAD, LEFT) and m.state_change == since:
            del self.members[node]
            self._remove_other(node)
            if m.state == DEAD:
                self._lost[node] = (m.addr, since)

    def _t_heal_burst(self, arg: TimerArg, now: float) -> None:
        self._heal_burst(now)

    def _t_sweep(self, arg: TimerArg, now: float) -> None:
        self._sweep_round(now)

    def _t_sweep_push(self, arg: TimerArg, now: float) -> None:
        if not self.leaving:
            self._sweep_push(now)

    def _t_sweep_direct(self, arg: TimerArg, now: float) -> None:
        probe = self._sweep.get(_seq_arg(arg))
        if probe is not None and not probe.acked:
            self._ask_helpers(probe, prefer=self._sweep_reached)

    def _t_sweep_end(self, arg: TimerArg, now: float) -> None:
        probe = self._sweep.pop(_seq_arg(arg), None)
        if probe is not None and not probe.acked and not self.leaving:
            self._probe_failed(probe, now, sweep=True)

    def _t_reconnect(self, arg: TimerArg, now: float) -> None:
        self._reconnect(now)
        self._schedule(now + self.config.reconnect_interval, Timer.RECONNECT, None)

    def _t_rejoin(self, arg: TimerArg, now: float) -> None:
        if not self.leaving and self.seeds:
            # Every seed not known as a live member is tried again, not only when we
            # know nobody: a seed that was down when we joined through another, and has
            # no seeds of its own, would otherwise stay alone for good.
            live = {m.addr for m in self._iter_others() if m.state in (ALIVE, SUSPECT)}
            missing = [seed for seed in self.seeds if seed not in live]
            if missing:
                self.join(missing, now, remember=False)
            self._schedule(now + self.config.rejoin_interval, Timer.REJOIN, None)

    def _probe_tick(self, now: float) -> None:
        probe = self._probe
        if probe is not None and not probe.acked:
            if self.health > probe.health_at_start:
                # Lifeguard: we learned we are unhealthy since this probe began (e.g. our
                # loop stalled); stretch its deadline before accusing anyone
                deadline = probe.start + scale_timeout(self.config.probe_interval, self.health)
                probe.health_at_start = self.health
                if deadline > now:
                    self._schedule(deadline, Timer.PROBE, None)
                    return
            self._probe_failed(probe, now)
        self._probe = None
        if self.leaving:
            return
        target = self._next_probe_target()
        interval = scale_timeout(self.config.probe_interval, self.health)
        self._schedule(now + interval, Timer.PROBE, None)
        if target is None:
            return
        m = self.members[target]
        self._seq += 1
        self._probe = _Probe(self._seq, target, now, self.health)
        self.stats.probes += 1
        parts = [encode(Ping(self._seq, target))]
        if m.state == SUSPECT and self.config.lifeguard:
            # buddy system: tell a suspect directly, so it refutes at once
            s = self._suspicions.get(target)
            if s is not None:
                parts.append(self._suspect_part(target, s.incarnation, s.accuser, s.accused_ts_us, 0))
        self._send(m.addr, parts)
        self._schedule(now + self.config.probe_timeout, Timer.DIRECT, self._seq)

    def _direct_timeout(self, seq: int, now: float) -> None:
        probe = self._probe
        if probe is None or probe.seq != seq or probe.acked:
            return
        self._ask_helpers(probe)

    def _ask_helpers(self, probe: _Probe, prefer: list[str] | None = None) -> None:
        """No direct ack in time: ask others to ping the target for us (first from
        ``prefer``, members known to answer us)."""
        target = self.members.get(probe.target)
        if target is None:
            return
        k = self.config.indirect_checks
        helpers: list[str] = []
        if prefer:
            for _ in range(min(len(prefer), 3 * k)):
                if len(helpers) >= k:
                    break
                node = prefer[int(self.rng.random() * len(prefer))]
                m = self.members.get(node)
                if node != probe.target and node not in helpers and m is not None and m.state == ALIVE:
                    helpers.append(node)
        if len(helpers) < k:
            for node in self._random_members(k, exclude=probe.target, states=(ALIVE,)):
                if len(helpers) >= k:
                    break
                if node not in helpers:
                    helpers.append(node)
        want_nack = self.config.lifeguard
        for hid in helpers:
            h = self.members[hid]
            part = encode(PingReq(probe.seq, probe.target, target.addr[0], target.addr[1], want_nack))
            self._send(h.addr, [part])
        if want_nack:
            probe.expected_nacks = len(helpers)
        if self.config.tcp_fallback:
            # memberlist's fallback: a stream is not lost to UDP loss, so a live target
            # answers it even when every datagram of this probe was dropped
            frame = StreamPing(self.id, probe.seq, probe.target).to_wire()
            self._pp_out.append((target.addr, frame))

    def _probe_failed(self, probe: _Probe, now: float, *, sweep: bool = False) -> None:
        self.stats.probe_failures += 1
        if not sweep:
            if probe.expected_nacks > 0:
                # nacks prove the helpers are up: only missing nacks count against us,
                # and one nack already proves our own receive path works (in a netsplit
                # the helpers across the cut cannot nack; that is not our slowness)
                delta = 0 if probe.nacks else probe.expected_nacks
            else:
                delta = 1
            self._health_delta(delta)
        if probe.expected_nacks > 0 and probe.nacks == 0 and self.health < self.config.awareness_max_multiplier - 1:
            # Lifeguard: not one helper answered either, so the silence is most likely
            # ours (a starved receive path, a broken uplink); accusing the target now
            # would be a false positive.  A really dead target gets nacks from the
            # helpers, and other members probe it too.  Only once our health score is
            # saturated (probing already slowed to the maximum) do we accuse: a node
            # cut off from everyone must still learn that it is alone, slowly.
            self.stats.probes_inconclusive += 1
            return
        m = self.members.get(probe.target)
        if m is None or m.state not in (ALIVE, SUSPECT):
            return
        ts = self._ts(now)
        self._events.append(ProbeFailed(ts, probe.target, probe.start))
        self._suspect(probe.target, m.incarnation, self.id, ts, 0, now)

    def _next_probe_target(self) -> str | None:
        for _ in range(2):
            while self._probe_index < len(self._probe_list):
                node = self._probe_list[self._probe_index]
                self._probe_index += 1
                m = self.members.get(node)
                if m is not None and m.state in (ALIVE, SUSPECT):
                    return node
            # one full round done: reshuffle (SWIM's randomized round robin)
            self._probe_list = list(self._others)
            self.rng.shuffle(self._probe_list)
            self._probe_index = 0
        return None

    def _gossip(self, now: float) -> None:
        if not len(self._queue) and not len(self._user_queue):
            return
        dead_cutoff = now - self.config.gossip_to_the_dead_time
        targets = self._random_members(self.config.gossip_nodes, exclude=None, states=(ALIVE, SUSPECT, DEAD), dead_after=dead_cutoff)
        for node in targets:
            if not len(self._queue) and not len(self._user_queue):
                break
            self._send(self.members[node].addr, [])

    def _random_members(self, k: int, *, exclude: str | None, states: tuple[str, ...], dead_after: float | None = None) -> list[str]:
        others = self._others
        n = len(others)
        picked: list[str] = []
        if n == 0 or k <= 0:
            return picked
        rnd = self.rng.random
        for _ in range(3 * n if n < 3 * k else 3 * k + 10):
            if len(picked) >= k:
                break
            node = others[int(rnd() * n)]
            if node == exclude or node in picked:
                continue
            m = self.members[node]
            if m.state not in states:
                continue
            if m.state == DEAD and (dead_after is None or m.state_change < dead_after):
                continue
            picked.append(node)
        return picked

    def _add_other(self, node: str) -> None:
        self._others_index[node] = len(self._others)
        self._others.append(node)
        # a newcomer goes to a random place in the current probe round
        pos = self.rng.randint(self._probe_index, len(self._probe_list))
        self._probe_list.insert(pos, node)

    def _remove_other(self, node: str) -> None:
        i = self._others_index.pop(node)
        last = self._others.pop()
        if last != node:
            self._others[i] = last
            self._others_index[last] = i

    def _iter_others(self) -> Iterable[Member]:
        return (self.members[n] for n in self._others)

    # ------------------------------------------------------------------ push-pull

    def _periodic_push_pull(self, now: float) -> None:
        n = len(self.members)
        self._schedule(now + push_pull_scale(self.config.push_pull_interval, n), Timer.PUSH_PULL, self._pp_token)
        if self.leaving:
            return
        picked = self._random_members(1, exclude=None, states=(ALIVE,))
        if picked:
            self._pp_out.append((self.members[picked[0]].addr, self._push_pull_frame(now, join=False)))

    def _push_pull_frame(self, now: float, *, join: bool, reply: bool = False) -> bytes:
        members = [
            member_entry_wire(m.id, m.addr[0], m.addr[1], m.state, m.incarnation, m.state_change_us)
            for m in self.members.values()
        ]
        user = {name: get() for name, (get, _merge) in self.push_pull_providers.items()}
        return PushPull(self.id, self.cluster_name, join, reply, members, user, self._recent_broadcasts(now)).to_wire()

    def handle_stream(self, body: bytes, now: float) -> bytes | None:
        """Answer an incoming stream request: push-pull with our own state, a TCP
        ping with an ack (None: refused, close the stream)."""
        req = self._decode_stream(body)
        if req is None or isinstance(req, StreamAck):
            return None
        if isinstance(req, StreamPing):
            return StreamAck(self.id, req.seq).to_wire() if req.target == self.id else None
        reply = self._push_pull_frame(now, join=False, reply=True)
        self._merge(req, now)
        return reply

    def receive_stream_reply(self, body: bytes, now: float) -> None:
        req = self._decode_stream(body)
        if req is None or isinstance(req, StreamPing):
            return
        if isinstance(req, StreamAck):
            probe = self._probe
            if probe is None or probe.seq != req.seq:
                probe = self._sweep.get(req.seq)
            if probe is not None and not probe.acked:
                # reachable over TCP although UDP failed: do not accuse (and do not
                # count it as a healthy probe either)
                probe.acked = True
                self.stats.fallback_acks += 1
            return
        self._merge(req, now)

    def _reconnect(self, now: float) -> None:
        if self.leaving:
            return
        cfg = self.config
        cutoff = now - cfg.reconnect_dead_for
        for node in [n for n, (_, since) in self._lost.items() if since < cutoff or n in self.members]:
            del self._lost[node]
        lost: dict[str, Addr] = {m.id: m.addr for m in self._iter_others() if m.state == DEAD and m.state_change >= cutoff}
        lost.update((n, addr) for n, (addr, _) in self._lost.items())
        tries = self._reconnect_tries
        for node in [n for n in tries if n not in lost]:
            del tries[node]
        due = [n for n in lost if tries.get(n, (now, 0.0))[0] <= now]
        if not due:
            return
        # serf: try with probability lost / alive, so the cluster as a whole tries
        # each lost member about once per interval instead of every member doing so
        alive = sum(1 for m in self._iter_others() if m.state in (ALIVE, SUSPECT))
        if alive and self.rng.random() > len(lost) / alive:
            return
        node = due[int(self.rng.random() * len(due))]
        # back off per member: a long split costs less and less, up to the cap
        _, delay = tries.get(node, (now, 0.0))
        delay = min(max(delay * 2, cfg.reconnect_interval), cfg.reconnect_max_interval)
        tries[node] = (now + delay * (0.5 + 0.5 * self.rng.random()), delay)
        self._pp_out.append((lost[node], lambda: self._push_pull_frame(now, join=False)))

    def _decode_stream(self, body: bytes) -> StreamRequest | None:
        try:
            req = decode_stream(body)
        except wire.UnsupportedVersion as exc:
            self.stats.bad_version += 1
            log.debug("dropped a stream frame: %s", exc)
            return None
        except wire.MalformedPacket as exc:
            self.count_malformed(exc, None)
            return None
        if isinstance(req, PushPull) and req.cluster != self.cluster_name:
            self.count_malformed(MalformedMessage(f"push-pull of cluster {req.cluster!r}", reason="other_cluster"), None)
            return None
        return req

    def _merge(self, pp: PushPull, now: float) -> None:
        sender = pp.sender
        # a sender we could not reach until now (back from a split, or new) brings a
        # stale view of the members we do reach: its "dead" about them is no ground
        # for suspicion (thousands of such accusations after a large heal would
        # outrun the refutations and evict live members); its news about itself
        # and about members we also lost still counts
        s = self.members.get(sender)
        trusted = s is not None and s.state in (ALIVE, SUSPECT)
        decode_entry = MemberEntry.from_wire  # once per member of the cluster: bound once
        for raw in pp.members:
            try:
                node, host, port, state, inc, changed_us = decode_entry(raw)
            except MalformedMessage as exc:
                self.count_malformed(exc, None)
                continue
            addr = (host, port)
            origin = node if state == ALIVE else sender
            if state == ALIVE:
                self._alive(node, inc, addr, origin, changed_us, 1, now)
            elif state == LEFT:
                self._dead(node, inc, node, changed_us, 1, now)
            else:  # suspect or dead
                if node == self.id and state == DEAD:
                    self._start_heal_burst(now)  # the far side of a split held us dead
                if not trusted and node != self.id:
                    m = self.members.get(node)
                    if m is not None and m.state == ALIVE:
                        continue
                # memberlist: another node's "dead" is only grounds for our suspicion
                if node not in self.members and state == SUSPECT:
                    self._alive(node, inc, addr, node, changed_us, 1, now)
                # a sender's "suspect" dates from when it began to suspect: creditable;
                # its "dead" dates from its verdict, which says nothing about how long
                # the accused has had to refute here
                self._suspect(node, inc, sender, changed_us, 1, now, credit=state == SUSPECT)
        for raw in pp.broadcasts:
            try:
                msg = User.from_retained(raw)
            except MalformedMessage as exc:
                self.count_malformed(exc, None)
                continue
            self._on_user(msg, sender, ("", 0), now)
        for name, (_get, merge) in self.push_pull_providers.items():
            if name in pp.user:
                merge(pp.user[name])

    # ------------------------------------------------------------------ misc

    def _ts(self, now: float) -> int:
        return int(round((now + self.clock_offset) * 1_000_000))


def frame_body(body: bytes | Callable[[], bytes]) -> bytes:
    """A ``streams_to_open`` body, built now if it was deferred."""
    return body() if callable(body) else body


def _eid(origin: str, state: str, node: str, inc: int, ots: int) -> str:
    return f"{origin}:{state}:{node}:{inc}:{ots}"


def _seq_arg(arg: TimerArg) -> int:
    assert isinstance(arg, int), arg
    return arg


def _member_arg(arg: TimerArg) -> tuple[str, float]:
    assert isinstance(arg, tuple), arg
    return arg


M = TypeVar("M", Ping, Ack, Nack, PingReq, Alive, Suspect, Dead, User)
Receiver = Callable[[Swim, list[object], str, Addr, float], None]


def _route(decode: Callable[[list[object]], M], handle: Callable[[Swim, M, str, Addr, float], None]) -> Receiver:
    """A receiver for one message type: decode (raises ``MalformedMessage``), then handle."""

    def receive(swim: Swim, raw: list[object], sender: str, addr: Addr, now: float) -> None:
        handle(swim, decode(raw), sender, addr, now)

    return receive


def _receive_user(swim: Swim, raw: list[object], sender: str, addr: Addr, now: float) -> None:
    """``_route(User.from_wire, Swim._on_user)``, with duplicates (most user messages
    in a large cluster) dropped on their version before a record is built."""
    if len(raw) == 8:
        _, kind, key, origin, ots, seq, payload, hops = raw
        if (type(kind) is str and type(key) is str and type(origin) is str and type(ots) is int
                and type(seq) is int and type(hops) is int):
            prev = swim._user_seen.get((kind, key))
            if prev is not None and (ots, seq, origin) <= prev:
                return
            swim._on_user(User(kind, key, origin, ots, seq, payload, hops), sender, addr, now)
            return
    User.from_wire(raw)  # raises MalformedMessage with the reason
    raise AssertionError("User.from_wire accepted what the fast path refused")


# keyed by the message's first item (a str: decode_packet checked)
_RECEIVERS: dict[object, Receiver] = {
    wire.PING: _route(Ping.from_wire, Swim._on_ping),
    wire.ACK: _route(Ack.from_wire, Swim._on_ack),
    wire.NACK: _route(Nack.from_wire, Swim._on_nack),
    wire.PING_REQ: _route(PingReq.from_wire, Swim._on_ping_req),
    wire.ALIVE: _route(Alive.from_wire, Swim._on_alive),
    wire.SUSPECT: _route(Suspect.from_wire, Swim._on_suspect),
    wire.DEAD: _route(Dead.from_wire, Swim._on_dead),
    wire.USER: _receive_user,
}

_TIMER_HANDLERS: dict[Timer, Callable[[Swim, TimerArg, float], None]] = {
    Timer.PROBE: Swim._t_probe,
    Timer.DIRECT: Swim._t_direct,
    Timer.GOSSIP: Swim._t_gossip,
    Timer.PUSH_PULL: Swim._t_push_pull,
    Timer.SUSPECT: Swim._t_suspect,
    Timer.NACK: Swim._t_nack,
    Timer.RELAY_EXPIRE: Swim._t_relay_expire,
    Timer.REAP: Swim._t_reap,
    Timer.REJOIN: Swim._t_rejoin,
    Timer.RECONNECT: Swim._t_reconnect,
    Timer.HEAL_BURST: Swim._t_heal_burst,
    Timer.SWEEP: Swim._t_sweep,
    Timer.SWEEP_DIRECT: Swim._t_sweep_direct,
    Timer.SWEEP_END: Swim._t_sweep_end,
    Timer.SWEEP_PUSH: Swim._t_sweep_push,
}
assert set(_TIMER_HANDLERS) == set(Timer), "every timer kind has a handler"
