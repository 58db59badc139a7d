"""The cluster route table: topic filter -> nodes with at least one local subscriber.

A CRDT in which every origin node is the only writer of its own entries (EMQX's
(filter, node) routes).  Pure code: no I/O, no clocks.

Each origin numbers its changes 1, 2, 3, ... within an *epoch* (a number that grows
with every restart of that node, so a restarted node's fresh numbering is never
mistaken for old news).  A `RouteDelta` carries a contiguous run of changes.  A replica
applies changes strictly in order: a delta that leaves a gap is parked and the origin
is marked *wanted*, and the gap is closed by a `RouteSnapshot` (the origin's complete
entry set at some version) pulled by anti-entropy.  So a replica's view of an origin is
always exactly the origin's state at some version, never a mix, which makes applying
idempotent (duplicates are <= the version held), order-independent (parked deltas are
drained in order) and convergent (the newest snapshot wins).

Every replica also keeps each origin's last `DELTA_LOG` changes (the delta log), so a
gap is closed by the changes since the asker's version (`newer_than` with deltas: the
same `RouteDelta`s it missed), and a snapshot is pulled only when the log no longer
reaches back that far (or the changes would outnumber the routes). At a million
routes over 10 nodes, each gap pulled the origin's whole 100,000 routes, sorted by the
sender per answer and hashed and swapped in by the asker: the nodes spent a quarter of
their time answering such pulls, and fell behind on gossip.

`digest()` gives per origin (epoch, version, hash); two replicas with equal digests hold
equal entries, and comparing digests tells which origins a peer lacks.  The hash is an
XOR of per-filter hashes, kept incrementally.

An origin declared dead is dropped (its routes go); when it comes back, its next delta
leaves a gap (or starts a new epoch), so its entries return through a snapshot.  An
origin that became unreachable without leaving may instead be *held* (`hold_origin`):
its state goes as in a drop, but the set of its filters is kept as it was, by reference
(no copy, no trie work: a member of a 10-node mesh at a million routes holds 100,000,
and copying them into a trie of their own took every node seconds at each death), and
its plain trie entries stay, so its routes keep matching until `release_held`. A lookup
then names it (the caller holds what it matched); its shared entries are skipped by
lookups until they are gone. Whatever the trie does for a held origin's filter (a
delta, a snapshot, a slice) keeps a held plain filter in it.

Snapshots pulled by route sync can be large (a node of a 10-node cluster at a million
routes holds 100,000 of its own, about 0.8 s of trie work in one go, during which a
node's gossip cannot answer a probe). So a driver *stages* them (`stage_snapshot`) and
applies them in slices (`settle(budget)`, a bounded number of filters per call, with
the event loop free between calls): first the snapshot's hash is computed, a slice at a
time; then the origin's state is swapped in at once (so the digest never shows a mix);
then the trie follows, a slice at a time. Until it has, a filter may still route to an
origin that dropped it or not yet to one that added it (as if the snapshot came a
little later); each filter the swap changed is brought to what the state holds *when
its slice runs*, so deltas, drops and other snapshots in between keep the trie right.
A dropped origin's trie entries (and a released hold's) go the same way, a slice at a
time; until they have, lookups skip an origin that is neither held nor known again.
"""

from __future__ import annotations

import hashlib
from collections import deque
from dataclasses import dataclass, field
from itertools import islice
from typing import Collection, Iterable, Iterator, Mapping, NamedTuple, Protocol

import faults
import native
from routing.topic_index import TopicIndex
from routing.trie import TopicTrie

MAX_PARKED = 10_000
# Changes kept per origin (the delta log, see the module's docstring): a pointer each
# (the change tuples are those the deltas brought), at 10 origins 4 MB per node.
DELTA_LOG = 50_000
# A pull is answered with deltas when they reach back and number at most this many or
# at most the origin's routes (past both, its snapshot is the smaller answer).
DELTAS_ALWAYS = 1_000
# Topics whose matching remote nodes are remembered until the plain routes change: a
# publisher's topics repeat, so most publishes skip the trie walk (bounded: a stream
# of ever new topics only refills it).
MATCH_MEMO = 4096


SHARED_PREFIX = "$share/"


