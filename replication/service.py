"""The Trio driver of session replication: the owner's side, the replica's side, and
the takeover from a replica.

**Owner.**  The store tells `Replication` every change of a stored session
(`SessionStore.on_session_change`).  For a session this node owns (by the ownership
register) and while `session_replicas` > 1, the change gets the session's next
replication sequence number and joins the outbox of each of the session's replicas
(`placement.replicas_for` over the live members; `replication.outbox` keeps only a
delivery's last state, the earlier ones go as no-ops).  One sender task per replica peer
sends what its queue holds as one batch (a cluster query `repl`, on a stream of its
own: an older node answers "unknown query" and is left out of placement), waits for
the answer, and sends the next: group commit over the mesh.  A session new to a peer
gets a snapshot first (built when it is sent, from the session as it is then).

In `sync` mode the store's `durable_epoch` is held below the oldest change a replica
has not confirmed (`SessionStore.hold_durable`), so every acknowledgement that waits
for durability (a publisher's PUBACK/PUBREC, a forwarded batch's `fwd_ack`, a handoff)
waits for the replicas as well.  A replica that does not answer in `REPLICA_TIMEOUT`
is marked failed and replaced: its sessions get another member, whose snapshot
inherits the oldest unconfirmed epoch (the acknowledgements wait for the new copy).
When fewer members are alive than copies, the session goes on with the copies it can
have (`under_replicated`, one WARNING per episode): nothing waits for a member that is
not there.  `async`: nothing is held; `lag` counts the changes not yet confirmed.

**Replica.**  `repl` batches are applied per session in sequence order
(`changes.apply_changes`): a gap or an unknown session answers "resync" (the owner
sends a snapshot), never a crash; a sender whose ownership claim is older than the one
this node knows is answered "stale" (a node back from the dead does not overwrite the
new owner's copies).  Copies are written to this node's own store (meta records
`repl/<client id>` and `repld/<client id>/<delivery seq>`), and the answer leaves once
they are on this node's disk.

**Takeover.**  A CONNECT with clean start 0 whose owner is dead or does not answer
(`routing.handoff_driver`) asks every live member for its copy's sequence number
(`repl_seq`), takes the copy with the highest one (`repl_take`), and the handoff
driver installs it under the claim the CONNECT already made (the register fences it).
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterable, Mapping, Protocol

import trio

import faults
from clock import Clock
from clock.hlc import HlcTimestamp
from replication import changes, orphan_wills
from replication.changes import ChangeError, ReplicaCopy
from replication.outbox import Outbox, Sinks, Taken
from replication.placement import ranked, replicas_for
from routing.queries import QueryChannel, QueryFailed, QueryRefused, QueryUnanswered
from mqtt.topics import topic_matches
from mqtt import Will
from session_store import records
from session_store.handoff import HandoffError, delivery_from_wire, delivery_to_wire
from session_store.model import Delivery, Message, Session, SubscriptionOptions
from session_store.ownership import Claim
from session_store.store import NO_RECORD, StoredSession

log = logging.getLogger("meshd.replication")

REPLICA_TIMEOUT = 2.0  # a replica that does not confirm a batch within this is replaced
WRITE_CHECK = 0.5  # a replica waiting for its disk looks this often whether its writes fail
FAILED_FOR = 30.0  # ... and left out of placement this long
# A member of a version that cannot hold copies (it closes the `repl` query unanswered,
# or does not know it) is left out of placement this long, or until it leaves the live
# members (an upgrade restarts it), without a WARNING each time it is tried again.
NO_COPIES_FOR = 600.0
TAKEOVER_ASK_TIMEOUT = 1.5  # how long a takeover waits for members to say what copy they hold
# How long a CONNECT that knows no claim of its session waits for the session's replica
# set to say whether they hold a copy (every new persistent session asks: kept short).
UNCLAIMED_ASK_TIMEOUT = 0.5
HOUSEKEEPING_INTERVAL = 1.0
FOLLOW_HELD_FOR = 60.0  # after a takeover, what members hold for the dead owner is fetched this long
FOLLOW_HELD_EVERY = 2.0
TOOK_FOR = 24 * 3600.0  # what a takeover took is kept this long for a copy coming back (`_answer_merge`)
SNAPSHOTS_PER_ROUND = 200  # re-replication: new copies started per housekeeping round, at most (and `bandwidth`)
MAX_BATCH = 2000  # changes per `repl` batch
# Batches sent on a channel and not yet confirmed, per replica.  One: a replica's
# committer syncs one batch of writes at a time, so a second batch sent meanwhile
# would wait for the same next sync as the changes gathering here do (a round trip on
# loopback is far shorter than a disk sync); one batch in flight sends fewer, larger
# batches, whose deliveries acknowledged meanwhile go as no-ops (measured: 10-20 %
# less CPU per message than 4 in flight, no throughput lost; scripts/bench/RESULTS.md).
MAX_IN_FLIGHT = 1
ASYNC_LINGER = 0.02  # async: seconds changes gather before a batch goes (nothing waits for it)
BUGGIFY_LAG = 2.0  # ack-before-replica: how far the replicas lag behind (so a crash falls in the gap)
SEQ_BASE_SHIFT = 20  # a session's sequence numbers start at wall ms << 20 on each node start
COLLECT_GRACE_MS = 60_000  # a copy outlived by a newer claim goes this long after the claim
# A majority check before an orphaned will goes (members asked whether they answer)
# serves every will due within this long.
MAJORITY_FRESH = 1.0
ORPHAN_RECHECK = 5.0  # a due will that a replica ranked before this one holds: asked again after this
TAKEN_FOR = 30.0  # a copy a taker fetched: its will is the taker's this long (then the taker owns it)
# A will restored by an owner back from a crash waits this long after its start: a
# replica that sent it meanwhile tells it so once it sees it alive (`repl_nowill`).
RESTORED_WILL_GRACE = 5.0
# A member told that another sent a dead owner's will passes that on to the owner when
# it sees it back (the sender may be down then): kept this long, at most this many.
WILL_HEARD_FOR = 24 * 3600.0
WILLS_HEARD_MAX = 100_000
HEADER_META = "repl/"
DELIVERY_META = "repld/"
GIVEN_META = "replg/"  # a copy's `given` (changes.given_to_wire), written when it changes



class ReplicaQueries(Protocol):
    """Cluster queries (`routing.queries.MeshQueries`): the replication stream's transport."""

    def handle(self, query: str, handler: Callable[[str, Mapping[str, Any]], Awaitable[object]]) -> None: ...

    async def ask(self, peer: str, query: str, args: Mapping[str, object], timeout: float = ...) -> object: ...

    def handle_pipelined(self, query: str,
                         handler: Callable[[str, Mapping[str, Any]], tuple[object, trio.Event | None]]) -> None: ...

    async def open_channel(self, peer: str, query: str, timeout: float = ...) -> QueryChannel: ...


class Members(Protocol):
    def alive_members(self) -> list[str]: ...


class SessionsHost(Protocol):
    """What replication reads of the broker, and how it wakes the acknowledgements."""

    @property
    def sessions(self) -> dict[str, Session]: ...

    def on_durable(self) -> None: ...

    def merge_session(self, stored: StoredSession, now: float, *, ahead_of: int | None = None) -> int: ...

    @property
    def remembered(self) -> dict[str, set[tuple[str | None, int]]]: ...

    def remember(self, client_id: str, keys: Iterable[tuple[str | None, int]]) -> None: ...

    def publish_will(self, client_id: str, will: Will, now: float) -> None: ...

    def cancel_will(self, client_id: str) -> bool: ...


class ReplicaStore(Protocol):
    @property
    def write_epoch(self) -> int: ...

    @property
    def write_failed(self) -> str | None: ...

    def put_meta(self, key: str, value: object) -> None: ...

    def delete_meta(self, key: str) -> None: ...

    def put_replica_delivery(self, client_id: str, seq: int, encoder: Callable[..., bytes], *args: Any) -> None: ...

    def delete_replica_deliveries(self, client_id: str, seqs: Iterable[int]) -> None: ...

    def delete_replica_copy(self, client_id: str) -> None: ...

    def when_locally_durable(self, epoch: int, callback: Callable[[], None]) -> None: ...

    def hold_durable(self, floor: int | None) -> None: ...

    def hold_exchanges(self, floor: int | None) -> None: ...

    @property
    def exchanges_waiting(self) -> bool: ...

    def on_session_change(self, tap: Any) -> None: ...


class HeldView(Protocol):
    """What the cluster owes unreachable members (`routing.cluster.Cluster`): held for
    them, or still unacknowledged on the link to them."""

    def held_messages(self, member: str) -> list[Message]: ...


class Sides(Protocol):
    """Which side of a netsplit may act for a member it sees dead
    (`netsplit.view.PartitionView`, passed in by the composition: replication sits
    below netsplit)."""

    def lost_to_majority(self, member: str) -> bool: ...

    def holds_majority(self, members: Iterable[str]) -> bool: ...


class Claims(Protocol):
    """The ownership register (`session_store.ownership`), read only."""

    def get(self, client_id: str) -> Claim | None: ...


