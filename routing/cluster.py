"""The mesh: one broker seen through every node.

Glue between the broker, the route table (`routing.table`), gossip and the mesh links:

- local route changes (first local subscriber of a filter, last one gone) are batched
  per tick into `RouteDelta`s and disseminated by gossip (`route` broadcasts);
- deltas from peers update the remote trie; gaps and rejoined members are closed by
  pulling snapshots over a mesh link (`routes_req` with our digest); digests also ride
  gossip push-pull so any divergence is noticed within one push-pull period;
- a member declared dead loses its routes and its link fails what it had not
  acknowledged (those publishers are answered as if the peer were down);
- a publish is forwarded once to each remote node whose routes match (and, when
  retained, to every node, which keeps its own copy: retained messages are replicated,
  and a node that joins pulls the retained set from a peer); the receiving node
  delivers to its local subscribers only, so nothing loops.
"""

from __future__ import annotations

import functools
import logging
import random
from typing import Awaitable, Callable, Mapping, Protocol

import trio

import faults
from clock import Clock
from gossip.events import MemberState
from gossip.trace import Tracer
from gossip.wire import Envelope
from oplog import Event, log_event
from routing.forward import PLAIN_ONLY, PLAIN_REPLAY, ForwardTarget
from routing.batch import Unpacked, held_seqs, open_gates
from routing.contact import PEERS_META, Contact
from routing.handoff_driver import ClaimGossip, Handoffs, ReplicaSource, SessionHost
from routing.heap import HeapFreeze
from routing.held import HeldMessageRecord, HeldRoutesRecord, HeldTraffic
from routing.links import AckGate, Fields, Frame, InboundLinks, LinkGossip, LinkItem, OutboundLink, Queued, Reply
from routing.port import MeshPort
from routing.recent import RecentKeys
from routing.retained import RetainedIndex
from routing.table import RouteDelta, RouteSnapshot, digest_from_wire, digest_to_wire
from routing.wire import PeerDigest, RouteBroadcast
from session_store import records
from session_store.model import Message


log = logging.getLogger("meshd.cluster")

ROUTE_FLUSH_DELAY = 0.02  # coalesce route changes made in one burst into one delta
ROUTE_CHUNK_BYTES = 900  # route broadcasts must fit a gossip packet with room to spare
ANTI_ENTROPY_INTERVAL = 5.0
# Filters per `routes` answer when the asker says it takes part answers (`max` in its
# `routes_req`; it asks again while the answer says `more`): a whole table of a
# million routes in one frame would pass the frame limit (`gossip.wire.MAX_FRAME`, 8 MiB).
ROUTES_REPLY_FILTERS = 50_000
# Changes from the delta log per `routes` answer (the asker asks again while the answer
# says `more`): the answer is put in wire form and encoded in one step, and at a million
# routes over 10 nodes an origin busy with its own subscriptions answered each of nine
# peers with up to 50,000 changes at once (a fifth of its time in CBOR encoding during
# the preload, and it was declared dead).
ROUTE_CHANGES_PER_ANSWER = 10_000
# A pull from a peer that has not answered yet is not asked again before this long: a
# burst of out-of-order route deltas (a node that just took 100,000 subscriptions
# sends thousands) each found the table wanting and asked the whole table again,
# which at 10 nodes x 10,000 routes starved every event loop until members were
# declared dead and their routes dropped (scripts/bench/route_convergence.py --preload).
PULL_PATIENCE = 10.0
# Filters of pulled snapshots applied per slice (`RouteTable.settle`), the event loop
# free between two: a few milliseconds of trie work, so a node that takes a table of a
# million routes still answers gossip probes (one 100,000-filter snapshot applied in
# one go held a node for ~0.8 s, and at 10 nodes members were declared dead in turn).
ROUTE_SLICE = 2_000
HELD_EXPIRY_INTERVAL = 5.0
HEAP_CHECK_INTERVAL = 5.0  # how often a frozen heap is looked at for a thaw (routing.heap)
RECENT_PER_PEER = 20_000  # forwarded message identities remembered per peer (at least), to drop replayed copies
HELD_ROUTES = "held/"  # meta keys: held/<member> -> [filters, since]
HELD_MSG = "heldmsg/"  # heldmsg/<member>/<seq> -> [message, held at]
CLAIMS_SETTLE = 20.0  # after every member is heard again: ownership claims have spread (routing.contact)
CONTACT_CHECK_INTERVAL = 1.0  # how often routing.contact is told how long no member was heard
_GONE = (MemberState.DEAD, MemberState.LEFT)
_NO_GROUPS: list[tuple[str, str]] = []  # a forward's shared groups when it has none (never changed)
_NO_NODES: tuple[str, ...] = ()


