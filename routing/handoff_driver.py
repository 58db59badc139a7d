"""The Trio driver of session handoff and of the ownership register.

Runs `session_store.handoff` over the mesh links (`MeshRequests`, which the cluster
answers) and `session_store.ownership` over gossip (`own` broadcasts, `owners`
push-pull).  The connection calls `prepare_connect` (through `routing.port.MeshPort`)
before it opens a session; the cluster hands the `ho_*` requests of peers to `answer`.
It reaches the broker only through `SessionHost` and reads the time only from its
`clock.Clock` (`now()` for takeover budgets, `wall()` for claims and traces).

Every step has a timeout (`STEP_TIMEOUT`) and the whole takeover a budget
(`TAKEOVER_BUDGET`, below the CONNECT timeout), so a client never hangs on a dead or
partitioned owner: the taker goes on with the newest copy it has (none: a new session,
CONNACK session present = 0), counts a conflict and traces it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Iterable, Mapping, Protocol

import trio

import faults
from clock import Clock
from clock.hlc import HlcTimestamp
from oplog import Event, log_event
from routing.links import Fields, Frame, Reply
from routing.moved import (
    MOVED_META, RELAYED_META, TAKEN_META, Moved, SentTo, TakenIn, marks_from_wire, sent_to_from_wire, sent_to_wire,
)
from routing.trie import TopicTrie
from session_store.handoff import (
    REMEMBERED, Ask, Finished, Giving, HandoffError, Install, MergeTail, Redirect, Refused, Step, Takeover,
    delivery_from_wire, image_of, merge_stale, merge_tail, message_key, queue_chunk, remembered_to_wire,
    stored_from_image,
)
from session_store.model import Delivery, Message, Session, SubscriptionOptions
from session_store.ownership import Claim, OwnershipRegister
from session_store.store import StoredSession

from gossip.trace import Tracer

log = logging.getLogger("meshd.handoff")

STEP_TIMEOUT = 2.0
TAKEOVER_BUDGET = 5.0
FENCE_TIMEOUT = 1.0  # a member that cannot answer in time is most likely unreachable: its copies cannot race us
GIVE_TIMEOUT = 15.0  # a giver that hears nothing more keeps serving its copy
MOVED_MEMORY = 60.0  # how long a giver remembers where a session went, at the least
MAX_REDIRECTS = 3
HOUSEKEEPING_INTERVAL = 2.0
REMEMBER_FOR = 24 * 3600.0  # how long a session started in a conflict remembers what it got
REMEMBER_UNTIL_META = "remuntil/"  # meta keys: remuntil/<client id> -> until when its session remembers (wall s)
PUSH_GRACE_MS = 2000  # a copy held for another owner waits this long for a takeover first


class ClaimGossip(Protocol):
    """What the ownership register needs of gossip: its `own` broadcasts, the `owners`
    push-pull state, and who is reachable."""

    def broadcast(self, kind: str, key: str, payload: object) -> None: ...

    def on_broadcast(self, kind: str, handler: Callable[[str, object], None]) -> None: ...

    def register_push_pull(self, name: str, get_local: Callable[[], object],
                           merge_remote: Callable[[object], None]) -> None: ...

    def alive_members(self) -> list[str]: ...

    def has_peers(self) -> bool: ...


class SessionHost(Protocol):
    """What the handoff driver reads and changes in this node's broker."""

    @property
    def sessions(self) -> dict[str, Session]: ...

    @property
    def connections(self) -> Mapping[str, object]: ...

    @property
    def remembered(self) -> dict[str, set[tuple[str | None, int]]]: ...

    @property
    def expired_while_down(self) -> dict[str, float]: ...

    def detach_for_handoff(self, client_id: str, now: float) -> Session | None: ...

    def discard_session(self, client_id: str, now: float) -> None: ...

    def install_session(self, stored: StoredSession, now: float) -> Session: ...

    def merge_handed_tail(self, session: Session, add: list[Delivery], drop: list[Delivery]) -> None: ...

    def merge_session(self, stored: StoredSession, now: float, *, ahead_of: int | None = None) -> int: ...

    def remember(self, client_id: str, keys: Iterable[tuple[str | None, int]], *, taken_from: str | None = None) -> None: ...

    def forget_remembered(self, client_id: str) -> None: ...

    def taken_from(self, client_id: str) -> str | None: ...


class MetaNotes(Protocol):
    """The part of the store where the giver keeps what it handed over (so a restart
    still relays what reaches it late)."""

    def put_meta(self, key: str, value: object) -> None: ...

    def delete_meta(self, key: str) -> None: ...


class MeshRequests(Protocol):
    """What the handoff driver asks of the cluster: requests over the mesh links, route
    snapshots for the fences, and the store's durability."""

    async def ask(self, peer: str, frame_type: str, fields: Fields, timeout: float) -> Frame: ...

    def tell(self, peer: str, frame_type: str, fields: Fields) -> None: ...

    async def drain_link(self, peer: str, timeout: float) -> bool: ...

    async def wait_durable(self) -> None: ...

    def flush_routes_now(self) -> None: ...

    def forward_mark(self) -> int: ...

    def own_route_snapshot(self) -> list[object]: ...

    def take_route_snapshot(self, wire: object, sender: str | None = None) -> None: ...


class HeldSource(Protocol):
    """What this node owes an unreachable member (`routing.cluster.Cluster`)."""

    def held_messages(self, member: str) -> list[Message]: ...


class ReplicaSource(Protocol):
    """Session replication (`replication.service`): where a session whose owner cannot
    hand it over is taken from instead (the newest copy on a live replica)."""

    def use_claims(self, claims: OwnershipRegister) -> None: ...

    def use_held(self, held: HeldSource) -> None: ...

    async def copy_for_takeover(self, client_id: str, owner: str) -> StoredSession | None: ...

    async def unclaimed_copy_owner(self, client_id: str) -> str | None: ...

    def claim_of_copy(self, client_id: str) -> Claim | None: ...

    async def held_for(self, client_id: str, owner: str, subscriptions: Mapping[str, SubscriptionOptions]) -> list[Delivery]: ...

    def taken_over(self, client_id: str, owner: str, *, direct_from: int | None = None) -> None: ...


class _Superseded(Exception):
    """A newer CONNECT for the same client id won while this takeover ran."""


@dataclass
class _Taking:
    claim: Claim
    scope: trio.CancelScope
    superseded: bool = False
    session: Session | None = None  # installed here, not yet complete
    # Members whose copy is stale (they sent this node to the node that claimed the
    # client after them, `claimer`): a fallback is against the claimer, and their
    # copies are merged after its copy (`TakenIn.stale`).
    stale: set[str] = field(default_factory=set)
    claimer: str | None = None


@dataclass
class HandoffStats:
    taken: int = 0  # sessions handed over to this node
    given: int = 0  # sessions this node handed over
    failed: int = 0  # takeovers that fell back to a local copy (owner unreachable, errors)
    superseded: int = 0  # CONNECTs closed with 0x8E because a newer one won elsewhere
    kicked: int = 0  # local connections closed because a newer CONNECT claimed the id
    merged_out: int = 0  # copies pushed to their owner and merged there (conflicts resolved)
    merged_in: int = 0  # copies from other nodes merged into sessions owned here
    from_replica: int = 0  # sessions taken over from a replica (their owner could not hand them over)
    durations_ms: list[float] = field(default_factory=list)  # the last takeovers, for /metrics