@dataclass
class ReplicationStats:
    changes: int = 0  # changes queued for replicas
    batches: int = 0  # batches confirmed by replicas
    channel_batches: int = 0  # of which sent on a channel (a stream kept open, batches pipelined)
    snapshots: int = 0  # snapshots sent (new, replaced or lagging replicas)
    replaced: int = 0  # replicas replaced for not answering
    resyncs: int = 0  # snapshots a replica asked for (a gap)
    applied: int = 0  # changes applied here as a replica
    refused_stale: int = 0  # batches refused here: their sender no longer owns the session
    takeovers: int = 0  # sessions taken over here from a replica
    orphan_wills: int = 0  # wills sent here for a session whose owner died and whose client never came back
    under_replicated: int = 0  # sessions owned here with fewer copies than session_replicas
    degraded_episodes: int = 0


@dataclass
class _Tracked:
    seq: int
    replicas: list[str] = field(default_factory=list)
    sinks: Sinks = field(default_factory=Sinks)  # the replicas' logs its delivery changes go to


class _Peer:
    def __init__(self, name: str) -> None:
        self.name = name
        self.outbox = Outbox()  # what waits to be sent
        # Batches sent and not yet confirmed, oldest first: (batch number, what it took, sent at).
        self.in_flight: deque[tuple[int, list[Taken], float]] = deque()
        self.wake = trio.Event()  # something queued, a batch confirmed, or the peer dropped
        self.flight = trio.Event()  # a batch sent, or the peer dropped
        self.confirmed_seq: dict[str, int] = {}  # per session: the last seq it confirmed
        self.channel_ok = False  # it said it serves `repl` channels (an older node does not)
        self.generation = 0  # one more each time the peer is dropped: its loops stop
        self.batches = 0  # batch numbers
        self.snapshot_in: dict[str, int] = {}  # session -> the last batch that carried its snapshot
        # session -> the highest delivery seq the replica may hold (a snapshot's, or a
        # delivery sent since): a delivery above it that is gone by the time a batch is
        # built was never sent, so its changes go as no-ops
        self.sent_delivery: dict[str, int] = {}
        self.resync_queued: set[str] = set()  # sessions whose snapshot a resync queued, not yet sent

    def lag(self, client_id: str) -> int:
        """Changes of `client_id` not yet confirmed."""
        return self.outbox.count(client_id) + sum(t.count for _, batch, _ in self.in_flight
                                                  for t in batch if t.client_id == client_id)

    def oldest(self) -> int | None:
        epochs = [t.epoch for _, batch, _ in self.in_flight for t in batch if t.epoch is not None]
        queued = self.outbox.oldest()
        if queued is not None:
            epochs.append(queued)
        return min(epochs) if epochs else None

    def dropped(self) -> None:
        self.sent_delivery.clear()
        self.outbox.clear()
        self.in_flight.clear()
        self.resync_queued.clear()
        self.generation += 1
        self.wake.set()
        self.flight.set()