class LocalBroker(SessionHost, Protocol):
    """What the cluster calls on this node's broker: deliver what peers forward, keep
    the retained set, release acknowledgements (and, for handoffs, `SessionHost`)."""

    @property
    def retained(self) -> RetainedIndex[Message]: ...

    @property
    def acks_wait_for_sync(self) -> bool: ...

    def keep_retained(self, msg: Message) -> None: ...

    def publish_remote(self, msg: Message, now: float, *, plain: bool, groups: list[tuple[str, str]],
                       keep_retained: bool, skip: Callable[[str], bool] | None = None,
                       maybe_sent: bool = False, recovery: bool = False, also: tuple[str, ...] = ()) -> int: ...

    def deliver_remote(self, msg: Message, now: float) -> int: ...

    def on_durable(self) -> None: ...

    def when_durable(self, epoch: int, callback: Callable[[], None]) -> None: ...


class ClusterGossip(ClaimGossip, LinkGossip, Protocol):
    """What the cluster needs of gossip: route broadcasts and digests, member changes,
    the mesh links' stream handler (and what the handoff driver and the links need)."""

    def on_member_change(self, handler: Callable[[str, MemberState], None]) -> None: ...

    def member_state(self, member_id: str) -> str | None: ...

    def contact_ages(self) -> dict[str, float]: ...

    def register_stream_handler(self, frame_type: str,
                                handler: Callable[[trio.abc.Stream, Envelope], Awaitable[None]]) -> None: ...


class MetaStore(Protocol):
    """The part of the session store the cluster writes (held traffic) and waits on."""

    @property
    def write_epoch(self) -> int: ...

    @property
    def durable_epoch(self) -> int: ...

    def put_meta(self, key: str, value: object) -> None: ...

    def delete_meta(self, key: str) -> None: ...


