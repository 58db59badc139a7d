"""Discrete-event simulator: many SWIM state machines on an in-memory network.

A plain heap of ``(time, seq, event)`` and one seeded RNG drive the same ``Swim``
objects the real node runs; nothing here touches Trio (its scheduler shuffles tasks
on purpose, which would make a large run irreproducible).  The network has per-link
latency, loss, duplication and partitions; nodes can crash or stall.  A stalled node is the
Lifeguard paper's slow member: it stops reading its socket for a while (CPU
starvation, a long GC pause in the receive path) while its timers keep running, so
its probes time out although the acks are sitting in its receive queue; when the
stall ends it reads the backlog.
"""

from __future__ import annotations

import gc
import heapq
import math
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, TextIO

from clock import Clock, SystemClock
from gossip.config import GossipConfig, preset
from gossip.events import ALIVE, DEAD, LEFT, SUSPECT, BroadcastReceived, MemberChanged, MemberState, ProbeFailed, SwimEvent
from gossip.formulas import suspicion_bounds, suspicion_timeout
from gossip.swim import Swim, frame_body
from gossip.trace import NullTraceWriter, TraceWriter
from netsplit.detector import PartitionDetected, PartitionDetector, PartitionHealed, detector_for
from netsplit.records import trace_fields
from simulation.truth import GroundTruth

PORT = 7946

# event kinds
_DELIVER = 0
_TIMER = 1
_PP_REQUEST = 2
_PP_REPLY = 3
_CRASH = 4
_STALL = 5
_RESUME = 6
_BROADCAST = 7
_PARTITION = 8
_HEAL = 9
_PROGRESS = 10
_JOIN = 11
_DETECT = 12
_RESTART = 13


@dataclass
class SimParams:
    nodes: int = 100
    seconds: float = 60.0
    loss: float = 0.0
    latency_ms: float = 2.0  # mean one-way latency; each link gets its own base
    duplicate: float = 0.0
    seed: int = 1
    crash: int = 0
    crash_at: float = 20.0
    restart_after: float | None = None  # crashed nodes start again this long after their crash
    stall: float = 0.0  # fraction of nodes that stall now and then
    stall_min: float = 0.2
    stall_max: float = 2.0
    stall_gap: tuple[float, float] = (2.0, 10.0)  # running time between stalls
    broadcasts_per_s: float = 0.0
    broadcast_stop_before_end: float = 5.0  # leave time for the last ones to spread
    partition: tuple[set[int], set[int]] | None = None
    partition_at: float = 0.0
    heal_at: float | None = None
    preset: str = "lan"
    lifeguard: bool = True
    overrides: dict[str, float] = field(default_factory=dict)  # GossipConfig fields
    join: bool = False  # False: start from a converged view; True: join via seed n0

    def gossip_config(self) -> GossipConfig:
        cfg = preset(self.preset).with_(lifeguard=self.lifeguard)
        return cfg.with_(**self.overrides) if self.overrides else cfg


