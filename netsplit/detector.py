"""Partition detection over the membership view, as pure logic.

Fed every state change of another member (``member_changed(member, state, now)``,
states alive / suspect / dead / left) and woken at ``next_deadline()`` with
``tick(now)``; returns facts (``PartitionDetected`` / ``PartitionHealed``).  No Trio,
no clock reads: the node's monitor and the simulator run this same code.

What counts as a partition: a group of members that stop being reachable together,
i.e. each goes suspect or dead within ``window`` seconds of the first one (the
onset), and all of them end up dead, while the rest of the view is still alive.
A member that leaves gracefully (``left``) is never part of a partition, and a
suspicion that is refuted in time removes the member from the group.  A single
crashed member is a group of one: from inside the cluster a crash and a cable cut
look the same, and the mesh treats both alike (held routes, replay on return).

Sides are reported as this node sees them: ``local`` (alive members and us) and
``remote`` (the group).  ``majority`` says whether the local side holds more than
half of the last stable view, the membership as it was before the onset; an exact
half goes to the side holding the smallest member id, so both halves agree.

Members that stop answering within ``window`` seconds after a detection join that
partition (their probes simply came later).  Once that window closes, a partition
that took in late members is reported again: a ``PartitionDetected`` with the same
``partition_id`` and ``revision`` one higher, naming every member lost and the side
recomputed (a 3|2 split often concludes on the first dead member while the others
are still only suspect; the first record then names one peer and calls the
minority a majority).  Readers keep the last revision of each partition id.

A partition heals when every remote member is alive again (or left).  If some came
back and the others stay dead for ``heal_grace`` seconds, those are taken to have
crashed meanwhile: the partition heals without them (listed as ``missing``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from gossip.config import GossipConfig
from gossip.events import MemberState
from gossip.formulas import suspicion_timeout

ALIVE = MemberState.ALIVE
SUSPECT = MemberState.SUSPECT
DEAD = MemberState.DEAD
LEFT = MemberState.LEFT


@dataclass(frozen=True, slots=True)
class PartitionDetected:
    """A group of members became unreachable together."""

    partition_id: str
    at: float  # when this node concluded it
    onset: float  # when the first member of the group stopped answering
    local: frozenset[str]  # our side as we see it (us included)
    remote: frozenset[str]  # the members we lost
    majority: bool  # our side holds a majority of the last stable view
    stable_view: frozenset[str]
    revision: int = 0  # 0: the first conclusion; n: the n-th revision (late members joined)

    @property
    def detection_s(self) -> float:
        return self.at - self.onset


@dataclass(frozen=True, slots=True)
class PartitionHealed:
    """Every member of a partition is reachable again (or gone for good)."""

    partition_id: str
    at: float
    detected_at: float
    first_contact: float  # the first remote member seen alive again
    remote: frozenset[str]
    missing: frozenset[str]  # remote members that never came back (crashed meanwhile)

    @property
    def heal_s(self) -> float:
        """From the first contact with the other side to one view."""
        return self.at - self.first_contact

    @property
    def duration_s(self) -> float:
        return self.at - self.detected_at


@dataclass(slots=True)
class Partition:
    """An active (detected, not yet healed) partition."""

    id: str
    detected_at: float
    onset: float
    local: frozenset[str]
    remote: set[str]
    majority: bool
    stable_view: frozenset[str]
    returned: dict[str, float] = field(default_factory=dict)  # remote members alive again -> since
    first_contact: float | None = None
    last_return: float = 0.0
    revision: int = 0
    late: set[str] = field(default_factory=set)  # joined after the last record, not yet reported

    def as_dict(self, clock_offset: float = 0.0) -> dict[str, object]:
        return {
            "id": self.id,
            "detected_ts_us": _us(self.detected_at + clock_offset),
            "onset_ts_us": _us(self.onset + clock_offset),
            "local": sorted(self.local),
            "remote": sorted(self.remote),
            "majority": self.majority,
            "returned": sorted(self.returned),
        }


@dataclass(slots=True)
class _Group:
    onset: float
    stable_view: frozenset[str]
    members: set[str] = field(default_factory=set)
    suspects: int = 0  # members of the group still only suspect


class PartitionDetector:
    """One node's partition detector (see the module docstring).

    Every input is O(1) apart from the moments a group opens or is concluded, so a
    simulator can run a thousand of these through a split of a thousand members."""

    def __init__(
        self, node_id: str, *, window: float = 5.0, heal_grace: float = 30.0, give_up_after: float | None = None
    ) -> None:
        if window <= 0 or heal_grace <= 0 or (give_up_after is not None and give_up_after <= 0):
            raise ValueError("window, heal_grace and give_up_after must be positive")
        self.node_id = node_id
        self.window = window
        self.heal_grace = heal_grace
        # nobody came back for this long: stop waiting (gossip stops reconnecting too)
        self.give_up_after = give_up_after
        self.expired_total = 0
        self.states: dict[str, MemberState] = {}  # other members' last known state
        self.active: dict[str, Partition] = {}
        self.detected_total = 0
        self.healed_total = 0
        self._dead: set[str] = set()
        self._suspects = 0
        self._where: dict[str, Partition] = {}  # remote member -> its active partition
        self._group: _Group | None = None
        self._seq = 0
        self._last_tick = float("-inf")

    # ------------------------------------------------------------------ input

    def bootstrap(self, alive: Iterable[str]) -> None:
        """Start from a converged view (the simulator's warm start): these members
        are alive, learned without events."""
        for m in alive:
            if m != self.node_id and m not in self.states:
                self.states[m] = ALIVE

    def member_changed(self, member: str, state: MemberState | str, now: float) -> list[PartitionDetected | PartitionHealed]:
        if type(state) is not MemberState:
            try:
                state = MemberState(state)
            except ValueError:
                raise ValueError(f"unknown member state {state!r}") from None
        if member == self.node_id:
            return []
        prev = self.states.get(member)
        if prev == state:
            return []
        self._account(member, prev, state)
        out: list[PartitionDetected | PartitionHealed] = []
        group = self._group
        in_group = group is not None and member in group.members
        if in_group:
            assert group is not None
            if prev == SUSPECT:
                group.suspects -= 1
            if state in (ALIVE, LEFT):
                group.members.discard(member)  # refuted in time, or a graceful leave
            elif state == SUSPECT:
                group.suspects += 1
        p = self._where.get(member)
        if p is not None and state == ALIVE and member in p.late:
            self._unjoin(p, member)
        elif p is not None:
            if state == LEFT:
                p.late.discard(member)
                p.remote.discard(member)
                p.returned.pop(member, None)
                del self._where[member]
            elif state == ALIVE:
                if member not in p.returned:
                    p.returned[member] = now
                    p.last_return = now
                    if p.first_contact is None:
                        p.first_contact = now
            else:
                p.returned.pop(member, None)  # gone again
        elif not in_group and state in (SUSPECT, DEAD) and not self._join_recent_partition(member, now):
            # it stopped answering: the onset of a new group, or one more of the
            # current group (a group still waiting for suspicions to resolve takes
            # late members too, rather than being lost)
            if group is not None and now > group.onset + self.window and not group.suspects:
                out += self._conclude(now)
                group = self._group
            if group is None:
                group = self._group = _Group(now, self._current_view() | {member})
            group.members.add(member)
            if state == SUSPECT:
                group.suspects += 1
        if self._group is not None and not self._group.members:
            self._group = None
        out += self.tick(now)
        return out

    def tick(self, now: float) -> list[PartitionDetected | PartitionHealed]:
        out: list[PartitionDetected | PartitionHealed] = []
        self._last_tick = now
        group = self._group
        # compared as the deadline is computed (onset + window), or float rounding
        # could leave a deadline that never comes due
        if group is not None and now >= group.onset + self.window:
            out += self._conclude(now)
        for pid in list(self.active):
            p = self.active[pid]
            if self._revision_due(p, now):
                out += self._revise(p, now)
            if not p.returned and self.give_up_after is not None and now >= p.detected_at + self.give_up_after:
                self._forget(p)
                self.expired_total += 1
                for m in p.remote:
                    self._account(m, self.states.get(m), None)
            elif len(p.returned) == len(p.remote):
                out.append(self._heal(p, now, frozenset()))
            elif p.returned and now >= p.last_return + self.heal_grace:
                # part of the other side came back a while ago, the rest did not
                out.append(self._heal(p, now, frozenset(p.remote - p.returned.keys())))
        return out

    def next_deadline(self) -> float | None:
        """When ``tick`` next has something to decide (None: only on member changes)."""
        times: list[float] = []
        g = self._group
        if g is not None and not (g.suspects and self._last_tick >= g.onset + self.window):
            times.append(g.onset + self.window)  # past the window, suspicions decide
        for p in self.active.values():
            if p.late and not any(self.states.get(m) == SUSPECT for m in p.late):
                times.append(p.detected_at + self.window)  # the join window closes
            if p.returned:
                times.append(p.last_return + self.heal_grace)
            elif self.give_up_after is not None:
                times.append(p.detected_at + self.give_up_after)
        return min(times) if times else None

    # ------------------------------------------------------------------ queries

    @property
    def stable_view(self) -> frozenset[str]:
        """The last stable view: the members (us included) before the current group
        began; members lost to partitions still count."""
        if self._group is not None:
            return self._group.stable_view
        return self._current_view()

    def unreachable(self) -> frozenset[str]:
        """Members last seen dead (not left): they may come back, and a lost member's
        routes and messages are held for them meanwhile."""
        return frozenset(self._dead)

    def is_partitioned(self) -> bool:
        return bool(self.active)

    def in_minority(self) -> bool:
        """Is this node on the side without a majority of some unhealed partition?

        A crashed member is a partition of one whose survivors hold the majority, so
        a crash alone never puts anyone here; an isolated node is here once it has
        detected that it is alone."""
        active = self.active
        return bool(active) and any(not p.majority for p in active.values())

    def across_partition(self, member: str) -> bool:
        """Is ``member`` on the other side of a partition that has not healed yet?"""
        p = self._where.get(member)
        return p is not None and member not in p.returned

    def lost_to_majority(self, member: str, now: float) -> bool:
        """Is ``member`` lost as the side holding the majority sees it, with this node on
        that side?  Only then may this node act for it as for a dead member (a replica
        sending the will of a session it owned): at most one side of a split holds the
        majority, so the side that may still have the member's clients connected does
        not act.  False while the sides are not settled: a group of members is still
        going (not concluded), or the member's partition is within its join window
        (more members may join it and move the majority).  A member that left, or
        that a partition gave up on or healed without, is lost."""
        if self._group is not None or self.in_minority():
            return False
        p = self._where.get(member)
        if p is None:
            return self.states.get(member) not in (ALIVE, SUSPECT)
        return member not in p.returned and not p.late and now >= p.detected_at + self.window

    def holds_majority(self, members: Iterable[str]) -> bool:
        """Do ``members`` with this node hold the majority of the last stable view (an
        exact half: the half with the smallest member id)?"""
        return _holds_majority(frozenset(members) | {self.node_id}, self.stable_view)

    # ------------------------------------------------------------------ internals

    def _account(self, member: str, prev: MemberState | None, state: MemberState | None) -> None:
        for st, bucket in ((prev, -1), (state, 1)):
            if st == DEAD:
                (self._dead.add if bucket > 0 else self._dead.discard)(member)
            elif st == SUSPECT:
                self._suspects += bucket
        if state is None:
            self.states.pop(member, None)
        else:
            self.states[member] = state

    def _current_view(self) -> frozenset[str]:
        # every member not gone for good: one merely suspect (or already dead) when a
        # new group starts is still part of the view the majority is counted against
        return frozenset(m for m, st in self.states.items() if st != LEFT) | self._where.keys() | {self.node_id}

    def _join_recent_partition(self, member: str, now: float) -> bool:
        # a member that stops answering just after a detection belongs to it (its
        # probes simply came later); the local side shrinks accordingly
        for p in self.active.values():
            if now < p.detected_at + self.window and member in p.local:
                p.remote.add(member)
                p.local = p.local - {member}
                # our side shrank: it may no longer hold the majority
                p.majority = _holds_majority(p.local, p.stable_view)
                self._where[member] = p
                p.late.add(member)  # reported in a revision once the join window closes
                return True
        return False

    def _unjoin(self, p: Partition, member: str) -> None:
        """A late member's suspicion was refuted before it was reported: it never
        left our side."""
        p.late.discard(member)
        p.remote.discard(member)
        p.returned.pop(member, None)
        p.local = p.local | {member}
        p.majority = _holds_majority(p.local, p.stable_view)
        del self._where[member]

    def _revision_due(self, p: Partition, now: float) -> bool:
        # the join window has closed and every late member is settled (dead)
        return bool(p.late) and now >= p.detected_at + self.window and all(
            self.states.get(m) == DEAD for m in p.late
        )

    def _revise(self, p: Partition, now: float) -> list[PartitionDetected]:
        p.late.clear()
        # the members still lost (one that came back meanwhile is on its way home)
        lost = frozenset(p.remote - p.returned.keys())
        if not lost:
            return []  # all back: the heal says the rest
        p.revision += 1
        return [PartitionDetected(p.id, now, p.onset, p.local, lost, p.majority, p.stable_view, p.revision)]

    def _conclude(self, now: float) -> list[PartitionDetected | PartitionHealed]:
        group = self._group
        assert group is not None
        if group.suspects:
            return []  # wait until the suspicions resolve (dead, or refuted)
        self._group = None
        members = {m for m in group.members if self.states.get(m) == DEAD}
        if not members:
            return []
        # The members alive now, from `states` (no set of them is kept: a simulator of
        # 5,000 nodes holds 25 million member states, and such a set cost 80 bytes each).
        local = frozenset([m for m, st in self.states.items() if st == ALIVE] + [self.node_id])
        self._seq += 1
        pid = f"{self.node_id}/{self._seq}"
        stable = group.stable_view
        p = Partition(pid, now, group.onset, local, set(members), _holds_majority(local, stable), stable)
        self.active[pid] = p
        for m in members:
            self._where[m] = p
        self.detected_total += 1
        return [PartitionDetected(pid, now, group.onset, local, frozenset(members), p.majority, stable)]

    def _forget(self, p: Partition) -> None:
        del self.active[p.id]
        for m in p.remote:
            if self._where.get(m) is p:
                del self._where[m]

    def _heal(self, p: Partition, now: float, missing: frozenset[str]) -> PartitionHealed:
        self._forget(p)
        self.healed_total += 1
        first = p.first_contact if p.first_contact is not None else now
        return PartitionHealed(p.id, now, p.detected_at, first, frozenset(p.remote), missing)


def _holds_majority(local: frozenset[str], stable: frozenset[str]) -> bool:
    mine = len(local & stable)
    if 2 * mine != len(stable):
        return 2 * mine > len(stable)
    return bool(stable) and min(stable) in local


def _us(t: float) -> int:
    return int(round(t * 1_000_000))


def detector_for(node_id: str, config: GossipConfig) -> PartitionDetector:
    """A detector timed from the gossip config: members lost within one minimum
    suspicion timeout of each other are one group; after a first contact the rest
    have one push-pull interval (plus a few probe rounds) to come back; a partition
    nobody returns from is dropped when gossip stops reconnecting."""
    window = max(2 * config.probe_interval, suspicion_timeout(config.suspicion_mult, 1, config.probe_interval))
    grace = config.push_pull_interval + 10 * config.probe_interval
    return PartitionDetector(node_id, window=window, heal_grace=grace, give_up_after=config.reconnect_dead_for)