class Cluster:
    def __init__(self, *, node_id: str, port: MeshPort, broker: LocalBroker, store: MetaStore,
                 gossip: ClusterGossip, trace: Tracer, cluster_name: str, clock: Clock,
                 rng: random.Random | None = None, hold_period: float = 86400.0, held_max_messages: int = 10_000,
                 held_max_age: float = 3600.0, recovered_meta: Mapping[str, object] | None = None,
                 replicas: ReplicaSource | None = None) -> None:
        self.node_id = node_id
        self.port = port
        self.broker = broker
        self.store = store
        self.gossip = gossip
        self.trace = trace
        self.cluster_name = cluster_name
        self.clock = clock
        self.rng = rng if rng is not None else random.Random()
        self.table = port.table
        self.epoch = self.table.epoch
        self.links: dict[str, OutboundLink] = {}
        self.inbound = InboundLinks(cluster_name, gossip, node_id, self._take_batch, self._forward_taken, self._answer)
        self._nursery: trio.Nursery | None = None
        self._retained_pulled = False
        self.forwarded_out = 0
        self.forwarded_upto = 0  # the last id of a message published here and forwarded or held (ids only grow)
        self.forwarded_in = 0
        self.replay_duplicates = 0
        # Per peer, identities of the QoS >= 1 messages it forwarded lately (oldest first).
        self._recent: dict[str, RecentKeys[tuple[str | None, int]]] = {}
        self.malformed_items = 0
        self.routes_of_gone_ignored = 0  # route states of members we hold dead or left, not taken
        self._link_serial = 0
        self.heap = HeapFreeze()  # the heap out of the collector's full passes while the table grows
        self._pulls_out: dict[str, float] = {}  # peer -> when a routes pull to it went unanswered so far
        self._settling = False  # a `_settle_routes` task runs: pulled snapshots wait in the table for it
        self._pull_more: set[str] = set()  # peers that have more to send once what they sent is applied
        self.pulled_snapshot_filters = 0  # filters of route snapshots pulled from peers (whole states)
        self.pulled_delta_changes = 0  # changes pulled from peers' delta logs (what a gap lacked)
        gossip.on_broadcast("route", self._on_route_broadcast)
        gossip.on_member_change(self._on_member_change)
        gossip.register_push_pull("routes", self._digest_for_push_pull, self._on_peer_digest)
        gossip.register_stream_handler("link_hello", self.inbound.serve)
        # A session handed over is remembered as long as a message held for this node
        # (or stuck in a link to it) may still arrive for it.
        self.handoffs = Handoffs(node_id=node_id, broker=broker, gossip=gossip, cluster=self, trace=trace, clock=clock,
                                 notes=store, moved_memory=held_max_age, recovered_meta=recovered_meta,
                                 replicas=replicas)
        self.held = HeldTraffic(hold_period=hold_period, max_messages=held_max_messages, max_age=held_max_age)
        self._held_sent: set[tuple[str, int]] = set()  # (member, held seq) of those sent before (`LinkItem.sent`)
        if replicas is not None:
            replicas.use_held(self)  # a session taken from a replica gets what was held for its dead owner
        self._restore_held(recovered_meta or {})
        # An expiring session's client may have resumed it where this node could not
        # hear: kept at most as long as held traffic (what it holds was acknowledged too).
        self.contact = Contact(clock.wall(), CLAIMS_SETTLE, held_max_age, peers=PEERS_META in (recovered_meta or {}))
        port.on_expiry(self._keep_expired)
        port.on_forward(self.forward)
        port.on_session_ended(self.handoffs.session_ended)
        port.on_holding(lambda: bool(self.held.members))
        port.serve_connects(self.handoffs)
        # The routes of the sessions restored from the store go into the table now, not
        # at the first flush: a peer that pulls this node's snapshot before then (a
        # restart has a new route epoch, so the peer takes it over what it held) would
        # get none of them and route nothing here meanwhile (found by the cluster
        # simulator, seed 11 of 5 nodes, 20 clients, 60 s).
        self.flush_routes_now()

    # ---------------------------------------------------------------- running

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            # Routes of sessions restored from the store are queued in the port already.
            nursery.start_soon(self._route_flusher)
            nursery.start_soon(self._anti_entropy)
            nursery.start_soon(self.handoffs.run)
            nursery.start_soon(self._expire_held)
            nursery.start_soon(self._watch_contact)
            nursery.start_soon(self._thaw_heap)
            task_status.started()
            await trio.sleep_forever()

    # ---------------------------------------------------- local route changes

    async def _route_flusher(self) -> None:
        while True:
            await self.port.wait_for_route_changes()
            await trio.sleep(ROUTE_FLUSH_DELAY)
            # `ROUTE_SLICE` changes per tick: a node that takes 100,000 subscriptions
            # made one delta of them all, seconds of one step (chunks, broadcasts).
            while self._flush_routes(ROUTE_SLICE):
                await trio.sleep(0)

    def flush_routes_now(self) -> None:
        """Turn the local route changes queued in the port into a delta and spread it."""
        self._flush_routes(None)

    def _flush_routes(self, limit: int | None) -> bool:
        """`flush_routes_now` for the oldest `limit` changes (all: None); True if some
        are left queued."""
        delta = self.table.local_changes(self.port.take_route_changes(limit))
        if delta is not None:
            self._disseminate(delta)
            self._table_grew()
        return self.port.has_route_changes()

    def _table_grew(self) -> None:
        """After route work: the heap leaves the collector's full passes while the
        table grows (`routing.heap`)."""
        table = self.table  # trie entries: what the objects grow with (a pulled state swaps in before its trie)
        self.heap.size(len(table.trie) + len(table.shared_trie) + len(table.local_filters()), self.clock.now())

    async def _thaw_heap(self) -> None:
        while True:
            await trio.sleep(HEAP_CHECK_INTERVAL)
            self.heap.tick(self.clock.now())

    def forward_mark(self) -> int:
        return self.forwarded_upto

    def own_route_snapshot(self) -> list[object]:
        return self.table.local_snapshot().to_wire()

    def take_route_snapshot(self, wire: object, sender: str | None = None) -> None:
        """A peer's routes handed over directly (a handoff fence), ahead of gossip.
        From their origin itself (`sender`) they are taken even while this node holds
        it dead: it is talking over a mesh link, a heal not seen yet here, and what
        matches them is held for it until it is (simulator seed 148 of 5 nodes, 20
        clients, 60 s: a session's giver that held its taker dead ignored its routes
        at the commit, and its own publishes for the session went nowhere: lost)."""
        snap = RouteSnapshot.from_wire(wire)
        if snap.origin != self.node_id and (snap.origin == sender or not self._gone(snap.origin)):
            self.table.apply_snapshot(snap)

    def _gone(self, origin: str) -> bool:
        """Routes of a member we hold dead (or that left) are not taken from others:
        a peer that has not seen it die yet would hand them back (in a snapshot, a
        delta or a digest to pull for), and forwards to them would wait on a link
        that cannot deliver.  When the member is back, its own routes are pulled."""
        if self.gossip.member_state(origin) in _GONE:
            self.routes_of_gone_ignored += 1
            return True
        return False

    def _now_us(self) -> int:
        return int(self.clock.wall() * 1_000_000)

    def _disseminate(self, delta: RouteDelta) -> None:
        ts = self._now_us()
        for chunk in _chunks(delta):
            for topic_filter, present in chunk.changes:
                self.trace.emit(ts_us=ts, kind="route_add" if present else "route_del", subject=topic_filter,
                                event_id=f"{self.node_id}:{chunk.epoch}:{chunk.first_version}:{topic_filter}")
            # The key names the origin: gossip lets a newer broadcast with the same key
            # replace an older one, which must never happen between two origins.
            self.gossip.broadcast("route", f"{self.node_id}:{chunk.epoch}:{chunk.first_version}",
                                  RouteBroadcast(chunk, ts).to_wire())

    # --------------------------------------------------- remote route changes

    def _on_route_broadcast(self, origin: str, payload: object) -> None:
        try:
            delta, origin_ts = RouteBroadcast.from_wire(payload)
        except (TypeError, ValueError) as exc:
            self.malformed_items += 1
            log.warning("dropping a malformed route delta from %s: %s", origin, exc)
            return
        if self._gone(delta.origin):
            return
        changes = self.table.apply_delta(delta)
        if changes:
            self._table_grew()
        if self.table.unsettled:
            self._settle_soon()  # a restarted origin's old entries, in slices
        ts = self._now_us()
        for topic_filter, node, present in changes:
            self.trace.emit(ts_us=ts, kind="route_add" if present else "route_del", subject=topic_filter,
                            origin=node, origin_ts_us=origin_ts,
                            event_id=f"{node}:{delta.epoch}:{delta.first_version}:{topic_filter}", hops=1)
        if self.table.wanted:
            # Only what has a gap: the origin's answer for the whole table (everything
            # it holds newer) came from every origin at once when a node that just took
            # many subscriptions broadcast them, each a copy of the same tables.
            self._pull_routes(delta.origin, sorted(self.table.wanted))

    def _keep_expired(self, client_id: str, left_at: float, expired_at: float, now: float) -> float | None:
        claimed = self.handoffs.claimed_elsewhere(client_id, expired_at)
        return self.contact.keep_expired(left_at, expired_at, now, claimed)

    def _on_member_change(self, member: str, state: str) -> None:
        if not self.contact.peers:
            self.store.put_meta(PEERS_META, 1)  # once: a restart knows it is no lone node
        self.contact.member_changed(member, state, self.clock.wall())
        if state in _GONE:
            if state == MemberState.DEAD and self.table.hold_origin(member):
                # Unreachable, not gone: its routes are held (the table keeps them as
                # they were) and what matches them is kept for it until it is back (or
                # the hold period ends).
                self.held.hold(member, self.clock.wall())
                self._store_held_routes(member)
                log.warning("member %s unreachable: holding QoS >= 1 messages for its routes", member)
            else:
                if state == MemberState.LEFT:
                    self._forget_held(member)
                    self._recent.pop(member, None)
                dropped = self.table.drop_origin(member)
                if dropped:
                    log.info("member %s %s: dropped its %d routes", member, state, dropped)
                self._settle_soon()
            self._pulls_out.pop(member, None)  # its answer will not come: ask again once it is back
            link = self.links.pop(member, None)
            if link is not None:
                link.cancel_scope.cancel()
                self._release(self._hold_failed(member, link.fail_all()))
        elif state == MemberState.ALIVE:
            link = self.links.get(member)
            if link is not None:
                link.retry_now()  # back: what waits for it goes now, not after the backoff
            self._replay_held(member)
            if self.table.revive(member):
                # Declared dead, not gone (a loaded node misses probes): its last routes
                # are its routes again at once, and the pull below brings only what
                # changed (a member of 100,000 routes pulled whole by every node at each
                # false death made the next node late: a cascade at a million routes).
                log.info("member %s back: its last routes taken back", member)
            # Its own routes, from itself (the rest comes from deltas and anti-entropy):
            # a new node, which sees every member come alive at once, pulls each
            # origin's routes once, not the whole table from every member.
            self._pull_routes(member, [member])
            if not self._retained_pulled:
                self._pull_retained(member)

    # ------------------------------------------------------------ held traffic

    def _hold(self, member: str, msg: Message, now: float, seq: int | None = None, also: tuple[str, ...] = (),
              sent: bool = False) -> int:
        seq, dropped = self.held.add(member, msg, now, seq, also)
        store = self.store
        if seq not in dropped:
            store.put_meta(f"{HELD_MSG}{member}/{seq:020d}", HeldMessageRecord(msg, now, also, sent).to_record())
            if sent:
                self._held_sent.add((member, seq))
        for gone in dropped:
            store.delete_meta(f"{HELD_MSG}{member}/{gone:020d}")
            self._held_sent.discard((member, gone))
        if dropped and (self.held.dropped_full == len(dropped) or self.held.dropped_full % 1000 < len(dropped)):
            log.warning("held messages for %s over the limit (%d): dropped the oldest (%d dropped so far)",
                        member, self.held.max_messages, self.held.dropped_full)
        return seq

    def _settle_held(self, member: str) -> None:
        """A member that came back has its own routes here again: its held ones go."""
        if self.held.settle(member):
            self.table.release_held(member)
            self._settle_soon()

    def _settle_soon(self) -> None:
        """Start applying what waits in the table (staged snapshots, trie entries of
        dropped or released routes) a slice at a time, unless that runs already."""
        if self.table.unsettled and not self._settling and self._nursery is not None:
            self._settling = True
            self._nursery.start_soon(self._settle_routes)

    def _hold_failed(self, member: str, items: list[Queued]) -> list[Queued]:
        """Items a dead member's link never got acknowledged: QoS >= 1 plain forwards are
        held for it (in order) when its routes are; their publishers are answered once
        that is on disk."""
        if not self.held.is_held(member):
            return items
        now = self.clock.wall()
        for item in items:
            # (A QoS 0 message queued as itself is not held.)
            if type(item) is LinkItem and item.qos and item.plain:
                self._hold(member, item.message, now, item.held_seq or None, item.also, item.sent)
        return items

    def _routes_back(self, member: str) -> bool:
        """Whether a member that came back has its own routes here again: some, and no
        gap (a delta it sent after its return, ahead of the snapshot that closes the
        gap, leaves an origin with a few routes or none; dropping its held routes then
        lost what they matched: simulator seed 3 of 5 nodes, 20 clients, 60 s)."""
        return member in self.table.remote and member not in self.table.wanted

    def held_messages(self, member: str) -> list[Message]:
        """The QoS >= 1 messages this node owes `member` for its plain subscribers: held
        for it, and (in order, after them) still unacknowledged on the link to it.  A
        takeover from a replica fetches them for its dead owner while that owner is
        only suspect too: a message stuck on the link then is held only later, and
        merged then it would come after newer ones from the same publisher."""
        held = self.held.members.get(member)
        out = [msg for _, msg, _, _ in held.messages] if held is not None else []
        link = self.links.get(member)
        if link is not None:
            out.extend(item.message for item in link.pending() if type(item) is LinkItem and item.qos and item.plain)
        return out

    def _replay_held(self, member: str) -> None:
        held = self.held.take_with_also(member)
        self.store.delete_meta(f"{HELD_ROUTES}{member}")
        if not held:
            return
        link = self._link(member)
        for seq, msg, also in held:
            # Ahead of anything new for it: the replay keeps each publisher's order.
            item = LinkItem(msg, PLAIN_REPLAY, also, held_seq=seq)
            if (member, seq) in self._held_sent:
                # It went in a batch the member never acknowledged: if the member
                # restarted meanwhile, it may have delivered it and forgotten (simulator
                # seed 8242 of 3 nodes, 6 clients, 15 s).
                self._held_sent.discard((member, seq))
                item.sent = True
            link.enqueue(item)
        log_event(log, Event.HELD_REPLAYED, member=member, messages=len(held))

    def _forget_held(self, member: str) -> None:
        held = self.held.forget(member)
        self.table.release_held(member)
        self._held_sent = {k for k in self._held_sent if k[0] != member}
        store = self.store
        store.delete_meta(f"{HELD_ROUTES}{member}")
        for seq, _ in held:
            store.delete_meta(f"{HELD_MSG}{member}/{seq:020d}")
        if held:
            log.warning("member %s left: dropped %d messages held for it", member, len(held))

    def _store_held_routes(self, member: str) -> None:
        held = self.held.members[member]
        record = HeldRoutesRecord(self.table.held_filters(member), held.since)
        self.store.put_meta(f"{HELD_ROUTES}{member}", record.to_record())

    def _restore_held(self, meta: Mapping[str, object]) -> None:
        for key, value in meta.items():
            if key.startswith(HELD_ROUTES):
                try:
                    routes = HeldRoutesRecord.from_record(value)
                    member = key[len(HELD_ROUTES):]
                    self.table.restore_held(member, routes.filters)
                    self.held.hold(member, routes.since)
                except (TypeError, ValueError):
                    log.error("ignoring a stored held route record %s", key)
        for key in sorted(k for k in meta if k.startswith(HELD_MSG)):
            member, _, seq = key[len(HELD_MSG):].rpartition("/")
            try:
                msg, held_at, also, sent = HeldMessageRecord.from_record(meta[key])
                if self.held.is_held(member):
                    self.held.add(member, msg, held_at, int(seq), also)
                    if sent:
                        self._held_sent.add((member, int(seq)))
                    continue
            except (TypeError, ValueError):
                log.error("ignoring a stored held message %s", key)
            self.store.delete_meta(key)
        if self.held.members:
            log.info("restored held traffic: %s", self.held.counts())

    async def _watch_contact(self) -> None:
        """Tell `contact` how long no member has been heard: a node cut off alone may
        suspect no one for a long time (seed 956 of 3 nodes, 6 clients, 15 s)."""
        while True:
            await trio.sleep(CONTACT_CHECK_INTERVAL)
            ages = self.gossip.contact_ages()
            self.contact.heard(min(ages.values()) if ages else None, self.clock.wall())

    async def _expire_held(self) -> None:
        while True:
            await trio.sleep(HELD_EXPIRY_INTERVAL)
            for member in [m for m, h in self.held.members.items() if h.returned and self._routes_back(m)]:
                self._settle_held(member)
            gone, aged = self.held.expire(self.clock.wall())
            store = self.store
            for member in gone:
                self.table.release_held(member)
                self._settle_soon()
                store.delete_meta(f"{HELD_ROUTES}{member}")
                log.warning("member %s unreachable for longer than the hold period: its held routes go", member)
            for member, seq in aged:
                store.delete_meta(f"{HELD_MSG}{member}/{seq:020d}")
                self._held_sent.discard((member, seq))
            if aged:
                log.warning("dropped %d held messages past their age limit", len(aged))

    def _digest_for_push_pull(self) -> object:
        return PeerDigest(self.node_id, self.table.digest()).to_wire()

    def _on_peer_digest(self, state: object) -> None:
        try:
            peer, digest = PeerDigest.from_wire(state)
        except (TypeError, ValueError):
            self.malformed_items += 1
            return
        # Origins held dead or left are not pulled for (`_gone` counts each one seen).
        if any(not self._gone(origin) for origin in self.table.behind(digest)):
            self._pull_routes(peer)

    def _pull_routes(self, peer: str, origins: list[str] | None = None) -> None:
        """Ask `peer` for the route states it holds newer than ours (of `origins` only,
        when given: `o` in the request, which older versions ignore and answer all)."""
        if peer == self.node_id or self._nursery is None:
            return
        now = self.clock.now()
        asked = self._pulls_out.get(peer)
        if asked is not None and now - asked < PULL_PATIENCE:
            return  # its answer, which comes first, brings what a second one would
        self._pulls_out[peer] = now
        # `dl`: deltas from the peer's delta log are welcome (older versions ignore it
        # and answer snapshots, which an older asker, which never sends it, gets too).
        request: dict[str, object] = {"d": digest_to_wire(self.table.pull_digest()), "max": ROUTES_REPLY_FILTERS,
                                      "dl": True}
        if origins is not None:
            request["o"] = origins
        self._link(peer).request("routes_req", request, functools.partial(self._on_routes_reply, peer))

    def _on_routes_reply(self, peer: str, frame: Frame) -> None:
        self._pulls_out.pop(peer, None)
        taken = 0
        for snap_wire in frame.get("snaps", ()):
            try:
                snap = RouteSnapshot.from_wire(snap_wire)
            except (TypeError, ValueError):
                self.malformed_items += 1
                continue
            if not self._gone(snap.origin):
                self.table.stage_snapshot(snap)  # applied in slices by `_settle_routes`
                self.pulled_snapshot_filters += len(snap.filters)
                taken += 1
        for delta_wire in frame.get("deltas", ()):
            try:
                delta = RouteDelta.from_wire(delta_wire)
            except (TypeError, ValueError):
                self.malformed_items += 1
                continue
            if not self._gone(delta.origin):
                self.table.stage_delta(delta)  # applied in slices too
                self.pulled_delta_changes += len(delta.changes)
                taken += 1
        if frame.get("more") is True and taken:
            self._pull_more.add(peer)  # the rest once this part is applied (memory stays bounded)
        if taken:
            # One slice now (all of a small answer, the usual case); the rest in a task
            # of its own, started only then.
            if not self.table.settle(ROUTE_SLICE):
                self._routes_settled()
            else:
                self._settle_soon()

    async def _settle_routes(self) -> None:
        """Apply staged snapshots a slice at a time, yielding to the event loop between
        slices, until none is left."""
        try:
            while True:
                await trio.sleep(0)
                more = self.table.settle(ROUTE_SLICE)
                self._table_grew()
                if not more:
                    break
        finally:
            self._settling = False
        self._routes_settled()

    def _routes_settled(self) -> None:
        """What was pulled is applied: ask the peers that said they have more."""
        more, self._pull_more = self._pull_more, set()
        for peer in sorted(more):
            self._pull_routes(peer)

    def _pull_retained(self, peer: str) -> None:
        if self._nursery is None:
            return
        self._retained_pulled = True
        self._link(peer).request("retained_req", {}, self._on_retained_reply)

    def _on_retained_reply(self, frame: Frame) -> None:
        now = self.clock.wall()
        for item in frame.get("msgs", ()):
            try:
                msg = records.message_from_map(item)
            except records.RecordError:
                self.malformed_items += 1
                continue
            # Anti-entropy fills gaps; it never overwrites a retained message held here.
            if self.broker.retained.get(msg.topic) is None and not msg.expired(now):
                self.broker.keep_retained(msg)

    async def _anti_entropy(self) -> None:
        while True:
            await trio.sleep(ANTI_ENTROPY_INTERVAL * (0.5 + self.rng.random()))
            alive = self.gossip.alive_members()
            if not alive:
                continue
            wanted = [o for o in self.table.wanted if o in alive]
            self._pull_routes(wanted[0] if wanted else self.rng.choice(alive))

    def _answer(self, peer: str, frame: Frame) -> Reply | Awaitable[Reply]:
        kind = frame["t"]
        if kind.startswith("ho_"):
            return self.handoffs.answer(peer, frame)
        if kind == "routes_req":
            limit = frame.get("max")  # absent from older versions: everything in one answer
            only = frame.get("o")  # absent from older versions, and from anti-entropy: every origin
            snaps, deltas, more = self.table.newer_than(
                digest_from_wire(frame["d"]), limit if isinstance(limit, int) and limit > 0 else None,
                frozenset(o for o in only if isinstance(o, str)) if isinstance(only, list) else None,
                delta_piece=ROUTE_SLICE if frame.get("dl") is True else 0, max_changes=ROUTE_CHANGES_PER_ANSWER)
            fields: dict[str, object] = {"snaps": [], **({"more": True} if more else {})}
            if deltas:
                fields["deltas"] = [d.to_wire() for d in deltas]
            if sum(len(snap.filters) for snap in snaps) <= ROUTE_SLICE:
                fields["snaps"] = [s.to_wire() for s in snaps]
                return "routes", fields
            return self._routes_answer(snaps, fields)
        if kind == "retained_req":
            now = self.clock.wall()
            msgs = [records.message_map(m) for _, m in self.broker.retained.items() if not m.expired(now) and not m.topic.startswith("$")]
            return "retained", {"msgs": msgs}
        raise ValueError(f"unknown mesh frame {kind!r}")

    async def _routes_answer(self, snaps: list[RouteSnapshot], fields: dict[str, object]) -> Reply:
        """A big `routes` answer, each snapshot put in wire form (sorted) in a tick of
        its own: the snapshots are copies, taken at once, so the answer is consistent."""
        wire: list[object] = []
        for snap in snaps:
            wire.append(snap.to_wire())
            await trio.sleep(0)
        fields["snaps"] = wire
        return "routes", fields

    # ------------------------------------------------------------- forwarding

    def forward(self, msg: Message, targets: dict[str, ForwardTarget], gate: AckGate | None) -> int:
        """Send `msg` to each target node once, and hold it for unreachable members whose
        held routes match (the broker calls this through the port).  Returns how many
        members it was held for.  Per message on the publishing node: what only a held
        member, a QoS >= 1 message to several nodes or a BUGGIFY fault needs is behind
        one test each."""
        held = self._hold_for_unreachable(msg, targets) if self.held.members else 0
        if msg.origin == self.node_id and msg.msg_id > self.forwarded_upto and (targets or held):
            self.forwarded_upto = msg.msg_id  # held too: it is replayed later, sent before the mark
        if not targets:
            return held
        also: tuple[str, ...] = ()
        if msg.qos:
            if len(targets) > 1:
                # Each receiver learns who else got it: an old owner of a session that
                # moved to one of them need not relay it there (`Handoffs.relay_moved`).
                sent_to = sorted(node for node, target in targets.items() if target.plain)
                if len(sent_to) > 1:
                    also = tuple(sent_to)
            if faults.DROP_FORWARD:
                for node, target in targets.items():
                    item = LinkItem(msg, target, also, gate)
                    if gate is not None:
                        gate.waiting += 1
                    self._release([item])  # BUGGIFY: acknowledged, never sent
                return held
        else:
            gate = None
        links = self.links
        qos0 = not msg.qos
        for node, target in targets.items():
            # QoS 0 to plain subscribers only: the message itself (`routing.batch.Queued`).
            queued: Queued = msg if qos0 and target is PLAIN_ONLY else LinkItem(msg, target, also, gate)
            if gate is not None:
                gate.waiting += 1
            link = links.get(node)
            if link is None:
                link = self._link(node)
            if link.enqueue(queued):
                self.forwarded_out += 1
            else:
                self._release([queued])
        return held

    def _hold_for_unreachable(self, msg: Message, targets: dict[str, ForwardTarget]) -> int:
        """Take the members held as unreachable out of `targets` and hold `msg` for
        them (QoS >= 1); how many it was held for."""
        held_members = self.held.members
        hold_for: list[str] = []
        # The table names a member for its held routes too (`RouteTable.hold_origin`).
        for member in [node for node in targets if node in held_members]:
            if not held_members[member].returned:
                # Unreachable: no forward (its held routes are all it has here).
                del targets[member]
                if msg.qos:
                    hold_for.append(member)
            elif self._routes_back(member):
                self._settle_held(member)  # its own routes are back
            # else back, but its routes are not here yet: the held ones still route.
        if hold_for:
            # Replayed later with the nodes that got it now (see `relay_moved`).
            now = self.clock.wall()
            also = tuple(sorted(node for node, target in targets.items() if target.plain))
            for member in hold_for:
                self._hold(member, msg, now, also=also)
        return len(hold_for)

    async def ask(self, peer: str, frame_type: str, fields: Fields, timeout: float) -> Frame:
        """One request over the link to `peer` and its reply; TooSlowError past `timeout`."""
        replied = trio.Event()
        reply: Frame = {}

        def on_reply(frame: Frame) -> None:
            reply.update(frame)
            replied.set()

        self._link(peer).request(frame_type, fields, on_reply)
        with trio.fail_after(timeout):
            await replied.wait()
        return reply

    def tell(self, peer: str, frame_type: str, fields: Fields) -> None:
        """A request whose reply nobody waits for."""
        self._link(peer).request(frame_type, fields, lambda frame: None)

    async def drain_link(self, peer: str, timeout: float) -> bool:
        """Wait (at most `timeout`) until `peer` has taken what this node forwarded to
        it so far; False if it did not within `timeout`."""
        link = self.links.get(peer)
        if link is None:
            return True
        with trio.move_on_after(timeout) as scope:
            await link.taken()
        if scope.cancelled_caught:
            log.warning("link to %s did not drain within %.1f s", peer, timeout)
            return False
        return True

    def _link(self, peer: str) -> OutboundLink:
        link = self.links.get(peer)
        if link is None:
            # A fresh link numbers its batches from 1: give it its own epoch so the peer's
            # duplicate filter (per peer and link epoch) never mistakes it for an old one.
            self._link_serial += 1
            link_epoch = f"{self.epoch}.{self._link_serial}"
            link = self.links[peer] = OutboundLink(peer, self.gossip, self.node_id, link_epoch, self.cluster_name,
                                                   functools.partial(self._acked, peer))
            assert self._nursery is not None
            self._nursery.start_soon(link.run)
        return link

    def _acked(self, peer: str, items: list[Queued]) -> None:
        """A peer acknowledged a batch: replayed held messages in it are done."""
        store = self.store
        for seq in held_seqs(items):
            store.delete_meta(f"{HELD_MSG}{peer}/{seq:020d}")
        self._release(items)

    def _release(self, items: list[Queued]) -> None:
        """Items acknowledged by their peer, or given up: their gates open."""
        if open_gates(items):
            self.broker.on_durable()

    # ------------------------------------------------------------- receiving

    def _take_batch(self, peer: str, items: list[object], read: Callable[[object], Unpacked], resent: bool = False) -> None:
        now = self.clock.wall()
        recent = self._recent.get(peer)
        if recent is None:
            recent = self._recent[peer] = RecentKeys(RECENT_PER_PEER)
        handoffs = self.handoffs
        broker = self.broker
        publish_remote = broker.publish_remote
        deliver_remote = broker.deliver_remote
        self.forwarded_in += len(items)  # (less the malformed ones, below)
        for wire in items:
            if type(wire) is Message:
                # For plain subscribers only (`routing.batch.read_fwdb`): the common case.
                msg = wire
                if not msg.qos:
                    deliver_remote(msg, now)  # QoS 0: nothing to remember, skip or relay
                    continue
                plain, groups, keep_retained, replay, also = True, _NO_GROUPS, False, False, _NO_NODES
            else:
                try:
                    msg, plain, groups, keep_retained, replay, also = read(wire)
                except (TypeError, ValueError):
                    self.malformed_items += 1
                    self.forwarded_in -= 1
                    continue
            if msg.qos:
                # A held message replayed after a split may have arrived once already
                # (its batch was taken here but the ack was cut off): take it once.
                key = (msg.origin, msg.msg_id)
                if replay and key in recent:
                    self.replay_duplicates += 1
                    self.forwarded_in -= 1
                    continue
                recent.add(key)
                # Sessions taken over here whose giver got this message too: theirs to deliver.
                skip = handoffs.giver_had(msg, peer, also)
            else:
                skip = None
            # A batch sent again and taken here anyway: this node restarted since it may
            # have taken it the first time (its acknowledgement lost with the node), so
            # its messages may have reached their subscribers already (simulator seeds
            # 2523 and 7863 of 3 nodes, 6 clients, 15 s).
            publish_remote(msg, now, plain=plain, groups=groups, keep_retained=keep_retained, skip=skip,
                           maybe_sent=resent and msg.qos > 0, recovery=replay, also=also)
            if msg.qos and plain and handoffs.moved:
                # Its sender routed it here for sessions that have moved on since: they
                # get it through a copy this batch's acknowledgement waits for.
                handoffs.relay_moved(msg, now, peer, also)

    async def _forward_taken(self) -> None:
        """When a forwarded batch may be acknowledged to its origin (whose publishers'
        PUBACKs wait for it): by the same rule as a local PUBACK.  In `sync` once what
        the batch wrote is synced; in `batch`/`off` at once, since the store's window
        already bounds what a crash here can lose (waiting for it would make every
        cross-node QoS 1/2 publish wait up to `durability_batch_ms`, which a local
        one never does)."""
        if self.broker.acks_wait_for_sync:
            await self.wait_durable()

    async def wait_durable(self) -> None:
        store = self.store
        epoch = store.write_epoch
        if epoch <= store.durable_epoch:
            return
        done = trio.Event()
        self.broker.when_durable(epoch, done.set)
        await done.wait()

    # ------------------------------------------------------------- inspection

    def routes(self) -> list[dict[str, object]]:
        return [{"filter": f, "nodes": sorted(n)} for f, n in sorted(self.table.routes().items())]

    def route_versions(self) -> dict[str, dict[str, int]]:
        """{origin: {"epoch", "version"}}: how far this node's copy of each origin's
        routes has come (equal on two nodes once route sync has converged)."""
        return {origin: {"epoch": d.epoch, "version": d.version} for origin, d in sorted(self.table.digest().items())}

    def held_counts(self) -> dict[str, int]:
        """{unreachable member: messages held for it}."""
        return self.held.counts()


def _chunks(delta: RouteDelta) -> list[RouteDelta]:
    """Split a delta so each broadcast stays well under a gossip packet."""
    out: list[RouteDelta] = []
    current: list[tuple[str, bool]] = []
    size = 0
    first = delta.first_version
    for change in delta.changes:
        cost = len(change[0].encode("utf-8")) + 4
        if current and size + cost > ROUTE_CHUNK_BYTES:
            out.append(RouteDelta(delta.origin, delta.epoch, first, tuple(current)))
            first += len(current)
            current, size = [], 0
        current.append(change)
        size += cost
    if current:
        out.append(RouteDelta(delta.origin, delta.epoch, first, tuple(current)))
    return out