class Replication:
    def __init__(self, *, node_id: str, copies: int, mode: str, store: ReplicaStore, broker: SessionsHost,
                 queries: ReplicaQueries, members: Members, clock: Clock,
                 recovered_meta: Mapping[str, object] | None = None, bandwidth: int = 0,
                 recovered_replica: Mapping[str, Mapping[int, bytes]] | None = None,
                 recovered_wills: Mapping[str, tuple[Will, float | None]] | None = None,
                 sides: Sides | None = None) -> None:
        self.node_id = node_id
        # A dead owner's will goes only from the side of a netsplit that holds the
        # majority (None: every side acts, as a node with no partition view)
        self.sides = sides
        # Re-replication's bound: bytes of snapshots per second for new copies (0: none),
        # spent from a budget each housekeeping round refills (one round's worth at most).
        self.bandwidth = bandwidth
        self._budget = float(bandwidth) * HOUSEKEEPING_INTERVAL
        self._started_this_round = 0
        self.copies = copies
        self.mode = mode
        self.store = store
        self.broker = broker
        self.queries = queries
        self.members = members
        self.clock = clock
        self.claims: Claims | None = None
        self.held: HeldView | None = None
        self.stats = ReplicationStats()
        self.copies_held: dict[str, ReplicaCopy] = {}
        self._tracked: dict[str, _Tracked] = {}
        self._peers: dict[str, _Peer] = {}
        self._failed: dict[str, float] = {}  # peer -> until when it is left out of placement
        self._no_copies: set[str] = set()  # members of a version without replication (`NO_COPIES_FOR`)
        self._floor: int | None = None
        self._exchange_floor: int | None = None  # async: what QoS 2 exchanges to subscribers wait for
        self._alive: tuple[str, ...] = ()
        self._seq_base = int(clock.wall() * 1000) << SEQ_BASE_SHIFT
        self._nursery: trio.Nursery | None = None
        self._degraded = False
        # The will record of each stored session that has one (the store keeps it apart
        # from the session; a snapshot carries it).
        self._wills: dict[str, bytes] = {cid: records.encode_will(*will) for cid, will in (recovered_wills or {}).items()}
        # Orphaned wills (`_send_orphan_wills`): members seen alive since this start,
        # since when each that is not any more has been seen dead (wall), copies whose
        # will is being sent or that a replica ranked before this one holds (until when
        # not to ask again), and copies a taker fetched (when).
        self._seen_alive: set[str] = set()
        self._dead_since: dict[str, float] = {}
        self._orphan_busy: dict[str, float] = {}
        self._taken: dict[str, float] = {}
        self._wills_sent: dict[str, str] = {}  # client id -> the dead owner whose will this node sent
        # client id -> (the dead owner whose will another member sent, until when kept)
        self._wills_heard: dict[str, tuple[str, float]] = {}
        # What a takeover here took, per client id: (the copy's owner, its sequence; -1
        # when no live member held one, a new session), and when: a copy of the same
        # owner's session that comes back later with more is merged (`_answer_merge`).
        self._took: dict[str, tuple[str, int, float]] = {}
        self._offering: set[str] = set()  # copies being offered to their session's new owner
        # The last check that members holding the majority answer (`_majority_answers`):
        # when it ended, its outcome, and the event of one running.
        self._majority_at = float("-inf")
        self._majority_ok = False
        self._majority_asking: trio.Event | None = None
        self._restore(recovered_meta or {}, recovered_replica or {})
        queries.handle("repl", self._answer_batch)
        queries.handle_pipelined("repl", self._answer_batch_pipelined)
        queries.handle("repl_seq", self._answer_seq)
        queries.handle("repl_take", self._answer_take)
        queries.handle("repl_drop", self._answer_drop)
        queries.handle("repl_held", self._answer_held)
        queries.handle("repl_nowill", self._answer_nowill)
        queries.handle("repl_merge", self._answer_merge)
        if copies > 1:
            store.on_session_change(self)

    # ------------------------------------------------------------ settings

    def use_claims(self, claims: Claims) -> None:
        """The ownership register, from the handoff driver that keeps it."""
        self.claims = claims

    def use_held(self, held: HeldView) -> None:
        """What the cluster holds for unreachable members."""
        self.held = held

    def set_setting(self, key: str, value: object) -> None:
        """`session_replicas` or `session_replication` changed cluster-wide."""
        if key == "session_replicas" and isinstance(value, int):
            was = self.copies
            self.copies = value
            if value > 1 and was <= 1:
                self.store.on_session_change(self)
            elif value <= 1 < was:
                self.store.on_session_change(None)
                self._tracked.clear()
                for peer in self._peers.values():
                    peer.outbox.clear()
            self._alive = ()  # placement again at the next round
        elif key == "session_replication" and value in ("sync", "async"):
            self.mode = str(value)
        self._update_floor()
        log.info("session replication: %d copies, %s", self.copies, self.mode)

    # ------------------------------------------------------------ the owner's side (the store's tap)

    def _owns(self, client_id: str) -> bool:
        claims = self.claims
        if claims is None:
            return False
        claim = claims.get(client_id)
        return claim is not None and claim.owner == self.node_id

    def _candidates(self) -> list[str]:
        now = self.clock.now()
        return [m for m in self.members.alive_members() if self._failed.get(m, 0.0) <= now]

    def _track(self, client_id: str) -> _Tracked | None:
        tracked = self._tracked.get(client_id)
        if tracked is not None:
            return tracked
        if self.copies <= 1 or not self._owns(client_id) or client_id not in self.broker.sessions:
            return None
        self._seq_base += 1 << 8  # distinct from any earlier run of this session here
        tracked = self._tracked[client_id] = _Tracked(self._seq_base)
        for peer in replicas_for(client_id, self.node_id, self._candidates(), self.copies):
            self._add_replica(client_id, tracked, peer, None)
        return tracked

    def _add_replica(self, client_id: str, tracked: _Tracked, peer: str, epoch: int | None) -> None:
        tracked.replicas.append(peer)
        self._enqueue(peer, epoch, client_id, tracked.seq, "S", None, None)

    def _peer(self, peer_name: str) -> _Peer:
        peer = self._peers.get(peer_name)
        if peer is None:
            peer = self._peers[peer_name] = _Peer(peer_name)
            if self._nursery is not None:
                self._nursery.start_soon(self._send_loop, peer)
        return peer

    def _enqueue(self, peer_name: str, epoch: int | None, client_id: str, seq: int, kind: str, a: Any, b: Any) -> None:
        peer = self._peer(peer_name)
        peer.outbox.add(epoch, client_id, seq, kind, a, b)
        peer.wake.set()

    def _change(self, client_id: str, kind: str, a: object, b: object) -> None:
        tracked = self._track(client_id)
        if tracked is None or not tracked.replicas:
            return  # no copy to tell (a node alone): a new one starts from a snapshot
        tracked.seq += 1
        epoch = self.store.write_epoch
        self.stats.changes += 1
        for peer in tracked.replicas:
            self._enqueue(peer, epoch, client_id, tracked.seq, kind, a, b)
        if tracked.replicas and (self._exchange_floor if self.mode == "async" else self._floor) is None:
            self._update_floor()

    def session_changed(self, client_id: str, expiry_interval: int, protocol_level: int,
                        disconnected_at: float | None, next_seq: int) -> None:
        self._change(client_id, "m", (expiry_interval, protocol_level, disconnected_at), next_seq)

    def session_deleted(self, client_id: str) -> None:
        self._wills.pop(client_id, None)
        tracked = self._tracked.get(client_id)
        if tracked is None:
            return
        self._change(client_id, "x", None, None)
        del self._tracked[client_id]
        for peer in self._peers.values():
            peer.confirmed_seq.pop(client_id, None)

    def subscription_changed(self, client_id: str, topic_filter: str, options: SubscriptionOptions | None) -> None:
        self._change(client_id, "s", topic_filter, options)

    def delivery_changed(self, client_id: str, delivery: Delivery, state: int) -> None:
        # This runs for every change of every delivery (two or three per message): the
        # change is appended to the session's log in each replica's outbox, found
        # through its `Sinks` (asked for again only when the replicas changed or an
        # outbox took the log); a batch reads each delivery's last state off the log.
        tracked = self._tracked.get(client_id)
        if tracked is None:
            tracked = self._track(client_id)
            if tracked is None:
                return
        replicas = tracked.replicas
        if not replicas:
            return
        tracked.seq = seq = tracked.seq + 1
        self.stats.changes += 1
        sinks = tracked.sinks
        if sinks.replicas != replicas:
            self._sink(client_id, tracked, seq)
        change = (seq, "d", delivery, state)
        for log in sinks.logs:
            log.append(change)

    def _sink(self, client_id: str, tracked: _Tracked, seq: int) -> None:
        """Point the session's sinks at the log of each replica's outbox (started at
        `seq` where it has none), and wake the senders that have something new."""
        sinks = tracked.sinks
        epoch = self.store.write_epoch
        logs = []
        for name in tracked.replicas:
            peer = self._peer(name)
            logs.append(peer.outbox.log_of(client_id, seq, epoch, sinks))
            peer.wake.set()
        sinks.logs = logs
        sinks.replicas = list(tracked.replicas)
        if (self._exchange_floor if self.mode == "async" else self._floor) is None:
            self._update_floor()

    def qos2_in_changed(self, client_id: str, packet_id: int, present: bool) -> None:
        self._change(client_id, "q", packet_id, present)

    def will_changed(self, client_id: str, will: Will | None, due_at: float | None) -> None:
        if will is None:
            record = self._wills.pop(client_id, None)
            if record is None:
                return  # none to remove (a connection without a will ended)
        else:
            record = self._wills[client_id] = records.encode_will(will, due_at)
        self._change(client_id, "w", None if will is None else record, None)

    def _encode(self, client_id: str, seq: int, kind: str, a: Any, b: Any) -> list[object] | None:
        if kind == "d":
            return changes.delivery_change(seq, a, b)
        if kind == "m":
            return changes.meta_change(seq, a[0], a[1], a[2], b)
        if kind == "s":
            return changes.subscription_change(seq, a, b)
        if kind == "q":
            return changes.qos2_change(seq, a, b)
        if kind == "x":
            return changes.end_change(seq)
        if kind == "w":
            return changes.will_change(seq, a)
        session = self.broker.sessions.get(client_id)
        tracked = self._tracked.get(client_id)
        if session is None or tracked is None:
            return None
        self.stats.snapshots += 1
        return changes.snapshot_change(tracked.seq, session, self._wills.get(client_id))

    def _stamp(self, client_id: str) -> object:
        """This node's own claim on the session (None once another node's is newer)."""
        claim = self.claims.get(client_id) if self.claims is not None else None
        return claim.stamp.to_wire() if claim is not None and claim.owner == self.node_id else None

    def _update_floor(self) -> None:
        """Hold the store's durable epoch below the oldest change a replica has not
        confirmed (sync mode), and wake the acknowledgements when it moves.  `async`:
        the same floor holds only the QoS 2 exchanges to subscribers (a PUBLISH or
        PUBREL leaves once its packet id state is on the replicas, so a takeover sends
        it again under the same id: exactly once), computed only while one waits."""
        floor: int | None = None
        exchanges: int | None = None  # sync: the durable floor holds the exchanges too
        if self.mode == "sync" and not faults.ACK_BEFORE_REPLICA:
            floor = self._oldest_unconfirmed()
        elif self.mode == "async" and any(p.outbox or p.in_flight for p in self._peers.values()):
            exchanges = self._exchange_floor
            if exchanges is None or self.store.exchanges_waiting:
                exchanges = self._oldest_unconfirmed()
            # else: kept (lower than it may be now: an exchange would wait a little longer)
        if exchanges != self._exchange_floor:
            self._exchange_floor = exchanges
            self.store.hold_exchanges(exchanges)
            self.broker.on_durable()
        if floor != self._floor:
            self._floor = floor
            self.store.hold_durable(floor)
            self.broker.on_durable()

    def _oldest_unconfirmed(self) -> int | None:
        """Every change up to this epoch is on every replica (None: every change is)."""
        oldest = [o for o in (p.oldest() for p in self._peers.values()) if o is not None]
        return min(oldest) - 1 if oldest else None

    def backlog(self) -> int:
        """Sessions owned here still short of a copy they could have (re-replication
        is bounded per round)."""
        if self.copies <= 1:
            return 0
        wanted = min(self.copies - 1, len(self._candidates()) - (1 if self.node_id in self._candidates() else 0))
        return sum(1 for t in self._tracked.values() if len(t.replicas) < wanted)

    def lag(self) -> int:
        """Changes not yet confirmed by their replicas (the async mode's lag)."""
        return sum(len(p.outbox) + sum(t.count for _, b, _ in p.in_flight for t in b) for p in self._peers.values())

    async def _send_loop(self, peer: _Peer) -> None:
        """Send what is queued for one replica: over a channel (one stream kept open,
        `MAX_IN_FLIGHT` batches unconfirmed at once) once the replica said it serves
        one, else one `repl` query at a time (an older replica; and the first batch,
        whose answer says)."""
        while True:
            while not peer.outbox:
                peer.wake = trio.Event()
                await peer.wake.wait()
            if faults.ACK_BEFORE_REPLICA:
                await trio.sleep(BUGGIFY_LAG)  # BUGGIFY: the replicas lag behind what was acknowledged
            if peer.name not in self._alive_set():
                self._drop_peer(peer, "not alive")
                continue
            if peer.channel_ok:
                await self._run_channel(peer)
                continue
            generation = peer.generation
            number, taken, request = self._next_batch(peer)
            peer.in_flight.append((number, taken, self.clock.now()))
            try:
                reply = await self.queries.ask(peer.name, "repl", {"b": request}, timeout=REPLICA_TIMEOUT)
            except (QueryFailed, OSError, trio.BrokenResourceError) as exc:
                if peer.generation == generation:
                    if _holds_no_copies(exc):
                        self._leave_out(peer, str(exc))
                    else:
                        self._replace(peer, str(exc) or type(exc).__name__)
                continue
            if peer.generation == generation:
                peer.in_flight.popleft()
                peer.channel_ok = isinstance(reply, dict) and reply.get("ch") == 1
                self._confirmed(peer, number, taken, reply)

    async def _run_channel(self, peer: _Peer) -> None:
        """One channel to the replica, until it fails (the replica is replaced) or the
        peer is dropped: a task sends batches while fewer than `MAX_IN_FLIGHT` are
        unconfirmed, another takes the confirmations in order."""
        generation = peer.generation
        try:
            channel = await self.queries.open_channel(peer.name, "repl", timeout=REPLICA_TIMEOUT)
        except (QueryFailed, OSError, trio.BrokenResourceError) as exc:
            if peer.generation == generation:
                peer.channel_ok = False
                self._replace(peer, str(exc) or type(exc).__name__)
            return
        failed: list[str] = []

        async def send() -> None:
            while peer.generation == generation:
                if not peer.outbox or len(peer.in_flight) >= MAX_IN_FLIGHT:
                    peer.wake = trio.Event()
                    await peer.wake.wait()
                    continue
                if faults.ACK_BEFORE_REPLICA:
                    await trio.sleep(BUGGIFY_LAG)  # BUGGIFY: the replicas lag behind what was acknowledged
                    if peer.generation != generation:
                        return
                if self.mode == "async" and ASYNC_LINGER:
                    # Nothing waits for an async replica: changes gather a while, and a
                    # delivery acknowledged meanwhile never goes (a replica follows within
                    # about this, plus a round trip).
                    await trio.sleep(ASYNC_LINGER)
                    if peer.generation != generation:
                        return
                if peer.name not in self._alive_set():
                    self._drop_peer(peer, "not alive")
                    return
                number, taken, request = self._next_batch(peer, compact=True)
                peer.in_flight.append((number, taken, self.clock.now()))
                peer.flight.set()
                await channel.send({"b": request})

        async def confirm() -> None:
            while peer.generation == generation:
                if not peer.in_flight:
                    peer.flight = trio.Event()
                    await peer.flight.wait()
                    continue
                # Not below zero: after a pause of this process (SIGSTOP, a long GC, a
                # loop blocked for seconds) the batch is already late; trio refuses a
                # negative timeout, and that ended the node.
                left = max(0.0, peer.in_flight[0][2] + REPLICA_TIMEOUT - self.clock.now())
                with trio.move_on_after(left) as scope:
                    reply = await channel.reply()
                if scope.cancelled_caught:
                    raise QueryFailed(f"no answer within {REPLICA_TIMEOUT:g} s")
                if peer.generation != generation:
                    return
                number, taken, _ = peer.in_flight.popleft()
                self.stats.channel_batches += 1
                self._confirmed(peer, number, taken, reply)
                peer.wake.set()  # room for another batch

        async def until_either_ends(task: Callable[[], Awaitable[None]], nursery: trio.Nursery) -> None:
            try:
                await task()
            except (QueryFailed, OSError, trio.BrokenResourceError) as exc:
                failed.append(str(exc) or type(exc).__name__)
            nursery.cancel_scope.cancel()

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(until_either_ends, send, nursery)
                nursery.start_soon(until_either_ends, confirm, nursery)
        finally:
            await channel.aclose()
        if failed and peer.generation == generation:
            # Asked again with a plain query first: a replica back as an older
            # version serves no channel.
            peer.channel_ok = False
            self._replace(peer, failed[0])

    def _next_batch(self, peer: _Peer, compact: bool = False) -> tuple[int, list[Taken], list[list[object]]]:
        """Take about `MAX_BATCH` queued changes: (batch number, what it took, the request).
        Each delivery goes in its last state (`replication.outbox`), the sequence
        numbers between as no-ops: a subscriber that keeps up costs a replica next to
        nothing.  `compact` (a channel: the replica is of a version that reads it):
        no-ops in a row go as one skip."""
        peer.batches += 1
        number = peer.batches
        taken = peer.outbox.take(MAX_BATCH, compact)
        sent_delivery = peer.sent_delivery
        request: list[list[object]] = []
        for part in taken:
            cid = part.client_id
            out: list[list[object]] = []
            previous = part.first - 1  # the last sequence number accounted for
            run_first = run = 0  # the no-ops in a row that end `out` (compact: one skip)
            snapped: int | None = None  # a snapshot sent here: the number it stands at

            def noops(first: int, last: int) -> None:
                """No-ops for `first` .. `last` (a delivery's earlier states)."""
                nonlocal run, run_first
                if last < first:
                    return
                if not compact:
                    out.extend(changes.noop_change(seq) for seq in range(first, last + 1))
                elif run and run_first + run == first:
                    run += last - first + 1
                    out[-1] = changes.skip_change(run_first, run)
                else:
                    run_first, run = first, last - first + 1
                    out.append(changes.noop_change(first) if run == 1 else changes.skip_change(first, run))

            # The highest delivery seq the replica may hold once it has this batch
            # (`sent`), and before it (`had`: what earlier batches and a snapshot in
            # this one gave it).  A batch takes each delivery once, in its last state:
            # one gone whose seq is above `had` never was on the replica, even if a
            # later delivery went in this batch.
            sent = had = sent_before = sent_delivery.get(cid, 0)
            skipped = 0  # the number of the last change skipped since `previous`: its no-ops are due
            for seq, kind, a, b in part.items:
                if snapped is not None and seq <= snapped:
                    continue  # the snapshot sent in this batch has it
                if kind == "d":
                    if b == NO_RECORD:
                        if a.seq > had and a.qos != 2:
                            # Gone before the replica ever had it: nothing to delete there
                            # (a QoS 2 one goes: the replica keeps its key,
                            # `ReplicaCopy.given`).  A no-op, sent with the next gap.
                            skipped = seq
                            continue
                    elif a.seq > sent:
                        sent = a.seq
                change = self._encode(cid, seq, kind, a, b)
                if change is None:
                    continue
                if kind == "S":
                    snapped = self._tracked[cid].seq
                    peer.snapshot_in[cid] = number
                    peer.resync_queued.discard(cid)
                    session = self.broker.sessions.get(cid)
                    sent = had = session.next_seq - 1 if session is not None else 0
                    out.append(change)
                    run = 0
                    previous = max(previous, snapped)
                    continue
                noops(previous + 1, seq - 1 if skipped < seq else skipped)
                out.append(change)
                run = 0
                previous = max(previous, seq, skipped)
            noops(previous + 1, skipped)
            if sent != sent_before or snapped is not None:
                sent_delivery[cid] = sent
            if out:
                request.append([cid, self._stamp(cid), out])
        return number, taken, request

    def _confirmed(self, peer: _Peer, number: int, taken: list[Taken], reply: object) -> None:
        """The replica has batch `number` on its disk (and says which sessions it needs
        a snapshot of, and which another node owns now)."""
        self.stats.batches += 1
        for part in taken:
            if part.client_id in self._tracked:
                peer.confirmed_seq[part.client_id] = max(part.last, peer.confirmed_seq.get(part.client_id, 0))
        resync, stale = _reply_lists(reply)
        for cid in stale:
            self.stats.refused_stale += 1
            log.info("session %s: %s holds a newer claim; not replicating it from here", cid, peer.name)
            self._tracked.pop(cid, None)
        for cid in resync:
            tracked = self._tracked.get(cid)
            # Batches sent after this one met the same gap: one snapshot answers them all.
            if tracked is None or peer.name not in tracked.replicas or cid in peer.resync_queued \
                    or peer.snapshot_in.get(cid, 0) > number:
                continue
            self.stats.resyncs += 1
            epochs = [t.epoch for t in taken if t.client_id == cid and t.epoch is not None]
            peer.outbox.snapshot_first(min(epochs) if epochs else None, cid, tracked.seq)
            peer.resync_queued.add(cid)
        self._update_floor()

    def _alive_set(self) -> set[str]:
        return set(self.members.alive_members())

    def _drop_peer(self, peer: _Peer, why: str) -> int | None:
        """Forget what waits for a peer that is gone; return the oldest epoch it held."""
        oldest = peer.oldest()
        peer.dropped()
        for cid, tracked in self._tracked.items():
            if peer.name in tracked.replicas:
                tracked.replicas.remove(peer.name)
        log.debug("replica %s dropped (%s)", peer.name, why)
        self._alive = ()  # placement again
        self._place(inherit=oldest)
        self._update_floor()
        return oldest

    def _replace(self, peer: _Peer, why: str) -> None:
        self.stats.replaced += 1
        self._failed[peer.name] = self.clock.now() + FAILED_FOR
        log.warning("replica %s failed (%s): marked failed for %g s, its sessions get another member",
                    peer.name, why, FAILED_FOR)
        self._drop_peer(peer, why)

    def _leave_out(self, peer: _Peer, why: str) -> None:
        """A member that cannot hold copies (an older version): left out of placement,
        said once (INFO), not counted as a replaced replica."""
        if peer.name not in self._no_copies:
            self._no_copies.add(peer.name)
            log.info("member %s holds no session copies (%s): left out of placement for %g s or until it restarts",
                     peer.name, why, NO_COPIES_FOR)
        self._failed[peer.name] = self.clock.now() + NO_COPIES_FOR
        self._drop_peer(peer, why)

    def _place(self, inherit: int | None = None) -> None:
        """Bring every tracked session's replicas in line with the live members: new
        copies start from a snapshot (at most `SNAPSHOTS_PER_ROUND` per round), copies
        on members no longer chosen are ended there."""
        candidates = self._candidates()
        alive = tuple(sorted(candidates))
        if alive == self._alive and inherit is None:
            return
        self._alive = alive
        under = 0
        for cid, tracked in list(self._tracked.items()):
            if not self._owns(cid):
                del self._tracked[cid]
                continue
            wanted = replicas_for(cid, self.node_id, candidates, self.copies)
            for peer in [p for p in tracked.replicas if p not in wanted]:
                tracked.replicas.remove(peer)
                if peer in candidates:
                    self._enqueue(peer, None, cid, tracked.seq, "x", None, None)
            for peer in wanted:
                if peer not in tracked.replicas:
                    if not self._may_start(cid):
                        self._alive = ()  # the rest next round
                        break
                    self._add_replica(cid, tracked, peer, inherit)
            if len(tracked.replicas) < self.copies - 1:
                under += 1
        self._note_degraded(under)

    def _note_degraded(self, under: int) -> None:
        self.stats.under_replicated = under
        if under and not self._degraded:
            self._degraded = True
            self.stats.degraded_episodes += 1
            log.warning("session replication degraded: %d sessions have fewer than %d copies (%d members alive)",
                        under, self.copies, len(self._alive) + 1)
        elif not under and self._degraded:
            self._degraded = False
            log.info("session replication: every session has its %d copies again", self.copies)

    def _track_untracked(self) -> None:
        """Sessions owned here that no change has brought in yet (restored at start, or
        the setting was raised): start their copies, a bounded number per round."""
        if self.copies <= 1 or self.claims is None:
            return
        for cid, session in self.broker.sessions.items():
            if session.persistent and cid not in self._tracked and self._owns(cid):
                if not self._may_start(cid):
                    return
                self._track(cid)

    def _may_start(self, client_id: str) -> bool:
        """Whether a new copy of `client_id`'s session may start this round (at most
        `SNAPSHOTS_PER_ROUND`, and within `bandwidth`: one larger than a round's budget
        still goes, alone, so nothing waits for ever), spending its snapshot's size."""
        if self._started_this_round >= SNAPSHOTS_PER_ROUND:
            return False
        if self.bandwidth:
            if self._budget <= 0:
                return False
            session = self.broker.sessions.get(client_id)
            self._budget -= changes.snapshot_size(session) if session is not None else 0
        self._started_this_round += 1
        return True

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for peer in self._peers.values():
                nursery.start_soon(self._send_loop, peer)
            while True:
                await trio.sleep(HOUSEKEEPING_INTERVAL)
                self.housekeeping()

    def housekeeping(self) -> None:
        self._started_this_round = 0
        self._budget = min(self._budget + self.bandwidth * HOUSEKEEPING_INTERVAL, float(self.bandwidth) * HOUSEKEEPING_INTERVAL)
        alive = self._alive_set()
        for name in self._no_copies - alive:
            # Gone (restarted, perhaps as a newer version): asked again once it is back.
            self._no_copies.discard(name)
            self._failed.pop(name, None)
        for name, peer in list(self._peers.items()):
            if name not in alive and (peer.outbox or peer.in_flight or any(name in t.replicas for t in self._tracked.values())):
                self._drop_peer(peer, "left the live members")
        self._track_untracked()
        self._place()
        # Counted every round, not only when the members change: sessions come and go,
        # and a node alone from its start (no change at all) runs degraded too.
        wanted = self.copies - 1
        self._note_degraded(sum(1 for t in self._tracked.values() if len(t.replicas) < wanted) if wanted > 0 else 0)
        self._collect_copies(alive)
        self._send_orphan_wills(alive)
        self._update_floor()

    # ------------------------------------------------------------ the replica's side

    def _restore(self, meta: Mapping[str, object], replica: Mapping[str, Mapping[int, bytes]]) -> None:
        for key, value in meta.items():
            if key.startswith(HEADER_META):
                cid = key[len(HEADER_META):]
                try:
                    self.copies_held[cid] = ReplicaCopy.from_header(cid, value)
                except ChangeError as exc:
                    log.error("ignoring the stored replica of %s: %s", cid, exc)
        for cid, records_of in replica.items():
            copy = self.copies_held.get(cid)
            if copy is None:
                self.store.delete_replica_copy(cid)  # its header went first (an end not finished)
                continue
            for dseq, data in records_of.items():
                try:
                    copy.deliveries[dseq] = changes.delivery_from_record(data, dseq)
                except ChangeError as exc:
                    log.error("ignoring a delivery of the stored replica of %s: %s", cid, exc)
        for key, value in meta.items():
            # An older version's delivery records (meta `repld/<client id>/<seq>`, CBOR):
            # read, and moved into the replica family (its later deletes go there).
            if key.startswith(DELIVERY_META):
                cid, _, number = key[len(DELIVERY_META):].rpartition("/")
                copy = self.copies_held.get(cid)
                self.store.delete_meta(key)
                if copy is not None and number.isdigit() and isinstance(value, list) and len(value) == 2:
                    copy.deliveries[int(number)] = value
                    self.store.put_replica_delivery(cid, int(number), changes.delivery_record, value[0], value[1])
            elif key.startswith(GIVEN_META):
                copy = self.copies_held.get(key[len(GIVEN_META):])
                if copy is None:
                    self.store.delete_meta(key)
                else:
                    copy.given = changes.given_from_wire(value)
        for cid, copy in self.copies_held.items():
            if copy.will_sent:  # sent before this restart: its owner is still to be told
                self._wills_sent[cid] = copy.owner

    def _persist(self, cid: str, applied: changes.Applied) -> None:
        store = self.store
        if applied.ended or applied.copy is None:
            store.delete_replica_copy(cid)
            store.delete_meta(HEADER_META + cid)
            store.delete_meta(GIVEN_META + cid)
            return
        if applied.deleted:
            store.delete_replica_deliveries(cid, applied.deleted)
        copy = applied.copy
        deliveries = copy.deliveries
        for dseq in applied.put:
            state, wire = deliveries[dseq]
            store.put_replica_delivery(cid, dseq, changes.delivery_record, state, wire)
        if applied.header:
            store.put_meta(HEADER_META + cid, copy.header())
        if applied.given:
            # Apart from the header (written with every batch): only when a QoS 2
            # delivery completed, so a takeover after a restart of this node still
            # skips those messages when they come late.
            if copy.given:
                store.put_meta(GIVEN_META + cid, changes.given_to_wire(copy.given))
            else:
                store.delete_meta(GIVEN_META + cid)

    def _drop_copy(self, cid: str) -> None:
        self._taken.pop(cid, None)
        copy = self.copies_held.pop(cid, None)
        if copy is not None:
            self._persist(cid, changes.Applied(None, deleted=list(copy.deliveries), ended=True))

    def _newer_claim(self, cid: str, sender: str, stamp: object) -> bool:
        """Whether this node knows a claim on `cid` newer than the sender's."""
        claim = self.claims.get(cid) if self.claims is not None else None
        if claim is None or claim.owner == sender:
            return False
        if stamp is None:
            return True
        try:
            return claim.stamp > HlcTimestamp.from_wire(stamp)
        except (TypeError, ValueError):
            return True

    async def _answer_batch(self, peer: str, args: Mapping[str, Any]) -> object:
        """A batch as a plain query (an older owner, or a newer one's first batch): the
        answer leaves once it is on this node's disk and says this node serves
        channels ("ch", which an older owner does not read)."""
        answer = self._apply_batch(peer, args)
        await self._locally_durable(peer)
        return {**answer, "ch": 1}

    def _answer_batch_pipelined(self, peer: str, args: Mapping[str, Any]) -> tuple[object, trio.Event]:
        """A batch on a channel: applied now, in the order the batches came; its answer
        leaves once it is on this node's disk (one disk sync answers every batch
        applied before it)."""
        answer = self._apply_batch(peer, args)
        done = trio.Event()
        self.store.when_locally_durable(self.store.write_epoch, done.set)
        return answer, done

    def _apply_batch(self, peer: str, args: Mapping[str, Any]) -> dict[str, object]:
        batch = args["b"]
        if not isinstance(batch, list):
            raise ValueError("a replication batch is a list")
        self._refuse_if_store_fails(peer)
        resync: list[str] = []
        stale: list[str] = []
        for item in batch:
            if not isinstance(item, list) or len(item) != 3 or not isinstance(item[0], str) or not isinstance(item[2], list):
                raise ValueError("a batch item is [client id, stamp, changes]")
            cid, stamp, session_changes = item
            if self._newer_claim(cid, peer, stamp):
                stale.append(cid)
                continue
            copy = self.copies_held.get(cid)
            if copy is not None and copy.owner != peer and _older(stamp, copy.stamp):
                stale.append(cid)
                continue
            try:
                applied = changes.apply_changes(copy, cid, peer, stamp, session_changes)
            except ChangeError as exc:
                log.info("replica of %s from %s: %s; asking for a snapshot", cid, peer, exc)
                resync.append(cid)
                continue
            self.stats.applied += len(session_changes)
            if copy is not None and applied.copy is not copy and copy.owner != peer:
                self._offer_copy(cid, copy, peer)  # replaced by the new owner's: what only it has goes there
            if applied.copy is None:
                self.copies_held.pop(cid, None)
            else:
                if copy is not None and copy.will_sent and applied.copy is not copy and applied.copy.owner == copy.owner:
                    applied.copy.will_sent = True  # a snapshot from the owner: it is still to be told
                self.copies_held[cid] = applied.copy
            self._persist(cid, applied)
            if applied.resync:
                resync.append(cid)
        return {"r": resync, "x": stale}

    def _refuse_if_store_fails(self, peer: str) -> None:
        """A replica whose disk does not take writes (full, failing) cannot keep a copy:
        it says so to the owner, which marks it failed and places the copy elsewhere."""
        failed = self.store.write_failed
        if failed is not None:
            log.warning("refusing the session copies of %s: this node's store cannot write (%s)", peer, failed)
            raise QueryRefused(f"replica store cannot write: {failed}")

    async def _locally_durable(self, peer: str | None = None) -> None:
        """Until every change so far is on this node's disk; for a replica's answer
        (`peer`), a disk that fails meanwhile ends the wait with a refusal."""
        done = trio.Event()
        self.store.when_locally_durable(self.store.write_epoch, done.set)
        while not done.is_set():
            with trio.move_on_after(WRITE_CHECK):
                await done.wait()
            if peer is not None and not done.is_set():
                self._refuse_if_store_fails(peer)

    async def _answer_seq(self, peer: str, args: Mapping[str, Any]) -> object:
        copy = self.copies_held.get(str(args["c"]))
        return {} if copy is None else {"s": copy.seq, "o": copy.owner, "h": copy.stamp}

    async def _answer_take(self, peer: str, args: Mapping[str, Any]) -> object:
        copy = self.copies_held.get(str(args["c"]))
        if copy is None:
            return {}
        self._taken[copy.client_id] = self.clock.now()  # its will is the taker's now
        # "g" (optional; an older taker skips it): what the session was given lately.
        return {"h": copy.header(), "d": [[dseq, state_wire[0], state_wire[1]] for dseq, state_wire in sorted(copy.deliveries.items())],
                "g": [list(key) for key in copy.given]}

    async def _answer_drop(self, peer: str, args: Mapping[str, Any]) -> object:
        cid, owner = str(args["c"]), str(args["o"])
        copy = self.copies_held.get(cid)
        if copy is not None and copy.owner != owner:
            self._drop_copy(cid)
            await self._locally_durable()
        return {}

    def _collect_copies(self, alive: set[str]) -> None:
        """Copies whose session another live node owns by a newer claim, or that ended
        (a released claim newer than the copy), go."""
        if self.claims is None:
            return
        now_ms = int(self.clock.wall() * 1000)
        for cid, copy in list(self.copies_held.items()):
            claim = self.claims.get(cid)
            if claim is None or claim.owner == copy.owner or _older(claim.stamp.to_wire(), copy.stamp):
                continue
            # A newer claim by a live node (or a release): after a grace, since the
            # claim of a takeover spreads before the taker has fetched this copy.
            if (claim.owner is None or claim.owner in alive or claim.owner == self.node_id) \
                    and now_ms - claim.stamp.wall_ms > COLLECT_GRACE_MS and cid not in self._offering:
                if claim.owner is not None and claim.owner != self.node_id:
                    self._offer_copy(cid, copy, claim.owner, drop=True)
                else:
                    self._drop_copy(cid)
        horizon = self.clock.now() - TOOK_FOR
        for cid in [cid for cid, (_, _, at) in self._took.items() if at < horizon]:
            del self._took[cid]

    # ------------------------------------------------------------ a copy back from the dead

    def _note_took(self, client_id: str, owner: str, seq: int) -> None:
        self._took[client_id] = (owner, seq, self.clock.now())

    def _offer_copy(self, cid: str, copy: ReplicaCopy, to: str, *, drop: bool = False) -> None:
        """A copy of a session another node owns now by a newer claim: offered to it
        before it goes (`drop`: dropped here after the answer, whatever it is).  This
        node may have been down when that node took the session over, and hold what
        the copy it took lacked (`_answer_merge`)."""
        if self._nursery is None or not copy.deliveries or copy.owner in self._alive_set():
            # (An owner alive handed its session over itself: the new owner has it all.)
            if drop:
                self._drop_copy(cid)
            return
        self._offering.add(cid)
        self._nursery.start_soon(self._offer, cid, copy, to, drop)

    async def _offer(self, cid: str, copy: ReplicaCopy, to: str, drop: bool) -> None:
        args = {"c": cid, "h": copy.header(), "g": [list(key) for key in copy.given],
                "d": [[dseq, state_wire[0], state_wire[1]] for dseq, state_wire in sorted(copy.deliveries.items())]}
        try:
            reply = await self.queries.ask(to, "repl_merge", args, timeout=REPLICA_TIMEOUT * 2)
            merged = reply.get("m") if isinstance(reply, dict) else None
            if merged:
                log.info("session %s: %d messages of the copy held here merged into %s's", cid, merged, to)
        except (QueryFailed, OSError, trio.BrokenResourceError) as exc:
            log.debug("session %s: offering the copy held here to %s failed (%s)", cid, to, exc)
        finally:
            self._offering.discard(cid)
            if drop and self.copies_held.get(cid) is copy:
                self._drop_copy(cid)

    async def _answer_merge(self, peer: str, args: Mapping[str, Any]) -> object:
        """A copy of a session this node took over, from a member that held it and was
        down then: merged when it is of the owner whose copy the takeover took (or
        looked for and found none) and newer than that copy, as the takeover would have
        taken it, had that member been up; each message with DUP=1 (the dead owner may
        have sent it), none that the session was given since (it remembers those).
        "m": how many were added."""
        cid = str(args["c"])
        copy = _copy_from_reply(cid, args)
        took = self._took.get(cid)
        if (took is None or took[0] != copy.owner or took[1] >= copy.seq or cid not in self.broker.sessions
                or not self._owns(cid) or cid not in self.broker.remembered):
            return {"m": 0}
        stored = copy.stored_session()
        for d in stored.queue:
            d.dup = True
        for _, d, _ in stored.inflight:
            d.dup = True
        self.broker.remember(cid, stored.remembered)
        added = self.broker.merge_session(StoredSession(cid, subscriptions=stored.subscriptions,
                                                        queue=[d for _, d, _ in stored.inflight] + stored.queue),
                                          self.clock.wall())
        self._note_took(cid, copy.owner, copy.seq)  # the same copy offered again adds nothing
        await self._locally_durable()
        log.warning("session %s: merged %d messages from the copy %s held (down at the takeover)", cid, added, peer)
        return {"m": added}

    # ------------------------------------------------------------ wills of orphaned copies

    def _orphaned(self, cid: str, copy: ReplicaCopy, alive: set[str]) -> bool:
        """Whether `copy`'s owner is dead and no one took its session over (no newer
        claim by anyone; the claim spreads with the takeover), as the majority side of
        a netsplit sees it from this side: a side without the majority may have cut
        the owner off while its client is still connected there, and sends nothing."""
        if copy.owner in alive or copy.owner == self.node_id or copy.owner not in self._dead_since:
            return False
        if self.sides is not None and not self.sides.lost_to_majority(copy.owner):
            return False
        claim = self.claims.get(cid) if self.claims is not None else None
        return claim is None or claim.owner == copy.owner

    def _send_orphan_wills(self, alive: set[str]) -> None:
        """Copies of sessions whose owner died with the will unsent: when a will is due
        (`orphan_wills.will_due`) and its client has not come back, the replica first in
        the session's rendezvous order that holds a copy sends it, once."""
        wall, now = self.clock.wall(), self.clock.now()
        for member in alive:
            first_seen = member not in self._seen_alive
            self._seen_alive.add(member)
            back = self._dead_since.pop(member, None) is not None
            if (back or first_seen) and (self._wills_sent or self._wills_heard) and self._nursery is not None:
                # Back (or seen for the first time since this node's start, which may
                # have come while it was down): the wills this node sent for it, or
                # heard another member sent (that one may be down now), must not go
                # again from its store.
                told = {cid for cid, owner in self._wills_sent.items() if owner == member}
                told.update(cid for cid, (owner, until) in self._wills_heard.items() if owner == member and until > now)
                for cid in told:
                    self._nursery.start_soon(self._tell_owner_will_sent, member, cid)
        for member in self._seen_alive - alive:
            # Only a member seen alive since this start: at a start, members not heard
            # yet are not dead.
            self._dead_since.setdefault(member, wall)
        if self._nursery is None or not self._dead_since:
            return
        for cid, copy in self.copies_held.items():
            # Cheapest first: every copy is looked at each round while a member is dead.
            if copy.will is None or copy.owner not in self._dead_since or self._orphan_busy.get(cid, 0.0) > now \
                    or not self._orphaned(cid, copy, alive):
                continue
            taken = self._taken.get(cid)
            if taken is not None and now - taken < TAKEN_FOR:
                continue
            try:
                _, due = orphan_wills.will_due(copy.will, copy.level, copy.disconnected_at, copy.expiry,
                                               self._dead_since[copy.owner])
            except records.RecordError as exc:
                log.warning("session %s: the will of its copy does not decode (%s); dropped", cid, exc)
                copy.will = None
                self.store.put_meta(HEADER_META + cid, copy.header())
                continue
            if due <= wall:
                self._orphan_busy[cid] = float("inf")
                self._nursery.start_soon(self._send_orphan_will, cid, copy.owner)

    async def _send_orphan_will(self, cid: str, owner: str) -> None:
        busy_until = 0.0
        try:
            before = orphan_wills.ranked_before(cid, self.node_id, owner, self.members.alive_members())
            holders: list[str] = []

            async def ask(peer: str) -> None:
                try:
                    reply = await self.queries.ask(peer, "repl_seq", {"c": cid}, timeout=TAKEOVER_ASK_TIMEOUT)
                except (QueryFailed, OSError, trio.BrokenResourceError):
                    return  # a member that cannot say is not the one to send it
                if isinstance(reply, dict) and isinstance(reply.get("s"), int):
                    holders.append(peer)

            async with trio.open_nursery() as nursery:
                for peer in before:
                    nursery.start_soon(ask, peer)
            if holders:
                busy_until = self.clock.now() + ORPHAN_RECHECK  # its will to send; asked again if it dies
                return
            if not await self._majority_answers():
                # The partition view can call this side the majority before it sees the
                # rest of a split go (members are found dead one at a time): members
                # that answer now are what counts.
                log.debug("session %s: members holding the majority do not answer; its will waits", cid)
                busy_until = self.clock.now() + ORPHAN_RECHECK
                return
            # Checked again after the asking: a taker may have fetched the copy or
            # claimed the session meanwhile, and a member may have cleared the will.
            copy = self.copies_held.get(cid)
            taken = self._taken.get(cid)
            if (copy is None or copy.will is None or copy.owner != owner
                    or (taken is not None and self.clock.now() - taken < TAKEN_FOR)
                    or not self._orphaned(cid, copy, set(self.members.alive_members()))):
                return
            will, _ = records.decode_will(copy.will)
            copy.will = None  # before it leaves: a takeover from this copy now finds no will
            copy.will_sent = True  # on disk with it: a restart of this node still tells the owner
            self.store.put_meta(HEADER_META + cid, copy.header())
            self.broker.publish_will(cid, will, self.clock.wall())
            self._wills_sent[cid] = owner
            self.stats.orphan_wills += 1
            log.info("session %s: its owner %s died and its client has not come back: its will sent here",
                     cid, owner)
            async with trio.open_nursery() as nursery:
                for peer in self.members.alive_members():
                    if peer not in (self.node_id, owner):
                        nursery.start_soon(self._tell_no_will, peer, cid, owner)
        finally:
            if busy_until:
                self._orphan_busy[cid] = busy_until
            else:
                self._orphan_busy.pop(cid, None)

    async def _majority_answers(self) -> bool:
        """Whether this node and the live members that answer a query now hold the
        majority of the last stable view (always, without a partition view).  One
        check serves every will for `MAJORITY_FRESH` seconds."""
        sides = self.sides
        if sides is None:
            return True
        if self.clock.now() - self._majority_at < MAJORITY_FRESH:
            return self._majority_ok
        running = self._majority_asking
        if running is not None:
            await running.wait()
            return self._majority_ok
        asking = self._majority_asking = trio.Event()
        answered: set[str] = set()

        async def ask(peer: str) -> None:
            try:
                await self.queries.ask(peer, "repl_seq", {"c": ""}, timeout=TAKEOVER_ASK_TIMEOUT)
            except QueryRefused:
                pass  # an older member: it answered
            except (QueryFailed, OSError, trio.BrokenResourceError):
                return
            answered.add(peer)

        try:
            async with trio.open_nursery() as nursery:
                for peer in self.members.alive_members():
                    nursery.start_soon(ask, peer)
            self._majority_ok = sides.holds_majority(answered)
            self._majority_at = self.clock.now()
        finally:
            self._majority_asking = None
            asking.set()
        return self._majority_ok

    async def _tell_no_will(self, peer: str, cid: str, owner: str) -> None:
        """Another copy's will goes too: sent once, whoever sends after this node dies."""
        try:
            await self.queries.ask(peer, "repl_nowill", {"c": cid, "o": owner}, timeout=REPLICA_TIMEOUT)
        except (QueryFailed, OSError, trio.BrokenResourceError) as exc:
            # An older member, or one gone: it may send the will again, but only after
            # this node is gone too (it ranks after this one).
            log.debug("session %s: %s not told its will was sent: %s", cid, peer, exc)

    async def _tell_owner_will_sent(self, owner: str, cid: str) -> None:
        try:
            await self.queries.ask(owner, "repl_nowill", {"c": cid, "o": owner}, timeout=REPLICA_TIMEOUT)
        except (QueryFailed, OSError, trio.BrokenResourceError):
            return  # an older owner, or gone again: asked again when it is back
        if self._wills_sent.get(cid) == owner:
            del self._wills_sent[cid]
        if self._wills_heard.get(cid, ("", 0.0))[0] == owner:
            del self._wills_heard[cid]
        copy = self.copies_held.get(cid)
        if copy is not None and copy.owner == owner and copy.will_sent:
            copy.will_sent = False
            self.store.put_meta(HEADER_META + cid, copy.header())

    async def _answer_nowill(self, peer: str, args: Mapping[str, Any]) -> object:
        """The will of a session another member sent: its copy here, or (the owner back
        from the dead) the will this node restored, does not go."""
        cid, owner = str(args["c"]), str(args["o"])
        if owner == self.node_id:
            if self.broker.cancel_will(cid):
                log.info("session %s: its will was sent by %s while this node was down; not sent again", cid, peer)
            return {}
        self._heard_will_sent(cid, owner)
        copy = self.copies_held.get(cid)
        if copy is not None and copy.owner == owner and copy.will is not None:
            copy.will = None
            self.store.put_meta(HEADER_META + cid, copy.header())
            await self._locally_durable()
        return {}

    def _heard_will_sent(self, cid: str, owner: str) -> None:
        """Another member sent the will of `owner`'s session `cid`: this node tells the
        owner when it sees it back too, in case the sender is down then (in memory, for
        `WILL_HEARD_FOR`: the sender keeps it on disk and tells the owner itself)."""
        now = self.clock.now()
        if len(self._wills_heard) >= WILLS_HEARD_MAX:
            self._wills_heard = {c: v for c, v in self._wills_heard.items() if v[1] > now}
            while len(self._wills_heard) >= WILLS_HEARD_MAX:
                del self._wills_heard[next(iter(self._wills_heard))]
        self._wills_heard[cid] = (owner, now + WILL_HEARD_FOR)

    # ------------------------------------------------------------ takeover

    async def copy_for_takeover(self, client_id: str, owner: str) -> StoredSession | None:
        """The newest copy of `client_id`'s session among the live members (this one
        included), or None when no member holds one."""
        # Newest first by the owner's claim (sequence numbers of different owners do
        # not compare), then by sequence.
        best: tuple[tuple[HlcTimestamp, int], str] | None = None
        local = self.copies_held.get(client_id)
        if local is not None:
            best = ((_claim_key(local.stamp), local.seq), self.node_id)
        answers: dict[str, tuple[HlcTimestamp, int]] = {}

        async def ask(peer: str) -> None:
            try:
                reply = await self.queries.ask(peer, "repl_seq", {"c": client_id}, timeout=TAKEOVER_ASK_TIMEOUT)
            except (QueryFailed, OSError, trio.BrokenResourceError):
                return  # a member that cannot say holds nothing we can take
            if isinstance(reply, dict) and isinstance(reply.get("s"), int):
                answers[peer] = (_claim_key(reply.get("h")), reply["s"])

        async with trio.open_nursery() as nursery:
            for peer in self.members.alive_members():
                if peer not in (self.node_id, owner):
                    nursery.start_soon(ask, peer)
        for peer, key in sorted(answers.items()):
            if best is None or key > best[0]:
                best = (key, peer)
        self._note_took(client_id, owner, -1)  # until a copy is taken: a replica down now may have one
        if best is None:
            return None
        (_, seq), holder = best
        try:
            if holder == self.node_id:
                assert local is not None
                copy = local
            else:
                reply = await self.queries.ask(holder, "repl_take", {"c": client_id}, timeout=TAKEOVER_ASK_TIMEOUT * 2)
                copy = _copy_from_reply(client_id, reply)
            stored = copy.stored_session()
        except (QueryFailed, OSError, trio.BrokenResourceError, ChangeError) as exc:
            log.warning("session %s: the copy on %s could not be taken (%s)", client_id, holder, exc)
            return None
        self.stats.takeovers += 1
        self._note_took(client_id, copy.owner, copy.seq)
        log.info("session %s taken over from the replica on %s (seq %d, %d queued, %d in flight; owner %s unreachable)",
                 client_id, holder, seq, len(stored.queue), len(stored.inflight), owner)
        return stored

    def claim_of_copy(self, client_id: str) -> Claim | None:
        """The ownership claim the copy held here names (its owner's stamp when it last
        sent), or None: the owner's stream brings it, and a claim broadcast this node
        missed (gossip can lose one until the next exchange of states, tens of seconds)
        is known here that way."""
        copy = self.copies_held.get(client_id)
        if copy is None or copy.stamp is None:
            return None
        stamp = _claim_key(copy.stamp)
        return None if stamp is _NO_CLAIM else Claim(client_id, copy.owner, stamp)

    async def unclaimed_copy_owner(self, client_id: str) -> str | None:
        """For a CONNECT resuming a session whose claim this node never heard (its owner
        may have died before the claim spread): the owner of the newest copy held in
        the session's rendezvous replica set (the `copies` live members ranked first:
        the replicas were chosen so, with the owner among them or not), or None."""
        if self.copies <= 1:
            return None
        best: tuple[tuple[HlcTimestamp, int], str] | None = None
        local = self.copies_held.get(client_id)
        if local is not None:
            best = ((_claim_key(local.stamp), local.seq), local.owner)

        async def ask(peer: str) -> None:
            nonlocal best
            try:
                reply = await self.queries.ask(peer, "repl_seq", {"c": client_id}, timeout=UNCLAIMED_ASK_TIMEOUT)
            except (QueryFailed, OSError, trio.BrokenResourceError):
                return  # as if it held none: the CONNECT starts a new session, as without a copy
            if isinstance(reply, dict) and isinstance(reply.get("s"), int) and isinstance(reply.get("o"), str):
                key = (_claim_key(reply.get("h")), reply["s"])
                if best is None or key > best[0]:
                    best = (key, reply["o"])

        async with trio.open_nursery() as nursery:
            for peer in ranked(client_id, self.members.alive_members())[:self.copies]:
                if peer != self.node_id:
                    nursery.start_soon(ask, peer)
        return best[1] if best is not None else None

    async def held_for(self, client_id: str, owner: str,
                       subscriptions: Mapping[str, SubscriptionOptions]) -> list[Delivery]:
        """The messages live members (this one too) hold for the dead `owner` that
        the session's subscriptions match: the owner may never come back for them."""
        wire_subs = [[f, [o.qos, o.no_local, o.retain_as_published, o.retain_handling, o.subscription_id]]
                     for f, o in subscriptions.items() if not f.startswith("$share/")]
        if not wire_subs:
            return []
        found: list[list[object]] = list(self._held_matching(owner, wire_subs))

        async def ask(peer: str) -> None:
            try:
                reply = await self.queries.ask(peer, "repl_held", {"o": owner, "s": wire_subs},
                                               timeout=TAKEOVER_ASK_TIMEOUT)
            except (QueryFailed, OSError, trio.BrokenResourceError):
                return
            if isinstance(reply, list):
                found.extend(item for item in reply if isinstance(item, list))

        async with trio.open_nursery() as nursery:
            for peer in self.members.alive_members():
                if peer not in (self.node_id, owner):
                    nursery.start_soon(ask, peer)
        out: list[Delivery] = []
        seen: set[tuple[object, object]] = set()
        for wire in found:
            try:
                delivery = delivery_from_wire(wire)
            except HandoffError:
                continue
            key = (delivery.message.origin, delivery.message.msg_id)
            if key not in seen:
                seen.add(key)
                delivery.seq = 0  # numbered by the session it joins
                delivery.dup = True  # forwarded to the owner, unacknowledged: it may have sent it
                out.append(delivery)
        return out

    def _held_matching(self, owner: str, wire_subs: list[Any]) -> list[list[object]]:
        if self.held is None:
            return []
        out: list[list[object]] = []
        for msg in self.held.held_messages(owner):
            matching = [o for f, o in wire_subs if isinstance(f, str) and topic_matches(f, msg.topic)]
            if not matching:
                continue
            qos = min(msg.qos, max(int(o[0]) for o in matching))
            retain = msg.retain and any(bool(o[2]) for o in matching)
            ids = tuple(int(o[4]) for o in matching if o[4])
            out.append(delivery_to_wire(Delivery(msg, qos, retain, ids)))
        return out

    async def _answer_held(self, peer: str, args: Mapping[str, Any]) -> object:
        subs = args["s"]
        if not isinstance(subs, list):
            raise ValueError("subscriptions are a list")
        return self._held_matching(str(args["o"]), subs)

    def taken_over(self, client_id: str, owner: str, *, direct_from: int | None = None) -> None:
        """This node owns the session now: its own copy goes, and so do the others'
        (the new replicas get snapshots); what members go on holding for the dead
        owner (forwards that were on their way to it) is fetched for a while, and
        merged with what reached the session directly from delivery `direct_from` on
        in its origins' order."""
        self._drop_copy(client_id)
        if self._nursery is not None:
            for peer in self.members.alive_members():
                if peer != self.node_id:
                    self._nursery.start_soon(self._tell_drop, peer, client_id)
            self._nursery.start_soon(self._follow_held, client_id, owner, direct_from)

    async def _follow_held(self, client_id: str, owner: str, direct_from: int | None = None) -> None:
        """Forwards a member had sent to the dead owner, unacknowledged, are held for
        it once the member sees it dead, which may come after the takeover (or the
        member could not be asked then: cut off from this node): they are fetched and
        merged (the session remembers what it had) for `FOLLOW_HELD_FOR` (an owner
        that is back took what was held for it: nothing is left to fetch).  They go
        ahead of the newer messages of their origins still queued here (`ahead_of`),
        not behind them; one whose newer ones were sent to the client already comes
        after those (README "What a takeover from a replica cannot know")."""
        until = self.clock.now() + FOLLOW_HELD_FOR
        while self.clock.now() < until:
            await trio.sleep(FOLLOW_HELD_EVERY)
            session = self.broker.sessions.get(client_id)
            if session is None or not self._owns(client_id):
                return
            found = await self.held_for(client_id, owner, dict(session.subscriptions))
            if found:
                added = self.broker.merge_session(StoredSession(client_id, queue=found), self.clock.wall(),
                                                  ahead_of=direct_from)
                if added:
                    log.info("session %s: %d messages held for %s merged", client_id, added, owner)

    async def _tell_drop(self, peer: str, client_id: str) -> None:
        try:
            await self.queries.ask(peer, "repl_drop", {"c": client_id, "o": self.node_id}, timeout=REPLICA_TIMEOUT)
        except (QueryFailed, OSError, trio.BrokenResourceError):
            pass  # the copy there goes at its next collection instead

    # ------------------------------------------------------------ operator

    def describe(self, client_id: str) -> dict[str, Any] | None:
        """One session's replication as its owner sees it (`meshd ctl sessions show
        ID`): copies wanted, mode, the epoch (its ownership claim's HLC stamp), its
        sequence, and per replica the sequence it confirmed and how many changes it
        lags.  None when the session is not replicated (`session_replicas` 1)."""
        if self.copies <= 1:
            return None
        claim = self.claims.get(client_id) if self.claims is not None else None
        out: dict[str, Any] = {"copies": self.copies, "mode": self.mode,
                               "epoch": str(claim.stamp) if claim is not None else None}
        tracked = self._tracked.get(client_id)
        if tracked is not None:
            out["seq"] = tracked.seq
            replicas = []
            for p in tracked.replicas:
                peer = self._peers.get(p)
                lag = 0 if peer is None else peer.lag(client_id)
                replicas.append({"node": p, "seq": peer.confirmed_seq.get(client_id) if peer else None, "lag": lag})
            out["replicas"] = replicas
            out["under_replicated"] = len(tracked.replicas) < self.copies - 1
        return out