class Handoffs:
    def __init__(self, *, node_id: str, broker: SessionHost, gossip: ClaimGossip, cluster: MeshRequests,
                 trace: Tracer, clock: Clock, notes: MetaNotes | None = None, moved_memory: float = MOVED_MEMORY,
                 recovered_meta: Mapping[str, object] | None = None, replicas: ReplicaSource | None = None) -> None:
        self.node_id = node_id
        self.broker = broker
        self.gossip = gossip
        self.cluster = cluster
        self.trace = trace
        self.clock = clock
        self.register = OwnershipRegister(node_id)
        self.replicas = replicas
        if replicas is not None:
            replicas.use_claims(self.register)
        self.giving: dict[str, Giving] = {}
        self.taking: dict[str, _Taking] = {}
        self.notes = notes
        # Sessions handed over, remembered as long as a forward sent here before the
        # handoff can still arrive (held for this node through a netsplit, or stuck in
        # a link): what matches their filters is relayed to the taker.
        self.moved_memory = max(moved_memory, MOVED_MEMORY)
        self.moved: dict[str, Moved] = {}
        self._moved_filters: TopicTrie[str] = TopicTrie()
        self.relayed = 0  # late forwards relayed to the node a session moved to
        self._relayed_to: dict[str, SentTo] = {}  # per copy of relayed messages here: where each had gone
        self.taken_in: dict[str, TakenIn] = {}
        self.skipped = 0  # late forwards not delivered to a session taken over here (its giver had them)
        self._late_fencing: set[tuple[str, str]] = set()
        self._locks: dict[str, trio.Lock] = {}
        self._pushing: set[str] = set()
        self._claimed_since_ms: dict[str, int] = {}  # see `_note_claim_run`
        self._remember_until: dict[str, float] = {}
        self._incoming: dict[tuple[str, str], tuple[object, list[Delivery]]] = {}
        self._nursery: trio.Nursery | None = None
        self.stats = HandoffStats()
        self.malformed = 0
        gossip.on_broadcast("own", self._on_claim_broadcast)
        gossip.register_push_pull("owners", self._owners_state, self._merge_owners)
        for key, value in (recovered_meta or {}).items():
            try:
                if key.startswith(MOVED_META):
                    self._note_moved(key[len(MOVED_META):], Moved.from_record(key[len(MOVED_META):], value))
                elif key.startswith(TAKEN_META):
                    self.taken_in[key[len(TAKEN_META):]] = TakenIn.from_record(value)
                elif key.startswith(REMEMBER_UNTIL_META) and isinstance(value, (int, float)):
                    self._remember_until[key[len(REMEMBER_UNTIL_META):]] = float(value)
                elif key.startswith(RELAYED_META):
                    self._relayed_to[key[len(RELAYED_META):]] = sent_to_from_wire(value)
            except (KeyError, TypeError, ValueError):
                log.error("ignoring a stored handoff record %s", key)
        for cid in self.broker.remembered:
            self._remember_until.setdefault(cid, self.clock.wall() + self.moved_memory)

    async def run(self) -> None:
        """Housekeeping: givers that timed out, old tombstones, old `moved` notes, and
        copies of sessions another node owns, pushed there to be merged."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            while True:
                await trio.sleep(HOUSEKEEPING_INTERVAL)
                self.housekeeping(self.clock.wall())
                self._push_foreign_copies()
                self._fence_late()

    def housekeeping(self, now: float) -> None:
        for cid, giving in list(self.giving.items()):
            if now - giving.started > GIVE_TIMEOUT or (giving.commit_seq is None and now - giving.started > TAKEOVER_BUDGET + 1.0):
                # Uncommitted past the taker's whole budget: it gave up (a fallback);
                # the copy is pushed to it if it claimed the client after all.
                del self.giving[cid]
                log.warning("handoff of %s to %s timed out; keeping the session here", cid, giving.taker)
        for cid, moved in list(self.moved.items()):
            if now - moved.at > self.moved_memory:
                self._forget_moved(cid)
        for cid, taken in list(self.taken_in.items()):
            if (now - taken.at > self.moved_memory or cid not in self.broker.sessions) and cid not in self.taking:
                self._forget_taken(cid)
        self.register.prune(int(now * 1000))
        alive = set(self.gossip.alive_members())
        for key in [k for k in self._incoming if k[0] not in alive]:
            del self._incoming[key]  # a push cut off midway: it starts over when the peer is back
        for cid, until in list(self._remember_until.items()):
            if now > until or cid not in self.broker.sessions:
                self._stop_remembering(cid)
        for cid in [c for c in self._relayed_to if c not in self.broker.sessions]:
            self._forget_relayed_to(cid)

    def claimed_elsewhere(self, client_id: str, before: float) -> bool:
        """Whether another node claimed the client id (not clean) before `before`
        (wall s): a copy held here is its client's session resumed there."""
        claim = self.register.get(client_id)
        return (claim is not None and claim.owner not in (None, self.node_id) and not claim.clean
                and self._claim_since(claim) <= before * 1000)

    def _note_claim_run(self, before: Claim | None, claim: Claim) -> None:
        """A claim elsewhere that follows another claim elsewhere, neither clean and no
        release between (a session that ends releases its claim), goes on with the
        session the first one resumed: the client came back to that owner, or another
        node took the session from it.  So the client has been claimed elsewhere since
        the first of them.  Without this a copy kept here past its expiry, whose client
        had resumed it elsewhere in time, took a later claim for a new session and was
        never pushed there (seeds 4440 and 5796 of 3 nodes, 6 clients, 15 s)."""
        cid = claim.client_id
        if (before is None or claim.owner in (None, self.node_id) or claim.clean or before.clean
                or before.owner in (None, self.node_id)):
            self._claimed_since_ms.pop(cid, None)
        else:
            self._claimed_since_ms.setdefault(cid, before.stamp.wall_ms)

    def _claim_since(self, claim: Claim) -> int:
        """Wall ms since when the claim's owner has held the client's session, as seen here."""
        return min(self._claimed_since_ms.get(claim.client_id, claim.stamp.wall_ms), claim.stamp.wall_ms)

    def _wall_ms(self) -> int:
        return int(self.clock.wall() * 1000)

    def _wall_us(self) -> int:
        return int(self.clock.wall() * 1_000_000)

    # ------------------------------------------------------------ ownership

    def _peers(self) -> bool:
        return self.gossip.has_peers()

    def connect_is_local(self, client_id: str, clean_start: bool, persistent: bool) -> bool:
        """Whether `prepare_connect` would return 'ok' at once, changing nothing: a
        clean session on a node with no live peer and no CONNECT of that id under way.
        The connection answers such a CONNECT without awaiting anything."""
        return clean_start and not persistent and client_id not in self._locks and not self._peers()

    def _announce(self, claim: Claim) -> None:
        if self._peers():
            # Keyed by client id *and* this node: gossip lets a broadcast replace an older
            # one of the same key, judged by when it was sent, not by the claims' HLC.
            # One key for every node let a claim that loses by HLC, sent a little later
            # (a slower wall clock), stop the winning claim from spreading.
            self.gossip.broadcast("own", f"{claim.client_id}/{self.node_id}", claim.to_wire())

    def session_ended(self, client_id: str) -> None:
        if client_id in self.register.claims:
            claim = self.register.release(client_id, self._wall_ms())
            self._claimed_since_ms.pop(client_id, None)
            if claim is not None:
                self._announce(claim)

    def _on_claim_broadcast(self, origin: str, payload: object) -> None:
        try:
            claim = Claim.from_wire(payload)
        except (TypeError, ValueError) as exc:
            self.malformed += 1
            log.warning("dropping a malformed ownership claim from %s: %s", origin, exc)
            return
        self._take_claim(claim)

    def _owners_state(self) -> object:
        return self.register.to_wire()

    def _merge_owners(self, state: object) -> None:
        try:
            claims = OwnershipRegister.claims_from_wire(state)
        except (TypeError, ValueError) as exc:
            self.malformed += 1
            log.warning("dropping malformed ownership state: %s", exc)
            return
        for claim in claims:
            self._take_claim(claim)

    def _take_claim(self, claim: Claim) -> None:
        before = self.register.get(claim.client_id)
        if not self.register.merge(claim, self._wall_ms()):
            return
        self._note_claim_run(before, claim)
        if claim.owner in (None, self.node_id):
            return
        cid = claim.client_id
        taking = self.taking.get(cid)
        if taking is not None and claim.stamp > taking.claim.stamp:
            taking.superseded = True
            taking.scope.cancel()
        if cid in self.broker.connections:
            # A newer CONNECT elsewhere: this connection is taken over (0x8E).
            self.stats.kicked += 1
            log.info("%s connected at %s: closing its connection here (session taken over)", cid, claim.owner)
            self.broker.detach_for_handoff(cid, self.clock.wall())
        if claim.clean and cid not in self.giving:
            # Clean start elsewhere: whatever this node kept for the client is void.
            self.broker.discard_session(cid, self.clock.wall())
            self._forget_moved(cid)

    # ------------------------------------------------------------ the taker

    async def prepare_connect(self, client_id: str, clean_start: bool, persistent: bool) -> str:
        """Before a CONNECT opens its session here: claim the client id, and when the
        session lives on another node, take it over.  'ok' to go on; 'superseded' when
        a newer CONNECT elsewhere won (close this one with 0x8E)."""
        if self.connect_is_local(client_id, clean_start, persistent):
            return "ok"  # a lone node keeps no claims for clean sessions: the fast path
        lock = self._locks.get(client_id)
        if lock is None:
            lock = self._locks[client_id] = trio.Lock()
        try:
            async with lock:
                return await self._prepare(client_id, clean_start, persistent)
        finally:
            if not lock.locked() and lock.statistics().tasks_waiting == 0:
                self._locks.pop(client_id, None)

    async def _prepare(self, client_id: str, clean_start: bool, persistent: bool) -> str:
        if not clean_start and self.replicas is not None:
            # The claim of the owner whose copy this node holds, when its broadcast did not
            # come: that owner is alive, and taking its copy here as the session's would
            # leave out what it was given (simulator seed 413 of 5 nodes, 20 clients, 60 s,
            # 2 replicas, a crash: n0 took s0 from n4's copy after s0's owner n1 died;
            # n4 missed n0's claim, took s0 from its copy of n0's as from dead n1's when
            # the client came, and a message s0 had taken on n0 went again without DUP).
            seen = self.replicas.claim_of_copy(client_id)
            if seen is not None:
                self._take_claim(seen)
        previous = self.register.get(client_id)
        expired_at = self.broker.expired_while_down.get(client_id)
        if expired_at is not None and not self.claimed_elsewhere(client_id, expired_at):
            # A copy kept past its expiry, which no resume elsewhere claimed in time:
            # its session ended; it is no part of the one this CONNECT opens or takes.
            self.broker.discard_session(client_id, self.clock.wall())
        giving = self.giving.pop(client_id, None)
        if giving is not None and giving.commit_seq is not None:
            # Committed: the taker holds everything and its `ho_done` is on its way;
            # the copy here is stale, and the session is fetched from whoever owns it now.
            # Before this node claims the client: discarding the copy after the claim
            # released it, and the taker, told of that release, refused the takeover
            # as superseded (simulator seed 20068 of 3 nodes, 6 clients, 15 s: the
            # CONNECT closed with 0x8E, no SUBACK).  Its `ho_done` has not come, though:
            # the taker may have stopped (died) before it merged the commit's chunk,
            # so what was queued here goes to it as a late relay too, not only what
            # came after the commit (simulator seed 139 of 5 nodes, 20 clients, 60 s:
            # the taker died before its `ho_done`, and the messages of the commit's
            # chunk, held nowhere else, were lost with the copy discarded here).
            self._handed_over(client_id, giving.taker, self.clock.wall(), giving.commit_seq, giving.fenced,
                              unconfirmed=True)
        elif giving is not None:
            log.info("%s came back here: handoff to %s abandoned", client_id, giving.taker)
        claim = self.register.claim(client_id, self._wall_ms(), clean=clean_start)
        self._claimed_since_ms.pop(client_id, None)  # this node's claim ends another's run
        self._announce(claim)
        # The session is this node's again: nothing is relayed for it any more (a copy
        # relayed meanwhile is merged into it as the copy held here).
        self._forget_moved(client_id)
        self._forget_relayed_to(client_id)
        owner = previous.owner if previous is not None else None
        if previous is None and not clean_start and self.replicas is not None:
            # No claim known here: its owner may have died before the claim spread,
            # while a replica holds the session's copy (README "Session replication").
            owner = await self.replicas.unclaimed_copy_owner(client_id)
        if clean_start or owner is None or owner == self.node_id:
            return "ok"
        if owner not in self.gossip.alive_members():
            await self._replica_or_fallback(client_id, owner, "owner unreachable")
            return "ok"
        return await self._take_over(client_id, owner, claim)

    async def _replica_or_fallback(self, client_id: str, owner: str, why: str,
                                   stale_copies: set[str] | None = None) -> None:
        """The owner cannot hand the session over: take it from the newest replica
        (`session_replicas` > 1), else go on as `_fallback` says (`stale_copies`: see
        `_Taking.stale`)."""
        stored = await self.replicas.copy_for_takeover(client_id, owner) if self.replicas is not None else None
        if stored is None:
            self._fallback(client_id, owner, why, stale_copies)
            return
        stale = self.broker.sessions.get(client_id)
        if stale is not None and stale.persistent:
            # The copy left here (messages relayed into it) may hold what the dead owner
            # delivered: DUP=1, as `_fallback` sends it (simulator seeds 739 and 773 of 5
            # nodes, 20 clients, 60 s, 2 replicas, a crash: a QoS 1 message the owner
            # delivered just before it crashed came again without DUP from this copy).
            stored = merge_stale(stored, stale, dup=True)
        replicas = self.replicas
        assert replicas is not None
        session = self.broker.install_session(stored, self.clock.wall())
        # What reaches the session directly from now on is newer than what members held
        # for the dead owner (a member's forwards to it came first): it goes behind that.
        direct_from = session.next_seq
        self.stats.from_replica += 1
        # As in `_fallback`: the owner's own copy is merged here if it comes back, and
        # what this session is given meanwhile must not be delivered twice then; nor
        # what the replica saw the owner remove lately (given), which may still come
        # by another way (simulator seed 49 of 5 nodes, 20 clients, 60 s, 2 replicas, a
        # crash: a QoS 2 message the owner delivered during a cut came again from the
        # forward its node had held for the taker's node, replayed at the heal).
        self._start_remembering(client_id, session, for_s=REMEMBER_FOR, given=stored.remembered, taken_from=owner)
        # What members held for the dead owner comes here, before and after they learn
        # this node's routes (the fence): a member that never comes back would keep it.
        merge = StoredSession(client_id, queue=await replicas.held_for(client_id, owner, session.subscriptions))
        await self._fence(owner, {})
        merge.queue += await replicas.held_for(client_id, owner, session.subscriptions)
        if merge.queue:
            added = self.broker.merge_session(merge, self.clock.wall(), ahead_of=direct_from)
            log.info("session %s: %d messages held for %s merged at the takeover (%d queued)",
                     client_id, added, owner, session.queued)
        replicas.taken_over(client_id, owner, direct_from=direct_from)
        await self.cluster.wait_durable()
        self.trace.emit(ts_us=self._wall_us(), kind="session_handoff", subject=client_id, origin=owner,
                        to=self.node_id, outcome="replica", reason=why, duration_ms=0.0,
                        messages=len(stored.queue) + len(stored.inflight))

    def _start_remembering(self, client_id: str, session: Session | None, *, for_s: float | None = None,
                           given: set[tuple[str | None, int]] | None = None, taken_from: str | None = None) -> None:
        """From now on (for `for_s`, by default as long as a late forward may still be
        relayed here) the broker remembers which messages the session is given (and
        what it holds now, and `given`: what it was given on the node it came from),
        so a copy merged into it later, or a late forward, does not deliver them twice.
        `taken_from`: the session came from a replica of that owner's copy, which does
        not know what the owner delivered last (`Broker.deliver`, `_answer_push`)."""
        keys: list[tuple[str | None, int]] = []
        if session is not None:  # what it holds now is what it may deliver
            keys.extend(message_key(e.delivery.message) for e in session.inflight.values())
            keys.extend(message_key(d.message) for d in (session.queue if session.queued else ()))
        keys.extend(given or ())
        self.broker.remember(client_id, keys, taken_from=taken_from)
        until = max(self.clock.wall() + (self.moved_memory if for_s is None else for_s),
                    self._remember_until.get(client_id, 0.0))
        if until != self._remember_until.get(client_id):
            self._remember_until[client_id] = until
            if self.notes is not None:
                self.notes.put_meta(REMEMBER_UNTIL_META + client_id, until)

    def _stop_remembering(self, client_id: str) -> None:
        if self._remember_until.pop(client_id, None) is not None and self.notes is not None:
            self.notes.delete_meta(REMEMBER_UNTIL_META + client_id)
        self.broker.forget_remembered(client_id)

    def _image(self, session: Session) -> dict[str, object]:
        """A session's image for a handoff or a push, with what it was given lately."""
        image = image_of(session)
        keys = self.broker.remembered.get(session.client_id)
        if keys:
            image[REMEMBERED] = remembered_to_wire(keys)  # an optional key: an older taker skips it
        return image

    def _fallback(self, client_id: str, owner: str, why: str, stale_copies: set[str] | None = None) -> None:
        self.stats.failed += 1
        # The owner's copy will be merged into this session later: remember what this
        # one is given meanwhile, so the merge does not deliver it twice.
        self._start_remembering(client_id, self.broker.sessions.get(client_id), for_s=REMEMBER_FOR)
        taken = self.taken_in.get(client_id)
        if taken is None or (stale_copies and not stale_copies <= taken.stale):
            if taken is None:
                # What still reaches this node and reached the owner too goes into the
                # owner's copy, which is merged here later: not delivered twice meanwhile.
                taken = self.taken_in[client_id] = TakenIn(owner, self.clock.wall(),
                                                           fresh=client_id not in self.broker.sessions)
            taken.stale.update(stale_copies or ())
            if self.notes is not None:
                self.notes.put_meta(TAKEN_META + client_id, taken.to_record())
        have = client_id in self.broker.sessions
        if have:
            # A copy left here earlier, contested by the owner's: what it queued may have
            # reached the client from the owner already, so it goes with DUP=1 (seeds 19
            # and 67 of 5 nodes, 20 clients, 60 s: a QoS 1 message twice without DUP).
            session = self.broker.sessions[client_id]
            for delivery in session.queue if session.queued else ():
                delivery.dup = True
        log.warning("session %s: cannot take it over from %s (%s); going on with %s", client_id, owner, why,
                    "the copy held here" if have else "a new session")
        self.trace.emit(ts_us=self._wall_us(), kind="session_handoff", subject=client_id, origin=owner,
                        to=self.node_id, outcome="fallback", reason=why, duration_ms=0.0, messages=0)

    async def _take_over(self, client_id: str, owner: str, claim: Claim) -> str:
        started = self.clock.now()
        taking = _Taking(claim, trio.CancelScope(deadline=started + TAKEOVER_BUDGET))
        self.taking[client_id] = taking
        machine = Takeover(client_id, owner, claim.stamp.to_wire())
        try:
            with taking.scope:
                # Copies forwarded here (over routes older than this takeover) before the
                # client left its old node must land before the session does: the old
                # node may have delivered them already.  Flushed alongside the pull.
                flushed = trio.Event()
                assert self._nursery is not None
                self._nursery.start_soon(self._fence_back, flushed)
                return await self._drive(machine, taking, started, flushed)
            if taking.superseded:
                return self._superseded(client_id, taking)
            await self._replica_or_fallback(client_id, taking.claimer or machine.owner, "timed out", taking.stale)
            return "ok"
        except _Superseded:
            return self._superseded(client_id, taking)
        except (trio.TooSlowError, HandoffError, OSError, trio.BrokenResourceError) as exc:
            await self._replica_or_fallback(client_id, taking.claimer or machine.owner, str(exc) or type(exc).__name__,
                                            taking.stale)
            return "ok"
        finally:
            if self.taking.get(client_id) is taking:
                del self.taking[client_id]

    def _superseded(self, client_id: str, taking: _Taking) -> str:
        self.stats.superseded += 1
        if taking.session is not None:
            self.broker.discard_session(client_id, self.clock.wall())
        log.info("%s: a newer CONNECT elsewhere won; closing this one (0x8E)", client_id)
        return "superseded"

    async def _drive(self, machine: Takeover, taking: _Taking, started: float, flushed: trio.Event) -> str:
        client_id = machine.client_id
        step: Step = machine.start()
        redirects = 0
        giver_marked = False
        begin_mark: int | None = None  # the giver's mark when it gave its copy (ho_begin's "upto")
        phases: list[tuple[str, float]] = []  # for the debug log: where the time goes
        while True:
            phases.append((type(step).__name__ + ":" + getattr(step, "frame_type", ""), self.clock.now() - started))
            if isinstance(step, Ask):
                reply = await self.cluster.ask(machine.owner, step.frame_type, step.fields, STEP_TIMEOUT)
                if "own" in reply:
                    # Refused for a newer claim: learn it now, so the client's next
                    # CONNECT here asks the right owner with a newer stamp (and does not
                    # take this node's losing claim for ownership).
                    try:
                        self._take_claim(Claim.from_wire(reply["own"]))
                    except (TypeError, ValueError) as exc:
                        self.malformed += 1
                        log.warning("dropping a malformed claim from %s: %s", machine.owner, exc)
                if reply.get("copy") is True and isinstance(reply.get("moved"), str):
                    # A stale copy there (see `_stale_copy_claimer`): it comes later, merged.
                    taking.stale.add(machine.owner)
                    taking.claimer = reply["moved"]
                if step.frame_type == "ho_begin":
                    upto = reply.get("upto")
                    begin_mark = upto if isinstance(upto, int) else None
                taken_in = self.taken_in.get(client_id)
                if (step.frame_type == "ho_commit" and not giver_marked and taken_in is not None
                        and isinstance(reply.get("upto"), int)):
                    # The giver's own messages up to here reached its copy (see `TakenIn`).
                    taken_in.marks[machine.owner] = reply["upto"]
                    giver_marked = True
                step = machine.on_reply(reply)
            elif isinstance(step, Install):
                await flushed.wait()
                stale = self.broker.sessions.get(client_id)
                stored = merge_stale(step.session, stale) if stale is not None and stale.persistent else step.session
                taking.session = self.broker.install_session(stored, self.clock.wall())
                # The old owner relays what still reaches it for the session (forwards
                # that were held or stuck in a link); remembering what this copy is given
                # lets the merge of such a relay drop what got here directly too.
                self._start_remembering(client_id, taking.session, given=step.session.remembered)
                # What reaches this node late and reached the giver too is the giver's
                # to deliver (see `TakenIn`); the fences fill in the marks.
                taken = self.taken_in[client_id] = TakenIn(machine.owner, self.clock.wall(),
                                                           fresh=stale is None or not stale.persistent)
                # Until the commit gives the giver's mark, what it published after it
                # gave its copy and sends directly is delivered: the tail's merge drops
                # what its copy had too.  What it published before reached that copy,
                # which delivered it or brought it here (simulator seed 2523 of 3 nodes,
                # 6 clients, 15 s: a message held for this node while it was cut off,
                # replayed at the heal during the takeover, was delivered a second time).
                taken.marks[machine.owner] = begin_mark or 0
                # Synced here and fenced everywhere, at the same time.
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self.cluster.wait_durable)
                    nursery.start_soon(self._fence, machine.owner, taken.marks)
                if self.notes is not None:
                    self.notes.put_meta(TAKEN_META + client_id, taken.to_record())
                step = machine.installed()
                # The owner takes this node's routes before it lets go, so what is
                # published there after it deleted its copy is forwarded here.
                step.fields["snap"] = self.cluster.own_route_snapshot()
                # And learns which members forward here now: what reaches it late from
                # the others is relayed here (an optional field: older nodes skip it).
                step.fields["fenced"] = {m: mark for m, mark in taken.marks.items() if m != machine.owner}
            elif isinstance(step, MergeTail):
                # Copies of tail messages that were forwarded here too must be here
                # before the merge, or they would escape its deduplication.
                await self._fence_back()
                session = taking.session
                if session is None:
                    raise HandoffError("tail before the session was installed")
                add, drop = merge_tail(session.queue if session.queued else (),
                                       (e.delivery for e in session.inflight.values()), step.tail, machine.base)
                self.broker.merge_handed_tail(session, add, drop)
                self._start_remembering(client_id, session)  # the tail too
                taken_in = self.taken_in.get(client_id)
                if taken_in is not None:
                    # The giver lets its copy go: what it publishes after its mark (at
                    # the commit; none from an older giver) is this node's to deliver.
                    taken_in.marks.setdefault(machine.owner, 0)
                    if self.notes is not None:
                        self.notes.put_meta(TAKEN_META + client_id, taken_in.to_record())
                await self.cluster.wait_durable()
                done, finished = machine.merged()
                # The owner may delete its copy now; its answer is not needed.
                self.cluster.tell(machine.owner, done.frame_type, done.fields)
                log.debug("takeover of %s: %s", client_id, " ".join(f"{n}@{t * 1000:.1f}ms" for n, t in phases))
                self._finished(machine, finished, started)
                return "ok"
            elif isinstance(step, Redirect):
                redirects += 1
                if step.node != self.node_id and step.node not in self.gossip.alive_members():
                    # The session moved on to a node that is gone since (its claim had not
                    # reached this one): the fallback takes that node's replica copy and
                    # what members hold for it, not the old owner's (simulator seed 273 of
                    # 5 nodes, 20 clients, 60 s, 2 replicas, a crash: n0 took s1 from n2
                    # and crashed; a message n1 held for n0 never reached s1 on n4).
                    taking.claimer = step.node
                if redirects > MAX_REDIRECTS or step.node == self.node_id or step.node not in self.gossip.alive_members():
                    raise HandoffError(f"redirected to {step.node}")
                machine = Takeover(client_id, step.node, machine.claim_wire)
                step = machine.start()
            elif isinstance(step, Refused):
                if step.why == "none" and taking.stale:
                    # The claimer holds none (its own takeover gave way to this one): the
                    # stale copy is still to be merged here, so this is a fallback.
                    raise HandoffError(f"{machine.owner} holds no session; a stale copy at {sorted(taking.stale)}")
                if step.why == "none":
                    log.info("%s: %s holds no session for it; starting afresh", client_id, machine.owner)
                    return "ok"
                if step.why in ("superseded", "aborted"):
                    raise _Superseded()
                if step.why == "forgot":
                    raise HandoffError(f"{machine.owner} restarted or gave up during the handoff")
                raise HandoffError(f"refused: {step.why}")
            else:
                raise HandoffError(f"unexpected step {step!r}")

    def _finished(self, machine: Takeover, finished: Finished, started: float) -> None:
        duration_ms = (self.clock.now() - started) * 1000
        self.stats.taken += 1
        self.stats.durations_ms.append(duration_ms)
        del self.stats.durations_ms[:-1000]
        log_event(log, Event.CLIENT_TAKEN_OVER, client_id=machine.client_id, from_node=machine.owner,
                  duration_ms=round(duration_ms, 1), messages=finished.messages)
        self.trace.emit(ts_us=self._wall_us(), kind="session_handoff", subject=machine.client_id,
                        origin=machine.owner, to=self.node_id, outcome="ok", duration_ms=round(duration_ms, 3),
                        messages=finished.messages)

    async def _fence(self, owner: str, fenced: dict[str, int]) -> None:
        """After this node's routes for the session exist: every member takes them and
        waits until what it sent to the owner before is acknowledged there, so the
        owner's tail holds everything that did not reach this node directly.  The
        members that answered in time go into `fenced`, with their marks."""
        self.cluster.flush_routes_now()
        snapshot = self.cluster.own_route_snapshot()
        members = [m for m in self.gossip.alive_members() if m != owner]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._drain_own, owner, fenced)
            for member in members:
                nursery.start_soon(self._fence_one, member, owner, snapshot, fenced)

    async def _fence_back(self, done: trio.Event | None = None) -> None:
        """Every member (the old owner too) flushes its link to this node."""
        async with trio.open_nursery() as nursery:
            for member in self.gossip.alive_members():
                nursery.start_soon(self._flush_one, member)
        if done is not None:
            done.set()

    async def _flush_one(self, member: str) -> None:
        try:
            await self.cluster.ask(member, "ho_flush", {}, FENCE_TIMEOUT + 0.5)
        except (trio.TooSlowError, OSError, trio.BrokenResourceError) as exc:
            log.warning("flush at %s failed (%s): a message may be delivered twice", member, exc)

    async def _drain_own(self, owner: str, fenced: dict[str, int]) -> None:
        mark = self.cluster.forward_mark()  # what this node forwards from now on, it has the session for
        if await self.cluster.drain_link(owner, FENCE_TIMEOUT):
            fenced[self.node_id] = mark

    async def _fence_one(self, member: str, owner: str, snapshot: list[object], fenced: dict[str, int]) -> None:
        try:
            reply = await self.cluster.ask(member, "ho_fence", {"o": owner, "snap": snapshot}, FENCE_TIMEOUT + 0.5)
            mark = reply.get("mark")
            if reply.get("ok") and reply.get("drained") is True and isinstance(mark, int):
                fenced[member] = mark
        except (trio.TooSlowError, OSError, trio.BrokenResourceError) as exc:
            log.warning("fence at %s failed (%s): messages it sent to %s may arrive out of order", member, exc, owner)

    # ------------------------------------------------------------ the giver

    def answer(self, peer: str, frame: Frame) -> Reply | Awaitable[Reply]:
        kind = frame["t"]
        cid = frame.get("c")
        if kind == "ho_fence":
            return self._answer_fence(peer, frame)
        if kind == "ho_flush":
            return self._answer_flush(peer)
        if not isinstance(cid, str):
            raise ValueError("handoff frame without a client id")
        now = self.clock.wall()
        if kind == "ho_begin":
            return "ho_state", self._answer_begin(peer, cid, Claim(cid, peer, _stamp(frame["h"])), now)
        if kind == "ho_push":
            return self._answer_push(peer, cid, frame)
        giving = self.giving.get(cid)
        session = self.broker.sessions.get(cid)
        if giving is not None and giving.taker == peer and session is None:
            # The session expired here after its image went (its CONNECT elsewhere came
            # as it expired): the taker goes on with what it got, as with no session
            # here at all.  "aborted" closed the client's CONNECT as if a newer one had
            # won (simulator seed 7633 of 3 nodes, 6 clients, 15 s: no SUBACK).
            del self.giving[cid]
            return "ho_state", {"ok": False, "why": "none"}
        if giving is None and cid not in self.broker.connections and "h" in frame:
            return "ho_state", self._forgotten_handoff(peer, cid, frame["h"])
        if giving is None or giving.taker != peer or session is None or cid in self.broker.connections:
            return "ho_state", {"ok": False, "why": "aborted"}
        cursor = int(frame.get("cur", 0))
        if kind == "ho_more":
            q, cur, more = queue_chunk(session.queue if session.queued else (), cursor)
            return "ho_state", {"ok": True, "q": q, "cur": cur, "more": more}
        if kind == "ho_commit":
            if "snap" in frame:
                self.cluster.take_route_snapshot(frame["snap"], peer)
            giving.fenced = marks_from_wire(frame.get("fenced"))
            if giving.commit_seq is None:
                giving.commit_seq = session.next_seq - 1
            q, cur, more = queue_chunk(session.queue if session.queued else (), cursor, giving.commit_seq)
            # "upto" (optional; an older taker skips it): what this node publishes from
            # now on, it forwards to the taker (it has its routes), its copy aside.
            return "ho_state", {"ok": True, "q": q, "cur": cur, "more": more, "upto": self.cluster.forward_mark()}
        if kind == "ho_done":
            del self.giving[cid]
            self._handed_over(cid, peer, now, giving.commit_seq, giving.fenced)
            return "ho_state", {"ok": True}
        raise ValueError(f"unknown handoff frame {kind!r}")

    def _forgotten_handoff(self, peer: str, cid: str, stamp: object) -> Fields:
        """A step of a handoff this node knows nothing of (it restarted, or gave up on
        the taker, since it answered the `ho_begin`), its client not connected here: a
        newer claim known here wins ("superseded"); else the taker's claim is the newest,
        and it goes on with what it installed ("forgot"), as when the giver dies; the
        copy here is pushed to it later (`_push_foreign_copies`), which needs its claim.
        "aborted" closed the client's CONNECT with 0x8E though no newer CONNECT existed
        (simulator seed 3614 of 3 nodes, 6 clients, 15 s: the giver was killed after
        its `ho_begin` and restarted before the `ho_commit`)."""
        claim = Claim(cid, peer, _stamp(stamp))
        self.register.merge(claim, self._wall_ms())
        current = self.register.get(cid)
        if current is not None and current.stamp > claim.stamp:
            return {"ok": False, "why": "superseded", "own": current.to_wire()}
        log.info("%s: %s asks on with a handoff not known here (restarted or given up since); it keeps its copy",
                 cid, peer)
        return {"ok": False, "why": "forgot"}

    def _handed_over(self, cid: str, taker: str, now: float, commit_seq: int | None = None,
                     fenced: dict[str, int] | None = None, unconfirmed: bool = False) -> None:
        """The session is the taker's: the copy here goes, and what the taker may lack
        is relayed to it: what was queued after its commit (`commit_seq`), and with
        `unconfirmed` (no `ho_done` came) what the commit's chunk gave it as well."""
        self.stats.given += 1
        session = self.broker.sessions.get(cid)
        if faults.STALE_OWNER:
            self.moved[cid] = Moved(taker, now, StoredSession(cid))
            return  # BUGGIFY: the old owner keeps serving its copy
        image = StoredSession(cid)
        tail: list[Delivery] = []
        if session is not None:
            image = StoredSession(cid, expiry_interval=session.expiry_interval, protocol_level=session.protocol_level,
                                  subscriptions=dict(session.subscriptions))
            if commit_seq is not None and session.queued:
                # Queued here after the taker took the tail: from a member the fence
                # could not drain, the taker may not have it.  (What this node or a
                # fenced member sent after the fence went to the taker as well.)
                tail = [d for d in session.queue if (unconfirmed and d.seq <= commit_seq) or (
                        d.seq > commit_seq and d.message.origin != self.node_id
                        and not (d.message.origin in (fenced or {}) and d.message.msg_id > (fenced or {})[d.message.origin]))]
        self.broker.discard_session(cid, now)
        # What the session was given here is the taker's to remember now; kept here, it
        # would make the copy relayed below drop what it carries.
        self._stop_remembering(cid)
        self._forget_taken(cid)
        self._note_moved(cid, Moved(taker, now, image, dict(fenced or {})))
        if self.notes is not None:
            self.notes.put_meta(MOVED_META + cid, self.moved[cid].to_record())
        if tail:
            self._relay(cid, [Delivery(d.message, d.qos, d.retain, d.subscription_ids) for d in tail], now)
        log.info("session %s handed over to %s", cid, taker)

    # ------------------------------------------------------------ late forwards

    def _note_moved(self, cid: str, moved: Moved) -> None:
        self._unindex_moved(cid)
        self.moved[cid] = moved
        for topic_filter in moved.session.subscriptions:
            if not topic_filter.startswith("$share/"):
                self._moved_filters.add(topic_filter, cid)

    def _unindex_moved(self, cid: str) -> None:
        old = self.moved.get(cid)
        if old is not None:
            for topic_filter in old.session.subscriptions:
                self._moved_filters.remove(topic_filter, cid)

    def _forget_moved(self, cid: str) -> None:
        if cid in self.moved:
            self._unindex_moved(cid)
            del self.moved[cid]
            if self.notes is not None:
                self.notes.delete_meta(MOVED_META + cid)

    def relay_moved(self, msg: Message, now: float, sender: str, also: tuple[str, ...]) -> int:
        """A QoS >= 1 message forwarded here for plain subscribers, after sessions that
        subscribe it moved to other nodes (it was sent before the sender knew: held
        through a netsplit, or stuck in a link the handoff's fence could not drain):
        this node would deliver it to nobody, yet its publisher is acknowledged.  Each
        such session gets it in a copy kept here (stored like any session, so the
        forward's acknowledgement waits for it as for a local delivery), which is pushed
        to the session's owner and merged there (`_push_foreign_copies`); the owner
        remembers what the session got, so a message that reached it directly too is
        not delivered twice.  Not relayed: what the sender forwarded to the taker too
        (`also`), when the sender was fenced by the takeover (so the taker had the
        session when that copy came).  Returns how many sessions it was relayed to."""
        if not self._moved_filters:
            return 0
        matched: dict[str, list[SubscriptionOptions]] = {}
        for topic_filter, cids in self._moved_filters.match_filters(msg.topic):
            for cid in cids:
                matched.setdefault(cid, []).append(self.moved[cid].session.subscriptions[topic_filter])
        relayed = 0
        for cid, subs in sorted(matched.items()):
            claim = self.register.get(cid)
            if claim is None or claim.owner in (None, self.node_id) or claim.clean or cid in self.broker.connections:
                continue  # served here again (it had the message), ended, or started clean
            moved = self.moved[cid]
            if moved.taker_has(msg, sender, also):
                continue
            log.debug("relaying %s/%s from %s for %s to %s (sent to %s; marks %s)", msg.origin, msg.msg_id, sender, cid,
                      moved.taker, also, moved.fenced)
            subs = [o for o in subs if not (o.no_local and msg.publisher == cid)]
            if not subs:
                continue
            qos = min(msg.qos, max(o.qos for o in subs))
            retain = msg.retain and any(o.retain_as_published for o in subs)
            ids = tuple(o.subscription_id for o in subs if o.subscription_id)
            self._relay(cid, [Delivery(msg, qos, retain, ids)], now)
            if sender == msg.origin:
                self._note_relayed_to(cid, msg, also)
            relayed += 1
        return relayed

    def _fence_late(self) -> None:
        """Members a takeover could not fence (unreachable then) are fenced once they
        are back: until then what they forward for the session is left to its giver,
        which relays it here later, behind what came directly."""
        if self._nursery is None or not self.taken_in:
            return
        alive = self.gossip.alive_members()
        for cid, taken in self.taken_in.items():
            if cid in self.taking or taken.giver not in alive:
                continue
            if taken.fresh and taken.giver not in taken.marks and (cid, taken.giver) not in self._late_fencing:
                self._late_fencing.add((cid, taken.giver))
                self._nursery.start_soon(self._ask_giver, cid, taken)
            for member in alive:
                key = (cid, member)
                if member not in taken.marks and member not in (taken.giver, self.node_id) and key not in self._late_fencing:
                    self._late_fencing.add(key)
                    self._nursery.start_soon(self._fence_one_late, cid, taken, member)

    async def _fence_one_late(self, cid: str, taken: TakenIn, member: str) -> None:
        try:
            await self._fence_one(member, taken.giver, self.cluster.own_route_snapshot(), taken.marks)
            log.debug("late fence of %s at %s for %s: %s", cid, member, taken.giver, taken.marks.get(member))
            if member in taken.marks and self.taken_in.get(cid) is taken and self.notes is not None:
                self.notes.put_meta(TAKEN_META + cid, taken.to_record())
        finally:
            self._late_fencing.discard((cid, member))

    async def _ask_giver(self, cid: str, taken: TakenIn) -> None:
        """Whether the giver of a session taken in with no word on its copy (a fallback:
        its copy is pushed here later) still holds one: if not, what it publishes is
        this node's to deliver (`TakenIn.giver_kept`).  Asked again while it does.  A
        fence that names the session ("c", optional); an older giver fences itself
        (it drains its link to "o", itself: none) and says nothing of its copy."""
        fields: dict[str, object] = {"o": taken.giver, "c": cid, "snap": self.cluster.own_route_snapshot()}
        claim = self.register.get(cid)
        if claim is not None and claim.owner == self.node_id:
            # "h" (optional; an older giver skips it): this node's claim, so a giver that
            # has not heard of it yet (a claim made during a netsplit reaches the other
            # side at the next exchange of states, tens of seconds after the heal) pushes
            # its copy here now (simulator seed 398 of 5 nodes, 20 clients, 60 s, 2
            # replicas, a crash: the giver crashed for good 6 s after the heal, its copy
            # never pushed, and an acknowledged message was lost).
            fields["h"] = claim.stamp.to_wire()
        try:
            reply = await self.cluster.ask(taken.giver, "ho_fence", fields, FENCE_TIMEOUT + 0.5)
            log.debug("%s %s a copy of %s", taken.giver, "holds" if reply.get("copy") else "holds no", cid)
            if reply.get("ok") and reply.get("copy") is not True and self.taken_in.get(cid) is taken:
                taken.marks.setdefault(taken.giver, 0)
                if self.notes is not None:
                    self.notes.put_meta(TAKEN_META + cid, taken.to_record())
        except (trio.TooSlowError, OSError, trio.BrokenResourceError) as exc:
            log.debug("asking %s about its copy of %s failed (%s)", taken.giver, cid, exc)
        finally:
            self._late_fencing.discard((cid, taken.giver))

    def _forget_taken(self, cid: str) -> None:
        if self.taken_in.pop(cid, None) is not None and self.notes is not None:
            self.notes.delete_meta(TAKEN_META + cid)

    def giver_had(self, msg: Message, sender: str, also: tuple[str, ...]) -> Callable[[str], bool] | None:
        """For a message forwarded here: which sessions taken over here must not get it
        (see `TakenIn`), as a test of a client id; None when none can be."""
        if not self.taken_in or msg.origin != sender:
            return None

        def had(client_id: str) -> bool:
            taken = self.taken_in.get(client_id)
            if taken is None or not taken.giver_got(msg, sender, also):
                return False
            self.skipped += 1
            return True

        return had

    def _note_relayed_to(self, cid: str, msg: Message, also: tuple[str, ...]) -> None:
        """Where the sender had forwarded a message relayed into the copy of `cid`: the
        owner the copy is pushed to waits for the giver's copy first when its giver got
        it too (`_giver_copy_pending`).  Without it, a copy relayed into a session that
        fell back onto its node delivered what the giver had delivered already
        (simulator seed 61 of 5 nodes, 20 clients, 60 s: QoS 1 twice, the second new)."""
        sent_to = self._relayed_to.setdefault(cid, {})
        sent_to[message_key(msg)] = also
        if self.notes is not None:
            self.notes.put_meta(RELAYED_META + cid, sent_to_wire(sent_to))

    def _forget_relayed_to(self, cid: str) -> None:
        if self._relayed_to.pop(cid, None) is not None and self.notes is not None:
            self.notes.delete_meta(RELAYED_META + cid)

    def _giver_copy_pending(self, cid: str, peer: str, deliveries: list[Delivery], sent_to: SentTo) -> bool:
        """Whether a pushed copy carries messages relayed into it that the giver of the
        session here may have delivered too (`TakenIn.giver_got`) while the giver's own
        copy, which says what it delivered, is still to come (a fallback: no mark of
        the giver yet).  Merged first, they would be delivered again; so the push waits
        (the pusher keeps its copy and tries again) until the giver's copy is merged,
        whose remembered messages the merge then leaves out.  Not dropped: the giver
        may have skipped them too, its own giver having got them (simulator seed 1 of
        5 nodes, 20 clients, 60 s).  A copy whose holder said it was stale waits
        whole, whatever it carries (`_stale_copy_claimer`).  Not for a giver that is
        not alive (it may never come back: delivered, not lost)."""
        taken = self.taken_in.get(cid)
        if (taken is None or not taken.fresh or taken.giver == peer or taken.giver in taken.marks
                or taken.giver not in self.gossip.alive_members()):
            return False
        if peer in taken.stale:
            return True  # a stale copy: merged after the giver's (see `_stale_copy_claimer`)
        if not sent_to:
            return False
        for d in deliveries:
            also = sent_to.get(message_key(d.message))
            if also is not None and d.message.origin is not None and taken.giver_got(d.message, d.message.origin, also):
                return True
        return False

    def _relay(self, cid: str, deliveries: list[Delivery], now: float) -> None:
        moved = self.moved.get(cid)
        if cid not in self.broker.sessions:
            # A copy with no subscriptions: it routes nothing here, it only carries
            # the relayed messages until the owner merged them.
            self.broker.merge_session(StoredSession(cid, expiry_interval=moved.session.expiry_interval if moved else 0,
                                                    protocol_level=moved.session.protocol_level if moved else 4), now)
        self.broker.merge_session(StoredSession(cid, queue=deliveries), now)
        self.relayed += len(deliveries)
        log.info("session %s moved to %s: relaying %d late messages", cid, moved.taker if moved else "?", len(deliveries))

    def _answer_begin(self, peer: str, cid: str, claim: Claim, now: float) -> Fields:
        before = self.register.get(cid)
        self.register.merge(claim, self._wall_ms())
        current = self.register.get(cid)
        if current is not None and current.stamp > claim.stamp:
            return {"ok": False, "why": "superseded", "own": current.to_wire()}
        session = self.broker.sessions.get(cid)
        if cid in self.moved or cid in self.broker.expired_while_down:
            # Only a copy of relayed messages, or one past its expiry: pushed to the
            # owner if its client resumed it in time; no session for a new CONNECT.
            session = None
        if session is None or not session.persistent:
            moved = self.moved.get(cid)
            if moved is not None and moved.taker != peer:
                return {"ok": False, "moved": moved.taker}
            return {"ok": False, "why": "none"}
        previous = self.giving.get(cid)
        if previous is not None and previous.taker != peer and previous.commit_seq is not None:
            # Committed: the session is the other taker's now; ask there.
            return {"ok": False, "moved": previous.taker}
        claimer = self._stale_copy_claimer(cid, before, peer)
        if claimer is not None:
            # "copy" (optional; an older taker only follows "moved"): this node's copy
            # is pushed to the taker later, to be merged after the claimer's.
            log.info("%s: the copy here is stale (claimed since at %s); %s is sent there", cid, claimer, peer)
            return {"ok": False, "moved": claimer, "copy": True}
        if previous is not None and previous.taker != peer:
            log.info("handoff of %s to %s superseded by a newer one to %s", cid, previous.taker, peer)
        self.broker.detach_for_handoff(cid, now)
        self.giving[cid] = Giving(cid, peer, now)
        q, cur, more = queue_chunk(session.queue if session.queued else (), 0)
        # "upto" (optional; an older taker skips it): what this node published so far
        # reached the copy given now (see `TakenIn.giver_kept`).
        return {"ok": True, "img": self._image(session), "q": q, "cur": cur, "more": more,
                "upto": self.cluster.forward_mark()}

    def _stale_copy_claimer(self, cid: str, before: Claim | None, taker: str) -> str | None:
        """The node that claimed the client after the copy held here was its session,
        when the newest claim known here before the taker's is another node's (not
        clean, no release): the client resumed there (a takeover that fell back, or a
        copy restored by a restart here after it left), and what its session got there
        this copy lacks, while the copy may hold what reached both (forwards to routes
        this copy kept).  Handed over as the session, it would deliver those again
        (simulator seed 138 of 5 nodes, 20 clients, 60 s: n1 restarted with s2's copy,
        which n3 had claimed; p3/2/2 reached s2 on n3 and n1's copy; n4, which never
        heard n3's claim, took n1's copy and delivered p3/2/2 a second time).  So the
        taker is sent to the claimer, and this copy is pushed to the taker and merged,
        without what the session was given."""
        if (before is None or before.owner in (None, self.node_id, taker) or before.clean
                or cid in self.broker.connections):
            return None
        return before.owner

    async def _answer_flush(self, peer: str) -> tuple[str, Fields]:
        await self.cluster.drain_link(peer, FENCE_TIMEOUT)
        return "ho_flushed", {"ok": True}

    async def _answer_fence(self, peer: str, frame: Frame) -> tuple[str, Fields]:
        cid = frame.get("c")
        if isinstance(cid, str):
            # Asked as a session's giver (`_ask_giver`): only whether its copy is here.
            # Not a copy kept past its expiry that no resume claimed in time (it ends).
            if "h" in frame:
                # The asker's claim: a copy here is pushed to it (`_push_foreign_copies`).
                self._take_claim(Claim(cid, peer, _stamp(frame["h"])))
                giving = self.giving.get(cid)
                if giving is not None and giving.taker == peer and giving.commit_seq is None:
                    # Its `ho_begin` came late (held up by a netsplit): the asker gave up
                    # on that handoff, fell back, and asks as the session's taker now.  Not
                    # waited out (`housekeeping`): the copy is pushed to it at once.
                    del self.giving[cid]
                    log.info("handoff of %s to %s: it fell back meanwhile; the copy here is pushed to it", cid, peer)
            expired_at = self.broker.expired_while_down.get(cid)
            copy = (cid in self.broker.sessions and cid not in self.moved
                    and (expired_at is None or self.claimed_elsewhere(cid, expired_at)))
            return "ho_fenced", {"ok": True, "copy": copy}
        owner = frame["o"]
        if not isinstance(owner, str):
            raise ValueError("bad fence")
        self.cluster.take_route_snapshot(frame["snap"], peer)
        # What this node forwards from now on goes to the taker too: the last message
        # id forwarded before is the mark.
        mark = self.cluster.forward_mark()
        drained = await self.cluster.drain_link(owner, FENCE_TIMEOUT)
        # "drained" and "mark" (optional; an older node sends neither and counts as not
        # fenced): whether what this node forwarded to the owner before got there.
        return "ho_fenced", {"ok": True, "drained": drained, "mark": mark}

    # ------------------------------------------------------------ conflicts

    def _push_foreign_copies(self) -> None:
        """A session held here that a newer CONNECT claimed for another live node, and
        that no takeover came for (it fell back, or a netsplit kept the nodes apart):
        push it there to be merged, then forget it here."""
        if self._nursery is None:
            return
        alive = set(self.gossip.alive_members())
        alive.discard(self.node_id)
        if not alive:
            return  # alone: no session can be claimed for another live node
        now_ms = self._wall_ms()
        # Walked in place (nothing below changes the sessions): a list of (id, session)
        # pairs made every 2 s was ~64 bytes per session, and at tens of thousands of
        # idle clients it left freed pools in arenas that new connections also hold.
        for cid, session in self.broker.sessions.items():
            claim = self.register.get(cid)
            if (claim is None or claim.owner in (None, self.node_id) or claim.owner not in alive or claim.clean
                    or not session.persistent or cid in self.broker.connections or cid in self.giving
                    or cid in self._pushing or now_ms - claim.stamp.wall_ms < PUSH_GRACE_MS):
                continue
            if faults.STALE_OWNER and cid in self.moved:
                continue  # BUGGIFY: the copy handed over stays here
            expired_at = self.broker.expired_while_down.get(cid)
            if expired_at is not None and self._claim_since(claim) > expired_at * 1000:
                continue  # claimed after it expired: a new session there, not this one resumed
            self._pushing.add(cid)
            self._nursery.start_soon(self._push, cid, claim.owner)

    async def _push(self, cid: str, owner: str) -> None:
        started = self.clock.now()
        try:
            cursor, first, sent = 0, True, 0
            while True:
                session = self.broker.sessions.get(cid)
                if session is None or self._claimed_here_since_push(cid):
                    return
                queue = session.queue if session.queued else ()
                cursor_before = cursor
                q, cursor, more = queue_chunk(queue, cursor)
                if not first and not q:
                    break  # nothing arrived since the last chunk: the copy is all there
                # "upto" (optional): the last id published here so far, in the copy if it matched.
                fields: dict[str, object] = {"c": cid, "q": q, "more": more, "upto": self.cluster.forward_mark()}
                sent_to = self._relayed_to.get(cid)
                if sent_to:
                    # "to" (optional; an older owner skips it): where relayed messages had gone.
                    fields["to"] = sent_to_wire(sent_to, (message_key(d.message) for d in queue if cursor_before < d.seq <= cursor))
                if first:
                    fields["img"] = self._image(session)
                    sent += len(session.inflight)
                reply = await self.cluster.ask(owner, "ho_push", fields, STEP_TIMEOUT)
                if not reply.get("ok"):
                    log.info("%s would not merge session %s: %s", owner, cid, reply.get("why"))
                    if reply.get("why") == "ended":
                        # The session it held ended there; the client started a new one
                        # since: what this copy holds went with the old one.
                        self.broker.discard_session(cid, self.clock.wall())
                        self._stop_remembering(cid)
                        self._forget_moved(cid)
                    return
                moved = self.moved.get(cid)
                if moved is not None and moved.taker == owner and "marks" in reply:
                    # Members the taker fenced since: what they forward now reaches it directly.
                    moved.fenced.update(marks_from_wire(reply["marks"]))
                    if self.notes is not None:
                        self.notes.put_meta(MOVED_META + cid, moved.to_record())
                first = False
                sent += len(q)
            if self._claimed_here_since_push(cid):
                # Its client came back here meanwhile: the session it opens holds this
                # copy (merged with what it takes from the owner), and discarding it now
                # would also release this node's claim (simulator seed 67 of 5 nodes, 20
                # clients, 60 s: the release made the next CONNECT elsewhere start a new
                # session, which refused the copy: acknowledged messages lost).
                return
            session = self.broker.sessions.get(cid)
            image = StoredSession(cid)
            if session is not None:
                image = StoredSession(cid, expiry_interval=session.expiry_interval, protocol_level=session.protocol_level,
                                      subscriptions=dict(session.subscriptions))
            self.broker.discard_session(cid, self.clock.wall())
            self._stop_remembering(cid)
            self._forget_taken(cid)
            self._forget_relayed_to(cid)
            if cid not in self.moved or image.subscriptions:
                # What members forwarded here for the copy (the owner skips what reached
                # both: see `TakenIn`) and reaches this node from now on is relayed there.
                self._note_moved(cid, Moved(owner, self.clock.wall(), image))
                if self.notes is not None:
                    self.notes.put_meta(MOVED_META + cid, self.moved[cid].to_record())
            self.stats.merged_out += 1
            duration_ms = (self.clock.now() - started) * 1000
            log.warning("session %s: the copy held here was merged into %s's (%d messages)", cid, owner, sent)
            self.trace.emit(ts_us=self._wall_us(), kind="session_handoff", subject=cid,
                            origin=self.node_id, to=owner, outcome="merged", duration_ms=round(duration_ms, 3), messages=sent)
        except (trio.TooSlowError, OSError, trio.BrokenResourceError) as exc:
            log.info("pushing session %s to %s failed (%s); will retry", cid, owner, exc)
        finally:
            self._pushing.discard(cid)

    def _claimed_here_since_push(self, cid: str) -> bool:
        """Whether the client of a copy being pushed is (or is being) connected here."""
        return (cid in self.broker.connections or cid in self.giving or cid in self.taking or cid in self._locks
                or self.register.owner(cid) == self.node_id)

    async def _answer_push(self, peer: str, cid: str, frame: Frame) -> tuple[str, Fields]:
        key = (peer, cid)
        if self.register.owner(cid) != self.node_id:
            self._incoming.pop(key, None)
            return "ho_state", {"ok": False, "why": "not the owner"}
        if cid in self.broker.sessions and cid not in self._remember_until:
            # A session started afresh here (its CONNECT found none: the one this copy
            # belongs to ended, say it expired), not one whose copies may be merged.
            self._incoming.pop(key, None)
            return "ho_state", {"ok": False, "why": "ended"}
        img, queue = self._incoming.pop(key, (frame.get("img"), []))
        if img is None:
            img = {"x": 0, "l": 5, "n": 1, "s": [], "i": [], "q2": []}  # a late chunk: queue only
        entries = frame.get("q", [])
        if not isinstance(entries, list):
            raise HandoffError("queue chunk is not a list")
        chunk = [delivery_from_wire(item) for item in entries]
        sent_to = sent_to_from_wire(frame.get("to"))
        if self._giver_copy_pending(cid, peer, chunk, sent_to):
            self._incoming.pop(key, None)
            return "ho_state", {"ok": False, "why": "wait"}
        dead_owner = self.broker.taken_from(cid)
        if dead_owner is not None:
            # The session came from a replica: what the dead owner delivered before it
            # died is not in that copy.  A message it published, or one forwarded to it
            # as well, may have reached the client there: DUP=1 (simulator seed 59 of 5
            # nodes, 20 clients, 60 s, 2 replicas, a crash: p6/2/2, published and
            # delivered on n4, relayed back to n4 by the session's earlier owner, who
            # pushed it to the node that took the session over after n4 died: sent again
            # without DUP).
            for d in chunk:
                if d.message.origin == dead_owner or dead_owner in sent_to.get(message_key(d.message), ()):
                    d.dup = True
        queue.extend(chunk)
        if frame.get("more"):
            self._incoming[key] = (img, queue)
            return "ho_state", {"ok": True}
        stored = stored_from_image(cid, img, queue)
        # A push whose answer was lost comes again: what it merged must not be merged twice.
        self._start_remembering(cid, self.broker.sessions.get(cid))
        added = self.broker.merge_session(stored, self.clock.wall())
        self.broker.remember(cid, stored.remembered)
        taken = self.taken_in.get(cid)
        if taken is not None and taken.giver == peer:
            # What the giver publishes from now on no longer reaches a copy there.  Its
            # first push gave up its copy of the session; a later one carries messages
            # relayed into a copy since, which its own publishes never join: the mark
            # never rises, or they would be skipped as kept there (simulator seed 37 of
            # 5 nodes, 20 clients, 60 s: the giver's relay copy pushed after this node
            # restarted raised its mark over what it had held for this node meanwhile,
            # and an acknowledged message was lost).  Durable with the merge, before
            # the answer lets the giver drop its copy: a mark lost in a restart counts
            # all the giver publishes as kept there until its next push.
            upto = frame.get("upto")
            mark = upto if isinstance(upto, int) else 0
            taken.marks[peer] = min(mark, taken.marks.get(peer, mark))
            if self.notes is not None:
                self.notes.put_meta(TAKEN_META + cid, taken.to_record())
        await self.cluster.wait_durable()
        self.stats.merged_in += 1
        log.warning("session %s: merged %d messages from the copy %s held", cid, added, peer)
        if taken is not None and taken.giver == peer:
            # The giver relays what it cannot tell reached this node: these marks tell it
            # (an optional field; an older node skips it).
            return "ho_state", {"ok": True, "marks": {m: mark for m, mark in taken.marks.items() if m != peer}}
        return "ho_state", {"ok": True}

def _stamp(data: object) -> HlcTimestamp:
    try:
        return HlcTimestamp.from_wire(data)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"bad claim stamp: {exc}") from None