@dataclass
class SimResult:
    params: SimParams
    wall_seconds: float
    cpu_seconds: float
    events: int
    packets: int
    bytes_sent: int
    bandwidth_per_node_bps: float  # bytes sent per node per virtual second (mean)
    max_bandwidth_per_node_bps: float
    stream_bandwidth_per_node_bps: float  # push-pull and fallback pings over TCP, both ways
    crashed: dict[str, float]  # node -> crash time
    dead_seen: dict[str, dict[str, float]]  # crashed node -> observer -> time marked dead
    false_dead: int  # live, un-crashed, reachable members declared dead (observer, subject) pairs
    partition_dead: int  # members declared dead by an observer on the other side of a cut
    false_suspicions: int  # probes that accused a member that was healthy throughout
    suspicions_of_live: int  # suspect transitions about members that never crashed
    broadcasts: dict[str, tuple[float, str]]  # event id -> (origin time, origin)
    broadcast_latencies: list[float]
    broadcast_coverage: float  # reached (broadcast, live node) pairs / expected
    live_nodes: int
    partition: dict[str, Any] = field(default_factory=dict)  # ground-truth split figures

    def crash_detection(self) -> list[float]:
        out: list[float] = []
        for node, at in self.crashed.items():
            out.extend(t - at for t in self.dead_seen.get(node, {}).values())
        return out

    def crash_coverage(self) -> float:
        if not self.crashed:
            return 1.0
        need = len(self.crashed) * self.live_nodes
        got = sum(len(v) for v in self.dead_seen.values())
        return got / need if need else 1.0

    def summary(self) -> dict[str, Any]:
        det = self.crash_detection()
        lat = self.broadcast_latencies
        return {
            "nodes": self.params.nodes,
            "virtual_s": self.params.seconds,
            "overrides": dict(self.params.overrides),  # preset settings changed for this run
            "wall_s": round(self.wall_seconds, 2),
            "speed_x": round(self.params.seconds / self.wall_seconds, 2) if self.wall_seconds else None,
            "cpu_s": round(self.cpu_seconds, 2),
            "cpu_speed_x": round(self.params.seconds / self.cpu_seconds, 2) if self.cpu_seconds else None,
            "events": self.events,
            "packets": self.packets,
            "bandwidth_per_node_Bps": round(self.bandwidth_per_node_bps, 1),
            "max_bandwidth_per_node_Bps": round(self.max_bandwidth_per_node_bps, 1),
            "stream_bandwidth_per_node_Bps": round(self.stream_bandwidth_per_node_bps, 1),
            "broadcasts": len(self.broadcasts),
            "broadcast_coverage": round(self.broadcast_coverage, 6),
            "broadcast_p50_s": _pct(lat, 50),
            "broadcast_p99_s": _pct(lat, 99),
            "broadcast_max_s": round(max(lat), 3) if lat else None,
            "crashed": len(self.crashed),
            "crash_dead_coverage": round(self.crash_coverage(), 6),
            "crash_to_dead_median_s": _pct(det, 50),
            "crash_to_dead_max_s": round(max(det), 3) if det else None,
            "false_dead": self.false_dead,
            "partition_dead": self.partition_dead,
            "false_suspicions": self.false_suspicions,
            "suspicions_of_live": self.suspicions_of_live,
            **({"partition": self.partition} if self.partition else {}),
        }


def _pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    i = min(len(s) - 1, max(0, math.ceil(p / 100 * len(s)) - 1))
    return round(s[i], 3)


def node_name(i: int) -> str:
    return f"n{i}"


def node_seed(seed: int, i: int) -> int:
    """Node ``i``'s RNG seed, derived from the run's one seed."""
    return seed * 1_000_003 + i