_NO_CLAIM = HlcTimestamp(-1, 0, "")


def _claim_key(stamp: object) -> HlcTimestamp:
    try:
        return HlcTimestamp.from_wire(stamp)
    except (TypeError, ValueError):
        return _NO_CLAIM


def _older(stamp: object, than: object) -> bool:
    """Whether claim stamp `stamp` (wire) is older than `than` (wire); unknown is older."""
    if than is None:
        return False
    if stamp is None:
        return True
    try:
        return HlcTimestamp.from_wire(stamp) < HlcTimestamp.from_wire(than)
    except (TypeError, ValueError):
        return True


def _holds_no_copies(exc: BaseException) -> bool:
    """Whether a failed `repl` query says the member is of a version without session
    replication: one without cluster queries closes the query unanswered, one with
    queries but not this one refuses it by name.  (A member that died while answering
    also closes it unanswered: it leaves the live members, which ends this.)"""
    return isinstance(exc, QueryUnanswered) or str(exc).startswith("unknown query")


def _reply_lists(reply: object) -> tuple[list[str], list[str]]:
    if not isinstance(reply, dict):
        return [], []
    resync = [c for c in reply.get("r", []) if isinstance(c, str)] if isinstance(reply.get("r"), list) else []
    stale = [c for c in reply.get("x", []) if isinstance(c, str)] if isinstance(reply.get("x"), list) else []
    return resync, stale


def _copy_from_reply(client_id: str, reply: object) -> ReplicaCopy:
    if not isinstance(reply, dict) or "h" not in reply or not isinstance(reply.get("d"), list):
        raise ChangeError("no copy there any more")
    copy = ReplicaCopy.from_header(client_id, reply["h"])
    for item in reply["d"]:
        if not isinstance(item, list) or len(item) != 3 or not isinstance(item[0], int):
            raise ChangeError("bad delivery in a copy")
        copy.deliveries[item[0]] = [item[1], item[2]]
    given = reply.get("g")
    for key in given if isinstance(given, list) else ():
        copy.note_gone(None, key)
    return copy
