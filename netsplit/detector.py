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

A partition heals when every remote member is alive again (or left).  If some came
back and the others stay dead for ``heal_grace`` seconds, those are taken to have
crashed meanwhile: the partition heals without them (listed as ``missing``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

ALIVE = "alive"
SUSPECT = "suspect"
DEAD = "dead"
LEFT = "left"
_STATES = (ALIVE, SUSPECT, DEAD, LEFT)


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
    returned: dict[str, float] = field(default_factory=dict)  # member -> when seen alive

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
    members: set[str]


class PartitionDetector:
    """One node's partition detector (see the module docstring)."""

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
        self.states: dict[str, str] = {}  # other members' last known state
        self.stable_view: frozenset[str] = frozenset({node_id})
        self.active: dict[str, Partition] = {}
        self.detected_total = 0
        self.healed_total = 0
        self._group: _Group | None = None
        self._seq = 0
        self._last_tick = float("-inf")

    # ------------------------------------------------------------------ input

    def member_changed(self, member: str, state: str, now: float) -> list[PartitionDetected | PartitionHealed]:
        if state not in _STATES:
            raise ValueError(f"unknown member state {state!r}")
        if member == self.node_id:
            return []
        self.states[member] = state
        out: list[PartitionDetected | PartitionHealed] = []
        group = self._group
        if state == LEFT:
            if group is not None:
                group.members.discard(member)
            for p in self.active.values():
                p.remote.discard(member)
                p.returned.pop(member, None)
        elif state == ALIVE:
            if group is not None:
                group.members.discard(member)  # refuted in time: it was reachable
            for p in self.active.values():
                if member in p.remote:
                    p.returned.setdefault(member, now)
        elif not self._tracked(member) and not self._join_recent_partition(member, now):
            # it stopped answering: the onset of a new group, or one more of the
            # current group (a group still waiting for suspicions to resolve takes
            # late members too, rather than being lost)
            if group is not None and now - group.onset > self.window and not self._pending(group):
                out += self._conclude(now)
                group = self._group
            if group is None:
                group = self._group = _Group(now, set())
            group.members.add(member)
        if self._group is None or not self._group.members:
            self._group = None
            self._refresh_stable_view()
        out += self.tick(now)
        return out

    def tick(self, now: float) -> list[PartitionDetected | PartitionHealed]:
        out: list[PartitionDetected | PartitionHealed] = []
        self._last_tick = now
        group = self._group
        if group is not None and now - group.onset >= self.window:
            out += self._conclude(now)
        for pid in list(self.active):
            p = self.active[pid]
            back = [m for m in p.remote if self.states.get(m) == ALIVE]
            if not p.returned and self.give_up_after is not None and now - p.detected_at >= self.give_up_after:
                del self.active[pid]
                self.expired_total += 1
                for m in p.remote:
                    self.states.pop(m, None)
            elif len(back) == len(p.remote):
                out.append(self._heal(p, now, frozenset()))
            elif back and now - max(p.returned[m] for m in back) >= self.heal_grace:
                # part of the other side came back a while ago, the rest did not
                missing = frozenset(m for m in p.remote if self.states.get(m) != ALIVE)
                out.append(self._heal(p, now, missing))
        self._refresh_stable_view()
        return out

    def next_deadline(self) -> float | None:
        """When ``tick`` next has something to decide (None: only on member changes)."""
        times: list[float] = []
        g = self._group
        if g is not None and not (self._pending(g) and self._last_tick >= g.onset + self.window):
            times.append(g.onset + self.window)  # past the window, suspicions decide
        for p in self.active.values():
            if p.returned:
                times.append(max(p.returned.values()) + self.heal_grace)
            elif self.give_up_after is not None:
                times.append(p.detected_at + self.give_up_after)
        return min(times) if times else None

    # ------------------------------------------------------------------ queries

    def unreachable(self) -> frozenset[str]:
        """Members last seen dead (not left): they may come back, and a lost member's
        routes and messages are held for them meanwhile."""
        return frozenset(m for m, s in self.states.items() if s == DEAD)

    def is_partitioned(self) -> bool:
        return bool(self.active)

    def across_partition(self, member: str) -> bool:
        """Is ``member`` on the other side of a partition that has not healed yet?"""
        return any(member in p.remote and self.states.get(member) != ALIVE for p in self.active.values())

    # ------------------------------------------------------------------ internals

    def _tracked(self, member: str) -> bool:
        g = self._group
        return (g is not None and member in g.members) or any(member in p.remote for p in self.active.values())

    def _pending(self, group: _Group) -> bool:
        return any(self.states.get(m) == SUSPECT for m in group.members)

    def _join_recent_partition(self, member: str, now: float) -> bool:
        # a member that stops answering just after a detection belongs to it (its
        # probes simply came later); the local side shrinks accordingly
        for p in self.active.values():
            if now - p.detected_at <= self.window and member in p.local:
                p.remote.add(member)
                p.local = p.local - {member}
                return True
        return False

    def _conclude(self, now: float) -> list[PartitionDetected | PartitionHealed]:
        group = self._group
        assert group is not None
        members = {m for m in group.members if self.states.get(m) in (SUSPECT, DEAD)}
        if not members:
            self._group = None
            return []
        if any(self.states[m] == SUSPECT for m in members):
            return []  # wait until the suspicions resolve (dead, or refuted)
        self._group = None
        local = frozenset(self._alive() | {self.node_id})
        self._seq += 1
        pid = f"{self.node_id}/{self._seq}"
        stable = self.stable_view | members
        p = Partition(pid, now, group.onset, local, set(members), _holds_majority(local, stable), stable)
        self.active[pid] = p
        self.detected_total += 1
        return [PartitionDetected(pid, now, group.onset, local, frozenset(members), p.majority, stable)]

    def _heal(self, p: Partition, now: float, missing: frozenset[str]) -> PartitionHealed:
        del self.active[p.id]
        self.healed_total += 1
        first = min(p.returned.values()) if p.returned else now
        return PartitionHealed(p.id, now, p.detected_at, first, frozenset(p.remote), missing)

    def _alive(self) -> set[str]:
        return {m for m, s in self.states.items() if s == ALIVE}

    def _refresh_stable_view(self) -> None:
        # the view is stable when no group is forming and nobody is suspect; members
        # lost to a partition still count (they may be the other half of the next one)
        if self._group is not None or any(s == SUSPECT for s in self.states.values()):
            return
        lost = set().union(*(p.remote for p in self.active.values())) if self.active else set()
        self.stable_view = frozenset(self._alive() | lost | {self.node_id})


def _holds_majority(local: frozenset[str], stable: frozenset[str]) -> bool:
    mine = len(local & stable)
    if 2 * mine != len(stable):
        return 2 * mine > len(stable)
    return bool(stable) and min(stable) in local


def _us(t: float) -> int:
    return int(round(t * 1_000_000))