class Simulation:
    def __init__(
        self,
        params: SimParams,
        *,
        out_dir: str | Path | None = None,
        progress: TextIO | None = None,
        on_event: Callable[[int, float, SwimEvent], None] | None = None,
        wall_clock: Clock | None = None,
        cpu_clock: Callable[[], float] | None = None,
    ) -> None:
        """Virtual time is ``self.now``; ``wall_clock`` (default: the system's) and
        ``cpu_clock`` only measure how fast the run went.  Every random choice comes
        from ``params.seed``: the network's and the workload's RNG, and one per node
        derived from it, so a seed replays exactly."""
        self.p = params
        self.cfg = params.gossip_config()
        self.rng = random.Random(params.seed)
        self.wall_clock: Clock = wall_clock if wall_clock is not None else SystemClock()
        self.cpu_clock = cpu_clock if cpu_clock is not None else time.process_time
        self.cpu_seconds = 0.0
        self.progress = progress
        self.on_event = on_event
        n = params.nodes
        self.names = [node_name(i) for i in range(n)]
        self.index = {name: i for i, name in enumerate(self.names)}
        self.now = 0.0
        self._heap: list[tuple] = []
        self._seq = 0
        self.nodes: list[Swim] = []
        self.crashed_at: dict[int, float] = {}  # nodes down now -> since
        self.crash_log: dict[int, float] = {}  # every node that crashed -> when (first crash)
        self.restarted_at: dict[int, float] = {}
        self.stalled: dict[int, float] = {}  # node -> stall start
        self.stall_log: dict[int, list[tuple[float, float]]] = {}
        self._pending: dict[int, list[tuple]] = {}
        self._timer_at: list[float | None] = [None] * n
        self.side: list[int | None] = [None] * n
        self.partitioned = False
        self.sent_bytes = [0] * n
        self.stream_bytes = 0
        self.packets = 0
        self.events_processed = 0
        self.writers: list[TraceWriter | NullTraceWriter] = []
        # the node's partition detector, the same code the real monitor runs
        self.detectors: list[PartitionDetector] = []
        self._detect_at: list[float | None] = [None] * n
        out = Path(out_dir) if out_dir is not None else None
        if out is not None and out.is_dir():
            # a run's traces replace an earlier run's (the writer appends)
            for old in out.glob("n*.jsonl*"):
                if old.name.split(".jsonl")[0] in self.index:
                    old.unlink()
        for i, name in enumerate(self.names):
            node_rng = random.Random(node_seed(params.seed, i))
            sw = Swim(name, (name, PORT), now=0.0, rng=node_rng, config=self.cfg)
            self.nodes.append(sw)
            self.detectors.append(detector_for(name, self.cfg))
            self.writers.append(TraceWriter(out, name) if out is not None else NullTraceWriter())
        # ground truth for a split: per node, other-side members it holds dead, and
        # members it does not hold alive (0 again after the heal: one view)
        self._far_dead = [0] * n
        self._not_alive = [0] * n
        self.far_all_dead_at: dict[int, float] = {}
        self.one_view_at: dict[int, float] = {}
        self.partition_events: list[tuple[int, PartitionDetected | PartitionHealed]] = []
        self._far_suspect: dict[tuple[int, int], float] = {}
        self._suspect_to_dead: tuple[list[float], list[float]] = ([], [])
        # stats
        self.dead_seen: dict[str, dict[str, float]] = {}
        self.false_dead = 0
        self.partition_dead = 0
        self.false_suspicions = 0
        self.suspicions_of_live = 0
        self.broadcasts: dict[str, tuple[float, str]] = {}
        self.bcast_seen: dict[str, dict[str, float]] = {}
        self._link_base: dict[tuple[int, int], float] = {}
        self.out_dir = out
        self.truth = GroundTruth(partition_grace_s=self.dead_bound())

    # ------------------------------------------------------------------ setup

    def _push(self, t: float, kind: int, *args: Any) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, args))

    def _setup(self) -> None:
        p = self.p
        everyone = [(name, (name, PORT)) for name in self.names]
        for i, sw in enumerate(self.nodes):
            self.writers[i].emit(ts_us=0, kind="node_start", subject=self.names[i], incarnation=0, sim=True)
            if p.join:
                if i > 0:
                    self._push(self.rng.uniform(0, 1.0), _JOIN, i)
            else:
                sw.bootstrap(everyone, 0.0)
                self.detectors[i].bootstrap(self.names)
            sw.events()  # the start-up alive of each node is not an observation here
            self._reschedule(i)
        if p.crash:
            victims = self.rng.sample(range(p.nodes), p.crash)
            for v in victims:
                self._push(p.crash_at, _CRASH, v)
                if p.restart_after is not None and p.crash_at + p.restart_after <= p.seconds:
                    self._push(p.crash_at + p.restart_after, _RESTART, v)
                    self.restarted_at[v] = p.crash_at + p.restart_after  # scheduled
        if p.stall > 0:
            count = max(1, round(p.stall * p.nodes))
            for v in self.rng.sample(range(p.nodes), count):
                self._push(self.rng.uniform(*p.stall_gap), _STALL, v)
        if p.broadcasts_per_s > 0:
            self._push(self.rng.expovariate(p.broadcasts_per_s) + 1.0, _BROADCAST)
        if p.partition is not None:
            a, b = p.partition
            for i in a:
                self.side[i] = 0
            for i in b:
                self.side[i] = 1
            self._push(p.partition_at, _PARTITION)
            self.truth.sides = ([self.names[i] for i in a], [self.names[i] for i in b])
            self.truth.partition_at, self.truth.heal_at = p.partition_at, p.heal_at
            if p.heal_at is not None:
                self._push(p.heal_at, _HEAL)
        if self.progress is not None:
            self._push(0.0, _PROGRESS)

    # ------------------------------------------------------------------ network

    def _latency(self, a: int, b: int) -> float:
        key = (a, b) if a < b else (b, a)
        base = self._link_base.get(key)
        if base is None:
            # each link has its own mean, 0.5x .. 1.5x the configured latency
            base = self.p.latency_ms / 1000.0 * (0.5 + ((key[0] * 2654435761 + key[1] * 40503) % 1000) / 1000.0)
            self._link_base[key] = base
        return base * (0.8 + 0.4 * self.rng.random())

    def _cut(self, a: int, b: int) -> bool:
        if not self.partitioned:
            return False
        sa, sb = self.side[a], self.side[b]
        return sa is not None and sb is not None and sa != sb

    def _flush(self, i: int) -> None:
        # the simulator's hot path: a few attribute lookups inlined on purpose
        sw = self.nodes[i]
        now = self.now
        out = sw.datagrams_to_send(now)
        heap = self._heap
        if out:
            rnd = self.rng.random
            loss, dup = self.p.loss, self.p.duplicate
            src = (self.names[i], PORT)
            index = self.index
            partitioned = self.partitioned
            sent = 0
            for addr, data in out:
                sent += len(data)
                j = index.get(addr[0])
                if j is None or (partitioned and self._cut(i, j)):
                    continue
                if loss and rnd() < loss:
                    continue
                self._seq += 1
                heapq.heappush(heap, (now + self._latency(i, j), self._seq, _DELIVER, (j, data, src)))
                if dup and rnd() < dup:
                    self._push(now + self._latency(i, j), _DELIVER, j, data, src)
            self.packets += len(out)
            self.sent_bytes[i] += sent
        if sw._pp_out:  # peeked to skip a call on the hot path
            for addr, body in sw.streams_to_open():
                j = self.index.get(addr[0])
                if j is None or self._cut(i, j):
                    continue
                # a TCP connect plus the request: one and a half round trips
                body = frame_body(body)
                self.stream_bytes += len(body)
                self._push(now + 3 * self._latency(i, j), _PP_REQUEST, j, i, body)
        if sw._events:
            self._record(i, sw.events())
        timers = sw._timers
        if timers:
            t = timers[0][0]
            if t != self._timer_at[i]:
                self._timer_at[i] = t
                self._seq += 1
                heapq.heappush(heap, (t if t > now else now, self._seq, _TIMER, (i,)))

    def _reschedule(self, i: int) -> None:
        t = self.nodes[i].next_timer()
        if t is not None and t != self._timer_at[i]:
            self._timer_at[i] = t
            self._push(max(t, self.now), _TIMER, i)

    # ------------------------------------------------------------------ observations

    def _record(self, i: int, evs: list[SwimEvent]) -> None:
        w = self.writers[i]
        name = self.names[i]
        now = self.now
        for ev in evs:
            if self.on_event is not None:
                self.on_event(i, now, ev)
            if isinstance(ev, MemberChanged):
                w.emit(
                    ts_us=ev.ts_us, kind=f"member_{ev.state}", subject=ev.member, origin=ev.origin,
                    origin_ts_us=ev.origin_ts_us, event_id=ev.event_id, hops=ev.hops, incarnation=ev.incarnation, sim=True,
                )
                subj = self.index.get(ev.member)
                if subj is None or ev.member == name:
                    continue
                self._detect(i, subj, ev.member, ev.state, now)
                crashed = subj in self.crashed_at
                if ev.state == DEAD and ev.origin == name and ev.hops == 0:
                    restart = self.restarted_at.get(subj)
                    heal = self.p.heal_at
                    across = self._across(ev.origin, subj) and (heal is None or now <= heal + self.truth.partition_grace_s)
                    self.truth.declared(ev.event_id, down=crashed, comes_back=restart is not None and restart > now,
                                        across=across)
                if ev.state == DEAD and crashed:
                    self.truth.dead_recorded(name, ev.member, ev.ts_us / 1e6)
                if ev.state in (DEAD, LEFT):
                    if crashed:
                        self.dead_seen.setdefault(ev.member, {}).setdefault(name, now)
                    elif self._across(ev.origin, subj):
                        self.partition_dead += 1  # declared by someone who could not reach it
                    else:
                        self.false_dead += 1
                elif ev.state == SUSPECT and not crashed and not self._across(ev.origin, subj):
                    self.suspicions_of_live += 1
            elif isinstance(ev, BroadcastReceived):
                w.emit(
                    ts_us=ev.ts_us, kind="broadcast", subject=ev.key, origin=ev.origin, origin_ts_us=ev.origin_ts_us,
                    event_id=ev.event_id, hops=ev.hops, sim=True, bkind=ev.kind,
                )
                if ev.local:
                    self.broadcasts[ev.event_id] = (now, ev.origin)
                else:
                    self.bcast_seen.setdefault(ev.event_id, {})[name] = now
            elif isinstance(ev, ProbeFailed):
                j = self.index[ev.target]
                if not self._was_unhealthy(j, ev.started, now) and not self._cut_during(i, j, ev.started):
                    self.false_suspicions += 1

    def _detect(self, i: int, j: int, member: str, state: MemberState, now: float) -> None:
        det = self.detectors[i]
        prev = det.states.get(member)
        side = self.side[i]
        view_moved = False
        if self.p.partition is not None:
            if (prev in (None, ALIVE)) != (state == ALIVE):
                self._not_alive[i] += 1 if state != ALIVE else -1
                view_moved = self.p.heal_at is not None and now >= self.p.heal_at
            if side is not None and self.side[j] is not None and side != self.side[j]:
                if state == SUSPECT and prev in (None, ALIVE):
                    self._far_suspect[(i, j)] = now
                if state == DEAD and prev != DEAD:
                    t0 = self._far_suspect.pop((i, j), None)
                    if t0 is not None:
                        self._suspect_to_dead[side].append(now - t0)
                    self._far_dead[i] += 1
                    far = len(self.p.partition[1 - side])
                    if self._far_dead[i] == far and now >= self.p.partition_at:
                        self.far_all_dead_at.setdefault(i, now)
                elif prev == DEAD and state != DEAD:
                    self._far_dead[i] -= 1
        self._detected(i, det.member_changed(member, state, now))
        if view_moved and self._one_view(i):
            self.one_view_at[i] = now

    def _one_view(self, i: int) -> bool:
        """Node i holds every member alive but those down now (a crash is no split)."""
        states = self.detectors[i].states
        down = sum(1 for j in self.crashed_at if j != i and states.get(self.names[j]) not in (None, ALIVE))
        return self._not_alive[i] == down

    def _detected(self, i: int, evs: list[PartitionDetected | PartitionHealed]) -> None:
        det = self.detectors[i]
        for ev in evs:
            self.partition_events.append((i, ev))
            self.writers[i].emit(origin=self.names[i], sim=True, **trace_fields(ev, 0.0, self.cfg))
        t = det.next_deadline()
        if t is not None and t != self._detect_at[i]:
            self._detect_at[i] = t
            self._push(max(t, self.now), _DETECT, i)

    def _across(self, origin: str, subj: int) -> bool:
        """Was this declaration made across a partition (now or earlier in the run)?"""
        if self.p.partition is None or self.now < self.p.partition_at:
            return False
        o = self.index.get(origin)
        if o is None:
            return False
        so, ss = self.side[o], self.side[subj]
        return so is not None and ss is not None and so != ss

    def _cut_during(self, a: int, b: int, start: float) -> bool:
        """Were a and b on opposite sides of a partition at some time since ``start``?"""
        p = self.p
        if p.partition is None or self.now < p.partition_at:
            return False
        if p.heal_at is not None and start > p.heal_at:
            return False
        sa, sb = self.side[a], self.side[b]
        return sa is not None and sb is not None and sa != sb

    def _was_unhealthy(self, j: int, start: float, end: float) -> bool:
        c = self.crash_log.get(j)
        if c is not None and c <= end:
            return True
        if j in self.stalled:
            return True
        for s, e in self.stall_log.get(j, ()):
            if s <= end and e >= start:
                return True
        return False

    # ------------------------------------------------------------------ run

    def run(self) -> SimResult:
        p = self.p
        wall0 = self.wall_clock.now()
        cpu0 = self.cpu_clock()
        # a million member records are born at once and live for the whole run: keep
        # the cyclic GC from re-scanning them over and over (it cost a third of a
        # 1,000-node run)
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            self._setup()
        finally:
            gc.freeze()
            if gc_was_enabled:
                gc.enable()
        heap = self._heap
        nodes = self.nodes
        end = p.seconds
        crashed = self.crashed_at
        stalled = self.stalled
        while heap:
            t, _, kind, args = heap[0]
            if t > end:
                break
            heapq.heappop(heap)
            self.now = t
            self.events_processed += 1
            if kind == _DELIVER:
                j, data, src = args
                if j in crashed:
                    continue
                if j in stalled:
                    self._pending.setdefault(j, []).append(args)
                    continue
                nodes[j].receive(data, src, t)
                self._flush(j)
            elif kind == _TIMER:
                (i,) = args
                if self._timer_at[i] != t:
                    continue  # superseded
                self._timer_at[i] = None
                if i in crashed:
                    continue
                nodes[i].handle_timer(t)
                self._flush(i)
            elif kind == _PP_REQUEST:
                j, i, body = args
                if j in crashed or i in crashed:
                    continue
                if j in stalled:
                    self._pending.setdefault(j, []).append(("pp", i, body))
                    continue
                reply = nodes[j].handle_stream(body, t)
                self.stream_bytes += len(reply) if reply is not None else 0
                self._flush(j)
                if reply is not None and not self._cut(i, j):
                    self._push(t + self._latency(i, j), _PP_REPLY, i, reply)
            elif kind == _PP_REPLY:
                i, body = args
                if i in crashed:
                    continue
                if i in stalled:
                    self._pending.setdefault(i, []).append(("ppr", body))
                    continue
                nodes[i].receive_stream_reply(body, t)
                self._flush(i)
            else:
                self._control(kind, args)
        self.now = end
        gc.unfreeze()  # let a later run (or test) collect this one
        wall = self.wall_clock.now() - wall0
        self.cpu_seconds = self.cpu_clock() - cpu0
        for w in self.writers:
            w.close()
        if self.out_dir is not None:
            self.truth.write(self.out_dir)
        if self.progress is not None:
            self.progress.write("\n")
            self.progress.flush()
        return self._result(wall)

    def _control(self, kind: int, args: tuple) -> None:
        t = self.now
        p = self.p
        if kind == _CRASH:
            (i,) = args
            up = {self.names[j] for j in range(p.nodes) if j not in self.crashed_at}
            self.truth.crashed(self.names[i], t, self.restarted_at.get(i), up)
            self.crashed_at[i] = t
            self.crash_log.setdefault(i, t)
            self.stalled.pop(i, None)
            self.writers[i].emit(ts_us=int(t * 1e6), kind="node_crash", subject=self.names[i], sim=True)
        elif kind == _STALL:
            (i,) = args
            if i in self.crashed_at:
                return
            self.stalled[i] = t
            self._push(t + self.rng.uniform(p.stall_min, p.stall_max), _RESUME, i)
        elif kind == _RESUME:
            (i,) = args
            start = self.stalled.pop(i, None)
            if start is None or i in self.crashed_at:
                return
            self.stall_log.setdefault(i, []).append((start, t))
            sw = self.nodes[i]
            for item in self._pending.pop(i, []):
                if item[0] == "pp":
                    _, src, body = item
                    reply = sw.handle_stream(body, t)
                    self.stream_bytes += len(reply) if reply is not None else 0
                    if reply is not None and src not in self.crashed_at:
                        self._push(t + self._latency(i, src), _PP_REPLY, src, reply)
                elif item[0] == "ppr":
                    sw.receive_stream_reply(item[1], t)
                else:
                    _, data, src = item
                    sw.receive(data, src, t)
            self._flush(i)
            self._push(t + self.rng.uniform(*p.stall_gap), _STALL, i)
        elif kind == _BROADCAST:
            if t < p.seconds - p.broadcast_stop_before_end:
                live = [i for i in range(p.nodes) if i not in self.crashed_at and i not in self.stalled]
                if live:
                    i = self.rng.choice(live)
                    self.nodes[i].broadcast("sim", f"b{self._seq}", {"n": self._seq}, t)
                    self._flush(i)
                self._push(t + self.rng.expovariate(p.broadcasts_per_s), _BROADCAST)
        elif kind == _PARTITION:
            self.partitioned = True
        elif kind == _HEAL:
            self.partitioned = False
        elif kind == _RESTART:
            self._restart(args[0])
        elif kind == _JOIN:
            (i,) = args
            self.nodes[i].join([(self.names[0], PORT)], t)
            self._flush(i)
        elif kind == _DETECT:
            (i,) = args
            if self._detect_at[i] != t or i in self.crashed_at:
                return  # superseded
            self._detect_at[i] = None
            self._detected(i, self.detectors[i].tick(t))
        elif kind == _PROGRESS:
            self._draw_progress()
            if t + 1.0 <= p.seconds:
                self._push(t + 1.0, _PROGRESS)

    def _restart(self, i: int) -> None:
        """A crashed node starts again: a new gossip machine (incarnation 0, as a real
        node's) and a new detector, joining through a live member; it learns that it
        was held dead and refutes that."""
        t = self.now
        name = self.names[i]
        self.crashed_at.pop(i, None)
        self._pending.pop(i, None)
        self._timer_at[i] = self._detect_at[i] = None
        self._far_dead[i] = self._not_alive[i] = 0
        sw = Swim(name, (name, PORT), now=t, rng=random.Random(node_seed(self.p.seed, i) ^ 0x5EED), config=self.cfg)
        self.nodes[i] = sw
        self.detectors[i] = detector_for(name, self.cfg)
        self.writers[i].emit(ts_us=int(t * 1e6), kind="node_start", subject=name, incarnation=0, sim=True)
        sw.events()  # its own start-up alive is not an observation (as at time 0)
        live = [j for j in range(self.p.nodes) if j not in self.crashed_at and j != i]
        if live:
            sw.join([(self.names[self.rng.choice(live)], PORT)], t)
        self._flush(i)

    def _draw_progress(self) -> None:
        assert self.progress is not None
        width = 30
        frac = self.now / self.p.seconds if self.p.seconds else 1.0
        filled = int(frac * width)
        self.progress.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {self.now:6.1f}/{self.p.seconds:.0f} s virtual")
        self.progress.flush()

    def _result(self, wall: float) -> SimResult:
        p = self.p
        live = [i for i in range(p.nodes) if i not in self.crash_log]  # up throughout
        live_names = {self.names[i] for i in live}
        latencies: list[float] = []
        expected = reached = 0
        for eid, (t0, origin) in self.broadcasts.items():
            seen = self.bcast_seen.get(eid, {})
            for name in live_names:
                if name == origin:
                    continue
                expected += 1
                t = seen.get(name)
                if t is not None:
                    reached += 1
                    latencies.append(t - t0)
        total = sum(self.sent_bytes)
        per_node = [b / p.seconds for b in self.sent_bytes] if p.seconds else [0.0]
        return SimResult(
            partition=self._partition_figures(),
            params=p,
            wall_seconds=wall,
            cpu_seconds=self.cpu_seconds,
            events=self.events_processed,
            packets=self.packets,
            bytes_sent=total,
            bandwidth_per_node_bps=total / p.nodes / p.seconds if p.seconds else 0.0,
            max_bandwidth_per_node_bps=max(per_node),
            stream_bandwidth_per_node_bps=self.stream_bytes / p.nodes / p.seconds if p.seconds else 0.0,
            crashed={self.names[i]: t for i, t in self.crash_log.items()},
            dead_seen=self.dead_seen,
            false_dead=self.false_dead,
            partition_dead=self.partition_dead,
            false_suspicions=self.false_suspicions,
            suspicions_of_live=self.suspicions_of_live,
            broadcasts=self.broadcasts,
            broadcast_latencies=latencies,
            broadcast_coverage=reached / expected if expected else 1.0,
            live_nodes=len(live) - 0,
        )

    def _partition_figures(self) -> dict[str, Any]:
        """Ground truth for a split: when each side held the whole other side dead
        (from the cut), and when each node saw one view again (from the heal)."""
        p = self.p
        if p.partition is None:
            return {}
        bound = suspicion_timeout(self.cfg.suspicion_mult, p.nodes, self.cfg.probe_interval) + 3.0
        out: dict[str, Any] = {"suspicion_timeout_plus_3_s": round(bound, 3)}
        for side, members in enumerate(p.partition):
            times = [self.far_all_dead_at[i] - p.partition_at for i in members if i in self.far_all_dead_at]
            det = [ev.detection_s for i, ev in self.detections().values() if i in members]
            out[f"side_{'ab'[side]}"] = {
                "nodes": len(members),
                "marked_other_dead": len(times),
                "other_dead_p50_s": _pct(times, 50),
                "other_dead_max_s": round(max(times), 3) if times else None,
                "within_bound": sum(1 for x in times if x <= bound),
                # per (observer, member of the other side): suspect to dead, the
                # suspicion timeout as lived (without the time to first suspect)
                "suspect_to_dead_p50_s": _pct(self._suspect_to_dead[side], 50),
                "suspect_to_dead_max_s": round(max(self._suspect_to_dead[side]), 3) if self._suspect_to_dead[side] else None,
                "detector_detection_p50_s": _pct(det, 50),
            }
        if p.heal_at is not None:
            live = [i for i in range(p.nodes) if i not in self.crashed_at]
            heal = [self.one_view_at[i] - p.heal_at for i in live if i in self.one_view_at and self._one_view(i)]
            out.update(
                one_view_nodes=len(heal), live_nodes=len(live),
                heal_p50_s=_pct(heal, 50), heal_p99_s=_pct(heal, 99), heal_max_s=round(max(heal), 3) if heal else None,
                healed_events=sum(1 for _, ev in self.partition_events if isinstance(ev, PartitionHealed)),
                detected_partitions=len(self.detections()),
            )
        return out

    def detections(self) -> dict[str, tuple[int, PartitionDetected]]:
        """Each partition's last ``PartitionDetected`` (a revision names the members
        that joined it late and the side recomputed), keyed by partition id."""
        last: dict[str, tuple[int, PartitionDetected]] = {}
        for i, ev in self.partition_events:
            if isinstance(ev, PartitionDetected):
                last[ev.partition_id] = (i, ev)
        return last

    def dead_bound(self) -> float:
        """Upper bound on crash-to-dead at every node from the protocol's formulas:
        a full probe round to reach it, the maximum suspicion timeout, and gossip."""
        cfg = self.cfg
        lo, hi = suspicion_bounds(cfg.suspicion_mult, cfg.suspicion_max_timeout_mult, self.p.nodes, cfg.probe_interval)
        return hi + 2 * cfg.probe_interval + 2.0