def split_shared(topic_filter: str) -> tuple[str | None, str]:
    """`$share/group/filter` -> (group, filter); anything else -> (None, filter).
    Route filters were validated by the codec on the node that subscribed."""
    if topic_filter.startswith("$share/"):
        _, group, real_filter = topic_filter.split("/", 2)
        return group, real_filter
    return None, topic_filter


def filter_hash(topic_filter: str) -> int:
    return int.from_bytes(hashlib.blake2b(topic_filter.encode("utf-8"), digest_size=8).digest(), "big")


@dataclass(frozen=True, slots=True)
class RouteDelta:
    """Changes `first_version`, `first_version + 1`, ... of `origin` in `epoch`:
    each change is (filter, present)."""

    origin: str
    epoch: int
    first_version: int
    changes: tuple[tuple[str, bool], ...]

    @property
    def last_version(self) -> int:
        return self.first_version + len(self.changes) - 1

    def to_wire(self) -> list[object]:
        """[origin, epoch, first version, [[filter, present], ...]]"""
        return [self.origin, self.epoch, self.first_version, [[f, p] for f, p in self.changes]]

    @classmethod
    def from_wire(cls, data: object) -> "RouteDelta":
        origin, epoch, first, changes = _fields(data, 4, "route delta")
        if not isinstance(origin, str) or not isinstance(epoch, int) or not isinstance(first, int) or first < 1:
            raise ValueError("bad route delta header")
        parsed = tuple(_change(c) for c in _sequence(changes, "route delta changes"))
        if not parsed:
            raise ValueError("empty route delta")
        return cls(origin, epoch, first, parsed)


@dataclass(frozen=True, slots=True)
class RouteSnapshot:
    """All live entries of `origin` at (`epoch`, `version`)."""

    origin: str
    epoch: int
    version: int
    filters: frozenset[str]

    def to_wire(self) -> list[object]:
        """[origin, epoch, version, [filter, ...]] (filters sorted)"""
        return [self.origin, self.epoch, self.version, sorted(self.filters)]

    @classmethod
    def from_wire(cls, data: object) -> "RouteSnapshot":
        origin, epoch, version, filters = _fields(data, 4, "route snapshot")
        if not isinstance(origin, str) or not isinstance(epoch, int) or not isinstance(version, int) or version < 0:
            raise ValueError("bad route snapshot header")
        return cls(origin, epoch, version, frozenset(str(f) for f in _sequence(filters, "route snapshot filters")))


class OriginDigest(NamedTuple):
    """One origin's entry in a digest: two replicas holding equal digests for an origin
    hold equal entries of it."""

    epoch: int
    version: int
    hash: int


Digest = dict[str, OriginDigest]


def digest_to_wire(digest: Mapping[str, OriginDigest]) -> dict[str, list[int]]:
    """{origin: [epoch, version, hash]}"""
    return {origin: list(d) for origin, d in digest.items()}


def digest_from_wire(data: object) -> Digest:
    if not isinstance(data, dict):
        raise ValueError("a route digest is a map")
    out: Digest = {}
    for origin, entry in data.items():
        epoch, version, hash_ = _fields(entry, 3, "route digest entry")
        if not (isinstance(origin, str) and isinstance(epoch, int) and isinstance(version, int) and isinstance(hash_, int)):
            raise ValueError("bad route digest entry")
        out[origin] = OriginDigest(epoch, version, hash_)
    return out


def _change(data: object) -> tuple[str, bool]:
    topic_filter, present = _fields(data, 2, "route change")
    return str(topic_filter), bool(present)


def _sequence(data: object, what: str) -> list[object] | tuple[object, ...]:
    if not isinstance(data, (list, tuple)):
        raise ValueError(f"{what}: not an array")
    return data


def _fields(data: object, n: int, what: str) -> list[object] | tuple[object, ...]:
    fields = _sequence(data, what)
    if len(fields) != n:
        raise ValueError(f"{what}: {len(fields)} fields, not {n}")
    return fields


def _new_log() -> deque[tuple[str, bool]]:
    return deque(maxlen=DELTA_LOG)


@dataclass
class _OriginState:
    epoch: int
    version: int = 0
    filters: set[str] = field(default_factory=set)
    hash: int = 0
    parked: dict[int, tuple[str, bool]] = field(default_factory=dict)  # version -> change
    # The last changes, versions `version - len(log) + 1` .. `version` (see DELTA_LOG);
    # a state taken from a snapshot starts with an empty one.
    log: deque[tuple[str, bool]] = field(default_factory=_new_log)

    def changes_since(self, version: int, limit: int | None = None) -> list[tuple[str, bool]] | None:
        """Changes `version + 1` .. `self.version` from the log (the first `limit` of
        them, when given); None if it does not reach back that far."""
        missing = self.version - version
        log = self.log
        if missing < 0 or missing > len(log):
            return None
        start = len(log) - missing
        return list(islice(log, start, None if limit is None else start + limit))

    def set(self, topic_filter: str, present: bool) -> bool:
        """Apply one change; True if it changed the entry set."""
        if present and topic_filter not in self.filters:
            self.filters.add(topic_filter)
        elif not present and topic_filter in self.filters:
            self.filters.discard(topic_filter)
        else:
            return False
        self.hash ^= filter_hash(topic_filter)
        return True


Change = tuple[str, str, bool]  # (filter, node, present): what the remote trie must do


@dataclass
class _Staged:
    """A snapshot being applied in slices: its filters hashed `hashed` at a time."""

    snap: RouteSnapshot
    filters: list[str]
    hashed: int = 0
    hash: int = 0


_NO_FILTERS: frozenset[str] = frozenset()


class PlainRoutes(Protocol):
    """What the table needs of the index of its remote plain routes (filter -> nodes)."""

    def add(self, topic_filter: str, value: str) -> bool: ...
    def remove(self, topic_filter: str, value: str) -> bool: ...
    def match(self, topic: str) -> list[str]: ...
    def values(self, topic_filter: str) -> set[str]: ...
    def filters(self) -> Iterator[str]: ...
    def node_count(self) -> int: ...
    def __len__(self) -> int: ...


def plain_routes() -> PlainRoutes:
    """`TopicIndex` when the cores run compiled: a new topic's lookup at a million routes
    within about 2x of one at a thousand, a third of the trie's memory (RESULTS.md, "New-topic
    lookup at a million routes"); `TopicTrie` in pure Python, where the index's integer
    arithmetic and vector reads are interpreted and its lookup is 3-4x slower than the trie's."""
    if native.status().compiled:
        return TopicIndex()
    return TopicTrie()