def parse_partition(spec: str, n: int) -> tuple[set[int], set[int]]:
    """``"0-49|50-99"`` or ``"n0,n1|n2-n9"``: two sides as index ranges."""
    sides = spec.split("|")
    if len(sides) != 2:
        raise ValueError("partition must look like A|B")
    out: list[set[int]] = []
    for side in sides:
        members: set[int] = set()
        for part in side.split(","):
            part = part.strip().replace("n", "")
            if not part:
                continue
            if "-" in part:
                a, b = part.split("-", 1)
                members.update(range(int(a), int(b) + 1))
            else:
                members.add(int(part))
        if any(i < 0 or i >= n for i in members):
            raise ValueError(f"partition side {side!r} names nodes outside 0..{n - 1}")
        out.append(members)
    if out[0] & out[1]:
        raise ValueError("partition sides overlap")
    return out[0], out[1]


def run(params: SimParams, out_dir: str | Path | None = None, progress: TextIO | None = None) -> SimResult:
    return Simulation(params, out_dir=out_dir, progress=progress).run()


if __name__ == "__main__":  # quick manual run
    r = run(SimParams(nodes=int(sys.argv[1]) if len(sys.argv) > 1 else 100, seconds=30, broadcasts_per_s=1), progress=sys.stderr)
    print(r.summary())