class RouteTable:
    """One replica of the cluster route table, held by node `node_id`."""

    def __init__(self, node_id: str, epoch: int) -> None:
        self.node_id = node_id
        self.local = _OriginState(epoch)
        self.remote: dict[str, _OriginState] = {}
        self.trie = plain_routes()  # remote plain routes: filter -> nodes
        # remote shared routes ($share/group/filter): real filter -> (group, node)
        self.shared_trie: TopicTrie[tuple[str, str]] = TopicTrie()
        self.wanted: set[str] = set()  # origins with a gap: need a snapshot
        self._matched: dict[str, frozenset[str]] = {}  # topic -> remote nodes (see MATCH_MEMO)
        self.dropped_parked = 0
        # Snapshots applied in slices (see the module's docstring): staged ones in the
        # order they came (only the newest of an origin counts), then the filters whose
        # trie entries must follow a swapped-in state (`_unsynced_at`: how far the
        # first list has come).
        self._staged: deque[_Staged] = deque()
        self._staged_by_origin: dict[str, _Staged] = {}
        # Deltas pulled from a peer's delta log, applied in `settle` after staged
        # snapshots (one of the same origin may be what they follow).
        self._staged_deltas: deque[RouteDelta] = deque()
        self._unsynced: deque[tuple[str, list[str], bool]] = deque()  # (origin, filters, from a drop)
        self._unsynced_at = 0
        # Origins held (see the module's docstring): their route sets as they were,
        # newest last (a member lost again before its own routes came back adds the
        # ones it had meanwhile).
        self.held: dict[str, list[set[str]]] = {}
        # Origins dropped (or released from a hold) whose trie entries are still being
        # removed: how many `_unsynced` runs of theirs are left.
        self._draining: dict[str, int] = {}
        # A held origin's last state, to take back whole if it returns (`revive`).
        self._held_states: dict[str, _OriginState] = {}

    @property
    def epoch(self) -> int:
        """This node's route epoch (one per start)."""
        return self.local.epoch

    # -------------------------------------------------------------- local routes

    def add_local(self, topic_filter: str) -> RouteDelta | None:
        return self._local_change(topic_filter, True)

    def remove_local(self, topic_filter: str) -> RouteDelta | None:
        return self._local_change(topic_filter, False)

    def _local_change(self, topic_filter: str, present: bool) -> RouteDelta | None:
        if not self.local.set(topic_filter, present):
            return None
        self.local.version += 1
        change = (topic_filter, present)
        self.local.log.append(change)
        return RouteDelta(self.node_id, self.local.epoch, self.local.version, (change,))

    def local_changes(self, changes: Iterable[tuple[str, bool]]) -> RouteDelta | None:
        """Several local changes as one delta (those that change nothing are left out)."""
        applied = [(f, p) for f, p in changes if self.local.set(f, p)]
        if not applied:
            return None
        first = self.local.version + 1
        self.local.version += len(applied)
        self.local.log.extend(applied)
        return RouteDelta(self.node_id, self.local.epoch, first, tuple(applied))

    def local_snapshot(self) -> RouteSnapshot:
        return RouteSnapshot(self.node_id, self.local.epoch, self.local.version, frozenset(self.local.filters))

    def local_filters(self) -> set[str]:
        return self.local.filters

    # ------------------------------------------------------------- remote routes

    def apply_delta(self, delta: RouteDelta) -> list[Change]:
        if delta.origin == self.node_id:
            return []
        state = self.remote.get(delta.origin)
        changes: list[Change] = []
        if state is None or delta.epoch > state.epoch:
            # A new origin, or a restarted one: its state at version 0 of this epoch is
            # empty. Changes that come before version 1 are parked until it arrives.
            # The old epoch's trie entries go a slice at a time (`settle`): a member
            # back from a restart with 100,000 routes was one step of them all.
            if state is not None:
                del self.remote[delta.origin]
                self._drain_trie(delta.origin, state.filters)
            state = self.remote[delta.origin] = _OriginState(delta.epoch)
        elif delta.epoch < state.epoch:
            return changes
        for offset, change in enumerate(delta.changes):
            version = delta.first_version + offset
            if version > state.version:
                state.parked.setdefault(version, change)
        if len(state.parked) > MAX_PARKED:
            # Too far behind: forget the parked run and rely on the snapshot.
            self.dropped_parked += len(state.parked)
            state.parked.clear()
        changes.extend(self._drain(delta.origin, state))
        if state.parked:
            self.wanted.add(delta.origin)
        return changes

    def _drain(self, origin: str, state: _OriginState) -> list[Change]:
        changes: list[Change] = []
        parked = state.parked
        # Only versions past the state's are ever parked (`apply_delta`; a snapshot
        # keeps only those past its own): no scan of them all per delta, which a node
        # far behind (10,000 parked) paid for each of hundreds of deltas in a row.
        log = state.log
        while state.version + 1 in parked:
            state.version += 1
            change = parked.pop(state.version)
            log.append(change)
            topic_filter, present = change
            if faults.FORGET_ROUTE and present:
                continue  # BUGGIFY: the version advances, the route is never added
            if state.set(topic_filter, present):
                changes.append(self._trie_change(topic_filter, origin, present))
        if not parked:
            self.wanted.discard(origin)
        return changes

    def apply_snapshot(self, snap: RouteSnapshot) -> list[Change]:
        """Take a snapshot if it is newer than what this replica holds."""
        if snap.origin == self.node_id:
            return []
        state = self.remote.get(snap.origin)
        if state is not None and (snap.epoch, snap.version) <= (state.epoch, state.version):
            return []
        changes: list[Change] = []
        old = state.filters if state is not None else set()
        parked = state.parked if state is not None and state.epoch == snap.epoch else {}
        new_state = _OriginState(snap.epoch, snap.version)
        for f in snap.filters:
            new_state.set(f, True)
        for f in old - snap.filters:
            changes.append(self._trie_change(f, snap.origin, False))
        for f in snap.filters - old:
            changes.append(self._trie_change(f, snap.origin, True))
        new_state.parked = {v: c for v, c in parked.items() if v > snap.version}
        self.remote[snap.origin] = new_state
        changes.extend(self._drain(snap.origin, new_state))
        return changes

    # ------------------------------------------------ snapshots in slices

    def stage_snapshot(self, snap: RouteSnapshot) -> bool:
        """Queue a snapshot for `settle` if it is newer than what this replica holds or
        has staged of its origin; False if it is not (nothing to do)."""
        if snap.origin == self.node_id:
            return False
        held = self._newest(snap.origin)
        if held is not None and (snap.epoch, snap.version) <= held:
            return False
        staged = _Staged(snap, list(snap.filters))
        self._staged_by_origin[snap.origin] = staged  # an older one staged is skipped
        self._staged.append(staged)
        return True

    def stage_delta(self, delta: RouteDelta) -> bool:
        """Queue a pulled delta for `settle` if it brings something newer than what this
        replica holds of its origin in the same epoch; False if not (nothing to do)."""
        if delta.origin == self.node_id:
            return False
        held = self._newest(delta.origin)
        if held is None or delta.epoch != held[0] or delta.last_version <= held[1]:
            return False
        self._staged_deltas.append(delta)
        return True

    @property
    def unsettled(self) -> bool:
        """Whether staged snapshots, deltas or trie entries still wait for `settle`."""
        return bool(self._staged or self._unsynced or self._staged_deltas)

    def settle(self, budget: int) -> bool:
        """Do about `budget` filters' worth of the staged work (trie entries first,
        then hashing the next snapshot); True while some is left."""
        while budget > 0:
            if self._unsynced:
                budget -= self._sync_trie(budget)
            elif self._staged:
                staged = self._staged[0]
                if self._staged_by_origin.get(staged.snap.origin) is not staged:
                    self._staged.popleft()  # superseded by a newer one, or its origin dropped
                    continue
                filters = staged.filters
                end = min(len(filters), staged.hashed + budget)
                h = staged.hash
                for i in range(staged.hashed, end):
                    h ^= filter_hash(filters[i])
                budget -= end - staged.hashed + 1
                staged.hash, staged.hashed = h, end
                if end == len(filters):
                    self._staged.popleft()
                    del self._staged_by_origin[staged.snap.origin]
                    self._swap_in(staged)
            elif self._staged_deltas:
                delta = self._staged_deltas.popleft()
                budget -= len(delta.changes) + 1
                # Only onto a state of its origin held now: one dropped or held dead
                # meanwhile is not brought back by a delta (its next pull mends it).
                if delta.origin in self.remote:
                    self.apply_delta(delta)
            else:
                break
        return self.unsettled

    def _sync_trie(self, budget: int) -> int:
        """Bring the next `budget` unsynced filters' trie entries to what their origin's
        state holds now; returns how many were looked at."""
        origin, filters, dropped = self._unsynced[0]
        start = self._unsynced_at
        end = min(len(filters), start + budget)
        state = self.remote.get(origin)
        live: set[str] | frozenset[str] = state.filters if state is not None else _NO_FILTERS
        for i in range(start, end):
            f = filters[i]
            self._trie_change(f, origin, f in live)  # add and remove are idempotent (and keep what is held)
        if end == len(filters):
            self._unsynced.popleft()
            self._unsynced_at = 0
            if dropped:
                left = self._draining[origin] - 1
                if left:
                    self._draining[origin] = left
                else:
                    del self._draining[origin]
        else:
            self._unsynced_at = end
        return end - start + 1

    def _swap_in(self, staged: _Staged) -> None:
        """A staged snapshot, hashed: its state replaces the origin's at once (if it is
        still newer); the trie entries it changes are left to `_sync_trie`."""
        snap = staged.snap
        state = self.remote.get(snap.origin)
        if state is not None and (snap.epoch, snap.version) <= (state.epoch, state.version):
            return
        old: set[str] | frozenset[str] = state.filters if state is not None else _NO_FILTERS
        new_state = _OriginState(snap.epoch, snap.version, set(snap.filters), staged.hash)
        if state is not None and state.epoch == snap.epoch:
            new_state.parked = {v: c for v, c in state.parked.items() if v > snap.version}
        self.remote[snap.origin] = new_state
        changed = list(old ^ new_state.filters)
        if changed:
            self._unsynced.append((snap.origin, changed, False))
        self._drain(snap.origin, new_state)

    def _newest(self, origin: str) -> tuple[int, int] | None:
        """(epoch, version) of the newest state of `origin` held or staged."""
        state = self.remote.get(origin)
        held = (state.epoch, state.version) if state is not None else None
        staged = self._staged_by_origin.get(origin)
        if staged is not None and (held is None or (staged.snap.epoch, staged.snap.version) > held):
            return (staged.snap.epoch, staged.snap.version)
        return held

    def drop_origin(self, origin: str) -> int:
        """The origin was declared dead or left: its routes go until it returns. Its
        trie entries go a slice at a time (`settle`); returns how many it had."""
        self.wanted.discard(origin)
        self._staged_by_origin.pop(origin, None)
        self._held_states.pop(origin, None)
        state = self.remote.pop(origin, None)
        self._unsynced_drain(origin)
        if state is None:
            return 0
        self._drain_trie(origin, state.filters)
        return len(state.filters)

    def _unsynced_drain(self, origin: str) -> None:
        """Trie entries of `origin` still to follow a swapped-in state now follow a
        drop: lookups skip the origin until they are gone (a snapshot swapped in with
        fewer filters, then the origin dropped before its slices ran, left it named by
        lookups while neither held nor known)."""
        runs = sum(1 for o, _, dropped in self._unsynced if o == origin and not dropped)
        if not runs:
            return
        self._unsynced = deque((o, f, dropped or o == origin) for o, f, dropped in self._unsynced)
        self._draining[origin] = self._draining.get(origin, 0) + runs
        self._matched = {}

    def _drain_trie(self, origin: str, filters: set[str]) -> None:
        """Queue `filters` of an origin no longer routed by them for `settle`."""
        if not filters:
            return
        self._matched = {}  # lookups skip the origin from now on (`match_nodes`)
        self._unsynced.append((origin, list(filters), True))
        self._draining[origin] = self._draining.get(origin, 0) + 1

    def hold_origin(self, origin: str) -> bool:
        """The origin became unreachable without leaving: its state goes as in
        `drop_origin`, but its plain routes keep routing, by reference (see the
        module's docstring), until `release_held`. False (and dropped as usual) when
        it has no plain route held."""
        sets = self.held.get(origin)
        state = self.remote.get(origin)
        if sets is None and (state is None or all(f.startswith(SHARED_PREFIX) for f in state.filters)):
            self.drop_origin(origin)
            return False
        self.wanted.discard(origin)
        self._staged_by_origin.pop(origin, None)
        if sets is None:
            sets = self.held[origin] = []
        if state is not None:
            del self.remote[origin]
            self._held_states[origin] = state
            if state.filters:
                sets.append(state.filters)
        return True

    def revive(self, origin: str) -> bool:
        """A held origin is reachable again: its last state is its state again, at
        once (the trie has its entries: its plain ones were held, its shared ones
        stayed). A pull then brings what it changed since, as for any origin behind;
        a member declared dead while it was only slow (a loaded machine) costs no
        table copy when it returns. False if there is no such state to take back."""
        if origin in self.remote or origin not in self.held:
            return False
        state = self._held_states.pop(origin, None)
        if state is None:
            return False
        self.remote[origin] = state
        self._matched = {}
        if state.parked:
            self.wanted.add(origin)
        return True

    def restore_held(self, origin: str, filters: Iterable[str]) -> None:
        """Routes held for `origin` before a restart (from the store), into the trie."""
        kept = set(filters)
        self.held.setdefault(origin, []).append(kept)
        for f in kept:
            if not f.startswith(SHARED_PREFIX):
                self._trie_change(f, origin, True)

    def release_held(self, origin: str) -> None:
        """The origin's held routes stop routing (its own are back, it left, or the
        hold period ended): their trie entries follow its state, a slice at a time."""
        sets = self.held.pop(origin, None)
        self._held_states.pop(origin, None)
        if sets is None:
            return
        state = self.remote.get(origin)
        for filters in sets:
            # What its own state holds has its entries by the state's own changes: a
            # member back with the same 100,000 routes releases none of them.
            self._drain_trie(origin, filters - state.filters if state is not None else filters)

    def held_filters(self, origin: str) -> list[str]:
        """Every filter held for `origin` (shared ones too: they are never held)."""
        sets = self.held.get(origin, [])
        if len(sets) == 1:
            return list(sets[0])
        return list(set().union(*sets))

    def _is_held(self, origin: str, topic_filter: str) -> bool:
        sets = self.held.get(origin)
        if sets is None or topic_filter.startswith(SHARED_PREFIX):
            return False
        for filters in sets:
            if topic_filter in filters:
                return True
        return False

    def _drop(self, origin: str) -> list[Change]:
        state = self.remote.pop(origin, None)
        if state is None:
            return []
        return [self._trie_change(f, origin, False) for f in state.filters]

    def _trie_change(self, topic_filter: str, origin: str, present: bool) -> Change:
        group, real_filter = split_shared(topic_filter)
        if group is None:
            if self._matched:
                self._matched = {}
            if present or (self.held and self._is_held(origin, topic_filter)):
                self.trie.add(topic_filter, origin)
            else:
                self.trie.remove(topic_filter, origin)
        elif present:
            self.shared_trie.add(real_filter, (group, origin))
        else:
            self.shared_trie.remove(real_filter, (group, origin))
        return (topic_filter, origin, present)

    # ------------------------------------------------------------ anti-entropy

    def digest(self) -> Digest:
        """origin -> (epoch, version, hash) for every origin held, this node included."""
        out = {origin: OriginDigest(s.epoch, s.version, s.hash) for origin, s in self.remote.items()}
        out[self.node_id] = OriginDigest(self.local.epoch, self.local.version, self.local.hash)
        return out

    def snapshots_newer_than(self, peer_digest: Mapping[str, OriginDigest], max_filters: int | None = None,
                             origins: Collection[str] | None = None) -> tuple[list[RouteSnapshot], bool]:
        """What a peer with `peer_digest` lacks (of `origins` only, when given):
        snapshots of origins we hold newer, and whether some were left out to keep the
        answer under `max_filters` filters (at least one snapshot goes, whatever its
        size: a snapshot is never split)."""
        snaps, _, more = self.newer_than(peer_digest, max_filters, origins, delta_piece=0)
        return snaps, more

    def newer_than(self, peer_digest: Mapping[str, OriginDigest], max_filters: int | None = None,
                   origins: Collection[str] | None = None, delta_piece: int = 0,
                   max_changes: int | None = None) -> tuple[list[RouteSnapshot], list[RouteDelta], bool]:
        """`snapshots_newer_than`, but with `delta_piece` > 0, an origin the peer holds
        in the same epoch at a version our delta log reaches back to comes as the
        changes it lacks (deltas of at most `delta_piece` changes each), not whole;
        changes count as filters against `max_filters`, and at most `max_changes` go
        (a run of changes may be cut: the answer then says there is more, and the
        peer asks again from where it got to)."""
        snaps: list[RouteSnapshot] = []
        deltas: list[RouteDelta] = []
        filters = changed = 0
        for origin, (epoch, version, _) in self.digest().items():
            if origins is not None and origin not in origins:
                continue
            theirs = peer_digest.get(origin)
            if theirs is not None and (epoch, version) <= (theirs.epoch, theirs.version):
                continue
            state = self.local if origin == self.node_id else self.remote[origin]
            size = len(state.filters)
            missing = None
            if delta_piece > 0 and theirs is not None and theirs.epoch == epoch:
                missing = version - theirs.version
                if missing > len(state.log) or missing > max(DELTAS_ALWAYS, size):
                    missing = None  # out of the log's reach, or the snapshot is the smaller answer
            if missing is None:
                if (snaps or deltas) and max_filters is not None and filters + size > max_filters:
                    return snaps, deltas, True
                filters += size
                snaps.append(self.snapshot_of(origin))
                continue
            room = missing
            if max_filters is not None:
                room = min(room, max_filters - filters)
            if max_changes is not None:
                room = min(room, max_changes - changed)
            if room <= 0:
                return snaps, deltas, True
            assert theirs is not None
            changes = state.changes_since(theirs.version, room)
            assert changes is not None
            filters += room
            changed += room
            first = theirs.version + 1
            for at in range(0, room, delta_piece):
                deltas.append(RouteDelta(origin, epoch, first + at, tuple(changes[at:at + delta_piece])))
            if room < missing:
                return snaps, deltas, True
        return snaps, deltas, False

    def pull_digest(self) -> Digest:
        """The digest to pull with: staged snapshots count as held, so the peer does not
        send them again (its answer reads only epochs and versions)."""
        out = self.digest()
        for origin, staged in self._staged_by_origin.items():
            snap = staged.snap
            held = out.get(origin)
            if held is None or (snap.epoch, snap.version) > (held.epoch, held.version):
                out[origin] = OriginDigest(snap.epoch, snap.version, 0)
        for delta in self._staged_deltas:  # in the order they will be applied
            held = out.get(delta.origin)
            if (held is not None and delta.epoch == held.epoch
                    and delta.first_version <= held.version + 1 <= delta.last_version):
                out[delta.origin] = OriginDigest(delta.epoch, delta.last_version, 0)
        return out

    def behind(self, peer_digest: Mapping[str, OriginDigest]) -> list[str]:
        """Origins (other than this node) of which a peer holds a newer state than we
        do (or have staged)."""
        mine = self.pull_digest()
        out = []
        for origin, theirs in peer_digest.items():
            held = mine.get(origin)
            if origin != self.node_id and (held is None or (theirs.epoch, theirs.version) > (held.epoch, held.version)):
                out.append(origin)
        return out

    def snapshot_of(self, origin: str) -> RouteSnapshot:
        if origin == self.node_id:
            return self.local_snapshot()
        s = self.remote[origin]
        return RouteSnapshot(origin, s.epoch, s.version, frozenset(s.filters))

    # -------------------------------------------------------------- lookups

    def match_nodes(self, topic: str) -> frozenset[str]:
        """Remote nodes with a route matching `topic` (a trie walk, not a scan; the
        answer is remembered until the plain routes change)."""
        nodes = self._matched.get(topic)
        if nodes is None:
            nodes = frozenset(self.trie.match(topic))
            if self._draining:
                nodes = self._routed(nodes)
            if len(self._matched) >= MATCH_MEMO:
                self._matched = {}
            self._matched[topic] = nodes
        return nodes

    def _routed(self, nodes: frozenset[str]) -> frozenset[str]:
        """`nodes` less the dropped origins whose trie entries are not all gone yet."""
        draining = self._draining
        remote = self.remote
        held = self.held
        return frozenset(n for n in nodes if n not in draining or n in remote or n in held)

    def match_shared(self, topic: str) -> dict[tuple[str, str], set[str]]:
        """(group, real filter) -> remote nodes with members of that shared subscription."""
        out: dict[tuple[str, str], set[str]] = {}
        stale = self.held or self._draining
        for real_filter, pairs in self.shared_trie.match_filters(topic):
            for group, origin in pairs:
                if stale and not self._live(origin, f"{SHARED_PREFIX}{group}/{real_filter}"):
                    continue
                out.setdefault((group, real_filter), set()).add(origin)
        return out

    def _live(self, origin: str, topic_filter: str) -> bool:
        """Whether a trie entry is the origin's own route: not one left of a dropped
        state or a hold (only the plain entries of a hold route)."""
        if origin not in self.held and origin not in self._draining:
            return True
        state = self.remote.get(origin)
        return state is not None and topic_filter in state.filters

    def has_route(self, origin: str, topic_filter: str) -> bool:
        """Whether `origin` has the plain route `topic_filter` in this replica (its
        own: not one held for it)."""
        if self.held or self._draining:
            return self._live(origin, topic_filter) and origin in self.trie.values(topic_filter)
        return origin in self.trie.values(topic_filter)

    def routes(self) -> dict[str, set[str]]:
        """filter -> nodes, this node included: the whole cluster table."""
        out: dict[str, set[str]] = {}
        for f in self.local.filters:
            out.setdefault(f, set()).add(self.node_id)
        for origin, s in self.remote.items():
            for f in s.filters:
                out.setdefault(f, set()).add(origin)
        return out

    def origins(self) -> Iterator[str]:
        return iter(self.remote)

    def route_count(self) -> int:
        return len(self.local.filters) + sum(len(s.filters) for s in self.remote.values())
