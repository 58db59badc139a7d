"""The single-node broker: sessions, subscriptions, retained messages, wills, routing.

Synchronous and clock-free: every entry point takes `now` (wall-clock seconds, so
expiry survives restarts) and the Trio shells (`mesh.connection`, `mesh.node`) call in.
It writes to connections only through `ClientPort.deliver` / `.close`
(`mesh.client_port`), which append to that connection's outbox; it never awaits.

Data flow of a publish: `publish()` -> retained index -> local trie match (plain and
shared subscriptions) -> one `Delivery` per session (overlapping subscriptions merged
into one copy at the highest QoS, carrying every subscription identifier) -> the
session's connection (window/queue) or, offline, the session's queue.

Shared subscriptions (`$share/group/filter`) pick one member per message, round-robin
over the group's members, preferring connected ones.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import random
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Mapping, Protocol, Sized

import faults
from clock import Clock, SystemClock
from hooks import HookPoint, Hooks
from mesh.client_port import ClientPort
from mqtt import EMPTY_PROPERTIES, Connect, Properties, ReasonCode, Subscription, Will
from mqtt.topics import parse_shared_subscription
from oplog import Event, log_event
from routing.forward import GROUPS_ONLY, PLAIN_ONLY, RETAINED_ONLY, ForwardTarget
from routing.links import AckGate
from routing.retained import RetainedIndex
from routing.trie import TopicTrie
from session_store.handoff import message_key
from session_store.model import NEVER_EXPIRES, Delivery, InflightEntry, Message, Session, SubscriptionOptions
from session_store.store import MemoryStore, RecoveredState, SessionStore, StoredSession
from streams.cursor import ReplaySink
from streams.request import ReplayRequest
from streams.service import ReplayOpened

log = logging.getLogger("meshd.broker")


class Mesh(Protocol):
    """What the broker asks and tells the rest of the cluster (`routing.port.MeshPort`,
    built before the broker; the cluster behind it is built after)."""

    def plain_nodes(self, topic: str) -> frozenset[str]: ...

    def stays_here(self, retain: bool) -> bool: ...

    def shared_nodes(self, topic: str) -> dict[tuple[str, str], set[str]]: ...

    def has_shared_routes(self) -> bool: ...

    def pick_shared_node(self, key: tuple[str, str], candidates: list[str]) -> str: ...

    def retained_targets(self) -> list[str]: ...

    def forward(self, msg: Message, targets: dict[str, ForwardTarget], gate: AckGate | None) -> int: ...

    def route_changed(self, topic_filter: str, present: bool) -> None: ...

    def session_ended(self, client_id: str) -> None: ...

    def keep_expired(self, client_id: str, left_at: float, expired_at: float, now: float) -> float | None: ...

    # Asked by the connection before a CONNECT opens its session.
    def connect_is_local(self, client_id: str, clean_start: bool, persistent: bool) -> bool: ...

    async def prepare_connect(self, client_id: str, clean_start: bool, persistent: bool) -> str: ...


class DelayedIntake(Protocol):
    """Where `$delayed/<seconds>/<topic>` PUBLISHes go (`delayed.service.DelayedMessages`)."""

    @property
    def max_delay(self) -> int: ...

    def accept(self, message: Message, delay: int, now: float) -> object: ...

    def refused(self) -> None: ...


class StreamHook(Protocol):
    """The node's durable streams (`streams.service.StreamService`, built before the
    broker): every message published through this node passes `append`; the clients
    open replay subscriptions through it."""

    @property
    def specs(self) -> Sized: ...  # the streams in effect: none, no `append` call per message

    def append(self, msg: Message, now: float) -> Message: ...

    def open_replay(self, sink: ReplaySink, request: ReplayRequest, qos: int,
                    subscription_ids: tuple[int, ...]) -> ReplayOpened: ...

    def client_gone(self, sink: object) -> None: ...


@dataclass(frozen=True, slots=True)
class BrokerLimits:
    """The settings the broker core reads (a subset of `mesh.config.Settings`)."""

    max_queued_messages: int = 1000
    queue_qos0: bool = False
    retain_available: bool = True
    max_inflight: int = 32
    receive_maximum: int = 1024
    max_packet_size: int = 1048576
    topic_alias_maximum: int = 64
    max_keepalive: int = 65535
    durability: str = "sync"

    @classmethod
    def from_settings(cls, settings: object) -> "BrokerLimits":
        """From `mesh.config.Settings` (or anything with these attributes)."""
        return cls(**{name: getattr(settings, name) for name in cls.__dataclass_fields__})


class BrokerStats:
    """Plain counters on the hot path; `/metrics` and `$SYS` read them."""

    __slots__ = (
        "messages_in", "messages_out", "bytes_in", "bytes_out", "dropped_queue_full",
        "dropped_slow_consumer", "dropped_expired", "dropped_too_large", "dropped_reserved_topic", "connections_total",
        "protocol_errors", "retained_set", "window_full",
    )

    def __init__(self) -> None:
        self.messages_in = [0, 0, 0]
        self.messages_out = [0, 0, 0]
        self.bytes_in = 0
        self.bytes_out = 0
        self.dropped_queue_full = 0
        self.dropped_slow_consumer = 0
        self.dropped_expired = 0
        self.dropped_too_large = 0
        self.dropped_reserved_topic = 0  # client PUBLISHes to $SYS/ or $share/, never delivered
        self.connections_total = 0
        self.protocol_errors = 0
        self.retained_set = 0
        self.window_full = 0  # QoS >= 1 deliveries queued behind a full inflight window


def _remembered_meta(client_id: str, key: tuple[str | None, int]) -> str:
    return f"{REMEMBERED_META}{client_id}/{key[0] or ''}/{key[1]}"


def _nothing() -> None:
    """The default `on_timer_change`: no driver to wake (a broker built alone, in tests)."""


REMEMBER_LIMIT = 100_000  # message identities remembered per session started in a conflict
MATCH_CACHE_TOPICS = 4096  # topics whose local matches are remembered (Broker._match)
_NO_GROUPS: list[tuple[str, str]] = []  # a forwarded message's shared groups when it names none (never changed)
# A session that expired while its node was down lives this much longer after the
# restart, in a cluster: its client may have resumed it on another node meanwhile,
# which the node learns from the ownership claims, and then the copy is merged there.
EXPIRED_WHILE_DOWN_GRACE = 30.0
# meta keys: rem/<client id>/<origin>/<message id> -> 1, what a remembering session was
# given (kept across a restart: a copy merged in after it must not bring it back)
REMEMBERED_META = "rem/"



@dataclass(slots=True)
class _SessionTarget:
    """One session's copy of a message matched by several of its subscriptions."""

    session: Session
    qos: int
    retain: bool
    subscription_ids: list[int]


class Broker:
    def __init__(self, limits: BrokerLimits | None = None, *, node_id: str = "meshd", store: SessionStore | None = None,
                 clock: Clock | None = None, mesh: Mesh | None = None,
                 on_timer_change: Callable[[], None] | None = None, rng: random.Random | None = None,
                 hooks: Hooks | None = None, delayed: DelayedIntake | None = None,
                 streams: StreamHook | None = None) -> None:
        self.limits = limits or BrokerLimits()
        self.streams = streams
        # The hook chains (`hooks/`): every point costs one empty-tuple test while unused.
        self.hooks = hooks if hooks is not None else Hooks()
        # Delayed publish, read by the clients (None: `$delayed/...` is an ordinary topic).
        self.delayed = delayed
        # Assigned client ids; random.Random() seeds itself from the OS (ids must not repeat across runs).
        self._rng = rng if rng is not None else random.Random()
        self.node_id = node_id
        self.store: SessionStore = store if store is not None else MemoryStore()
        # In `sync` durability a PUBACK/PUBREC waits until what the PUBLISH wrote is synced.
        self.acks_wait_for_sync = self.limits.durability == "sync"
        # Insertion-ordered (a dict, not a set of objects hashed by address): acks are
        # released in the same order on every run, which the cluster simulator replays.
        self.ack_waiters: dict[ClientPort, None] = {}
        self.sessions: dict[str, Session] = {}
        self.connections: dict[str, ClientPort] = {}
        self.subscriptions: TopicTrie[str] = TopicTrie()
        # What `subscriptions` matches per topic, remembered until a filter comes or goes
        # (its subscribers may change meanwhile: the sets are the trie's own). Clients
        # publish to the same topics again and again: one dict lookup per message
        # instead of a trie walk. Bounded: emptied when full.
        self._matches: dict[str, list[tuple[str, set[str]]]] = {}
        # filter -> group names with members on that filter; (group, filter) -> client ids
        self.shared: TopicTrie[str] = TopicTrie()
        self.shared_members: dict[tuple[str, str], list[str]] = {}
        self._shared_next: dict[tuple[str, str], int] = {}
        self.retained: RetainedIndex[Message] = RetainedIndex()
        self.stats = BrokerStats()
        self._timers: list[tuple[float, int, str, str, int]] = []
        self._timer_seq = itertools.count()
        self._pending_wills: dict[str, tuple[int, Will]] = {}
        # Restored wills that were due at the start, held for `restore`'s grace: a
        # reconnect sends them instead of cancelling them.
        self._restored_due: set[str] = set()
        # The timer token of each will `restore` brought back: `cancel_will` cancels only
        # that will (a replica may say so long after, when the client's new connection
        # has a will of its own pending).
        self._restored_wills: dict[str, int] = {}
        self._recovering = False  # within `publish_remote` of a replayed held message
        self._forwarded_to: tuple[str, ...] = ()  # within `publish_remote`: its `also`, when read
        # Seeded from the clock so ids from before a restart (still queued somewhere)
        # never equal new ones: (origin, msg_id) must name one message cluster-wide.
        self._msg_ids = itertools.count(int((clock or SystemClock()).wall() * 1000) * 1000)
        # Called when an earlier timer deadline appears (the node's timer task wakes).
        self.on_timer_change: Callable[[], None] = on_timer_change if on_timer_change is not None else _nothing
        # The rest of the cluster, when this node is part of one.
        self.mesh = mesh
        self._durable_callbacks: list[tuple[int, Callable[[], None]]] = []
        # Sessions started while their owner was unreachable: the identities of what
        # they were given, so a copy merged in later does not bring those back twice.
        self.remembered: dict[str, set[tuple[str | None, int]]] = {}
        # Remembering sessions taken from a replica: the owner each was taken from (`deliver`).
        self._taken_from: dict[str, str] = {}
        # Sessions past their expiry (client id -> when they expired), kept in case their
        # client resumed them elsewhere: restored after it (for `EXPIRED_WHILE_DOWN_GRACE`),
        # or expired while that may have happened unseen (`Mesh.keep_expired`).
        self.expired_while_down: dict[str, float] = {}

    def set_limits(self, limits: BrokerLimits) -> None:
        """Cluster settings changed at run time (mesh.config_sync)."""
        self.limits = limits

    # ------------------------------------------------------------------ connect

    def assign_client_id(self) -> str:
        return f"auto-{self._rng.getrandbits(64):016x}"

    def open_session(self, conn: ClientPort, connect: Connect, client_id: str, now: float) -> tuple[Session, bool]:
        """Attach `conn` to the session for `client_id`; return (session, session_present).

        A connection already using this client id is closed with 0x8E (session taken
        over).  Its will goes out unless the new connection continues its session and
        the will has a delay (the reconnect cancels it, as the spec intends)."""
        old = self.connections.get(client_id)
        if old is not None and old is not conn:
            del self.connections[client_id]
            old.close(ReasonCode.SESSION_TAKEN_OVER)
            will = old.take_will()
            if will is not None:
                delay = will.properties.will_delay_interval or 0
                if delay == 0 or connect.clean_start:
                    self._publish_will(client_id, will, now)
        # A reconnect cancels a will waiting for its delay.
        self._reconnected(client_id, now)

        level = connect.protocol_level
        if level == 5:
            expiry = connect.properties.session_expiry_interval or 0
        else:
            expiry = 0 if connect.clean_start else NEVER_EXPIRES

        session = self.sessions.get(client_id)
        present = False
        if session is not None and old is not None and old is not conn and session.expiry_interval == 0:
            # The taken-over connection had a clean session: it lasts only as long as
            # that connection [MQTT-3.1.2-6; v5 3.1.2.11.2], so it ended with it.
            self._end_session(session, now, released=False, publish_pending_will=False)
            session = None
        if session is not None and client_id not in self.connections:
            deadline = session.expires_at()
            if deadline is not None and deadline <= now:
                # Expired but its timer has not run yet (e.g. just after a restart).
                self._end_session(session, now, released=False, publish_pending_will=True)
                session = None
        if session is not None and not connect.clean_start:
            present = True
        elif session is not None:
            self._end_session(session, now, released=False, publish_pending_will=False)
            session = None
        if session is None:
            session = Session(client_id=client_id, persistent=expiry > 0)
            self.sessions[client_id] = session
            if self.hooks.session_created:
                self.hooks.notify(HookPoint.SESSION_CREATED, client_id)
        session.expiry_interval = expiry
        session.protocol_level = level
        session.disconnected_at = None
        session.connected_at = now
        session.clean_start = connect.clean_start
        session.will = connect.will
        self._set_persistent(session, expiry > 0)
        if session.persistent:
            self._store_meta(session)
            if connect.will is not None:
                # Kept so a crash of this node still sends the will on restart.
                self.store.put_will(client_id, connect.will, None)
            elif present:
                self.store.delete_will(client_id)
        self.connections[client_id] = conn
        self.stats.connections_total += 1
        return session, present

    def connection_lost(self, conn: ClientPort, now: float, *, publish_will: bool) -> None:
        """The connection of a session ended (cleanly or not)."""
        # Acks still waiting for a sync are dropped: the client resends those PUBLISHes.
        self.ack_waiters.pop(conn, None)
        if self.streams is not None:
            self.streams.client_gone(conn)  # its replays end with it
        session = conn.session
        if session is None or self.connections.get(session.client_id) is not conn:
            return  # never attached, or already taken over by a newer connection
        del self.connections[session.client_id]
        session.disconnected_at = now
        will = conn.take_will()
        session.will = None
        stored_will = False
        if publish_will and will is not None:
            delay = will.properties.will_delay_interval or 0 if conn.protocol_level == 5 else 0
            if delay == 0:
                self._publish_will(session.client_id, will, now)
            else:
                token = next(self._timer_seq)
                self._pending_wills[session.client_id] = (token, will)
                self._add_timer(now + delay, "will", session.client_id, token)
                if session.persistent:
                    self.store.put_will(session.client_id, will, now + delay)
                    stored_will = True
        if session.stored:
            if not stored_will:
                self.store.delete_will(session.client_id)
            self._store_meta(session)
        if session.expiry_interval == 0:
            self._end_session(session, now, publish_pending_will=True)
        elif session.expiry_interval != NEVER_EXPIRES:
            self._add_timer(now + session.expiry_interval, "expire", session.client_id, 0)

    def end_session_now(self, client_id: str, now: float) -> bool:
        """An operator ends a session (`DELETE /api/v1/sessions/<id>`): its connection,
        if any, is closed with 0x98 (administrative action) and its will goes out as on
        any server-side close; then the session, its subscriptions and its queue go,
        whatever its expiry. False when there is no such session here."""
        session = self.sessions.get(client_id)
        if session is None:
            return False
        conn = self.connections.get(client_id)
        if conn is not None:
            conn.close(ReasonCode.ADMINISTRATIVE_ACTION)
            self.connection_lost(conn, now, publish_will=True)
        if self.sessions.get(client_id) is session:
            self._end_session(session, now, publish_pending_will=True)
        return True

    def _end_session(self, session: Session, now: float, *, publish_pending_will: bool, released: bool = True) -> None:
        """Forget a session; `released=False` when a new one for the same client id
        replaces it at once (the client id stays claimed by this node)."""
        for topic_filter in list(session.subscriptions):
            self._remove_subscription(session, topic_filter)
        if session.stored:
            self.store.delete_session(session.client_id)
            session.stored = False
        self.sessions.pop(session.client_id, None)
        self.expired_while_down.pop(session.client_id, None)
        pending = self._pending_wills.pop(session.client_id, None)
        self._restored_due.discard(session.client_id)
        if pending is not None and publish_pending_will:
            # A will whose delay outlives the session is sent when the session ends.
            self._publish_will(session.client_id, pending[1], now)
        if session.dropped:
            log.info("session %s ended; %d queued messages had been dropped", session.client_id, session.dropped)
        if released and self.mesh is not None:
            self.mesh.session_ended(session.client_id)
        if self.hooks.session_terminated:
            self.hooks.notify(HookPoint.SESSION_TERMINATED, session.client_id)

    def _reconnected(self, client_id: str, now: float) -> None:
        """The client is back (here or elsewhere): its will waiting for its delay is
        cancelled; a restored one that was due (held for `restore`'s grace only) goes."""
        pending = self._pending_wills.pop(client_id, None)
        if self._restored_due and client_id in self._restored_due:
            self._restored_due.discard(client_id)
            if pending is not None:
                self._publish_will(client_id, pending[1], now)

    def cancel_will(self, client_id: str) -> bool:
        """A pending will that another node sent already (this node's, restored after a
        crash): it does not go.  Whether one was pending."""
        restored = self._restored_wills.pop(client_id, None)
        pending = self._pending_wills.get(client_id)
        if pending is None or pending[0] != restored:
            return False
        self._restored_due.discard(client_id)
        del self._pending_wills[client_id]
        session = self.sessions.get(client_id)
        if session is not None and session.stored:
            self.store.delete_will(client_id)
        return True

    def publish_will(self, client_id: str, will: Will, now: float) -> None:
        """A will sent on another node's behalf (a replica's, whose owner died and whose
        client never came back: `replication.service`)."""
        self._publish_will(client_id, will, now)

    def _publish_will(self, client_id: str, will: Will, now: float) -> None:
        props = will.properties
        expires_at = None
        if props.message_expiry_interval is not None:
            expires_at = now + props.message_expiry_interval
        if props is not EMPTY_PROPERTIES:
            props = replace(props, will_delay_interval=None, message_expiry_interval=None)
        msg = Message(will.topic, will.payload, will.qos, will.retain, props, expires_at, client_id, next(self._msg_ids), self.node_id)
        log.debug("publishing will of %s on %s", client_id, will.topic)
        self.publish(msg, now)

    # ------------------------------------------------------------------ timers

    def _add_timer(self, when: float, kind: str, key: str, token: int) -> None:
        earliest = self._timers[0][0] if self._timers else None
        heapq.heappush(self._timers, (when, next(self._timer_seq), kind, key, token))
        if earliest is None or when < earliest:
            self.on_timer_change()

    def next_deadline(self) -> float | None:
        return self._timers[0][0] if self._timers else None

    def handle_timers(self, now: float) -> None:
        while self._timers and self._timers[0][0] <= now:
            _, _, kind, key, token = heapq.heappop(self._timers)
            if kind == "will":
                pending = self._pending_wills.get(key)
                if pending is not None and pending[0] == token:
                    del self._pending_wills[key]
                    self._restored_due.discard(key)
                    session = self.sessions.get(key)
                    if session is not None and session.stored:
                        self.store.delete_will(key)
                    self._publish_will(key, pending[1], now)
            elif kind == "expire":
                session = self.sessions.get(key)
                if session is None or key in self.connections:
                    continue
                deadline = session.expires_at()
                if deadline is not None and deadline <= now:
                    if self.mesh is not None:
                        # Its client may have resumed it on a member this node could not
                        # hear: kept while that may be so, then merged there
                        # (routing.handoff_driver `_push_foreign_copies`) or ended.
                        left_at = session.disconnected_at if session.disconnected_at is not None else deadline
                        until = self.mesh.keep_expired(key, left_at, deadline, now)
                        if until is not None:
                            self.expired_while_down[key] = deadline
                            self._add_timer(until, "expire", key, 0)
                            continue
                    log_event(log, Event.SESSION_EXPIRED, client_id=key, expiry=session.expiry_interval, while_down=False)
                    self._end_session(session, now, publish_pending_will=True)

    # ------------------------------------------------------------ subscriptions

    def subscribe(self, session: Session, sub: Subscription, subscription_id: int | None, now: float) -> tuple[int, list[Delivery]]:
        """Record one subscription; return (granted reason code, retained deliveries)."""
        group, real_filter = parse_shared_subscription(sub.topic_filter)
        existed = sub.topic_filter in session.subscriptions
        options = SubscriptionOptions(
            qos=sub.qos,
            no_local=sub.no_local,
            retain_as_published=sub.retain_as_published,
            retain_handling=sub.retain_handling,
            subscription_id=subscription_id,
        )
        session.subscriptions[sub.topic_filter] = options
        if session.persistent:
            self.store.put_subscription(session.client_id, sub.topic_filter, options)
        self._index_subscription(session.client_id, group, real_filter)
        if self.hooks.session_subscribed:
            self.hooks.notify(HookPoint.SESSION_SUBSCRIBED, session.client_id, sub.topic_filter, sub.qos)
        retained: list[Delivery] = []
        # MQTT-3.3.1-9..11: retain handling; shared subscriptions get no retained messages.
        if group is None and (sub.retain_handling == 0 or (sub.retain_handling == 1 and not existed)):
            sub_ids = (subscription_id,) if subscription_id else ()
            for _, msg in self.retained.match(real_filter):
                if msg.expired(now):
                    continue
                retained.append(Delivery(msg, min(msg.qos, sub.qos), True, sub_ids))
        return sub.qos, retained

    def unsubscribe(self, session: Session, topic_filter: str) -> bool:
        if topic_filter not in session.subscriptions:
            return False
        self._remove_subscription(session, topic_filter)
        if self.hooks.session_unsubscribed:
            self.hooks.notify(HookPoint.SESSION_UNSUBSCRIBED, session.client_id, topic_filter)
        return True

    def _remove_subscription(self, session: Session, topic_filter: str) -> None:
        session.subscriptions.pop(topic_filter, None)
        if session.stored:
            self.store.delete_subscription(session.client_id, topic_filter)
        group, real_filter = parse_shared_subscription(topic_filter)
        if group is None:
            if self.subscriptions.remove(real_filter, session.client_id) and not self.subscriptions.has_filter(real_filter):
                self._matches.clear()
                self._route_changed(real_filter, False)
            return
        key = (group, real_filter)
        members = self.shared_members.get(key)
        if members and session.client_id in members:
            members.remove(session.client_id)
        if not members:
            self.shared_members.pop(key, None)
            self._shared_next.pop(key, None)
            self.shared.remove(real_filter, group)
            self._route_changed(topic_filter, False)

    def _index_subscription(self, client_id: str, group: str | None, real_filter: str) -> None:
        """Put a subscription into the local tries; announce a route for a filter's
        first local subscriber (shared ones route as `$share/group/filter`)."""
        if group is None:
            first = not self.subscriptions.has_filter(real_filter)
            if self.subscriptions.add(real_filter, client_id) and first:
                self._matches.clear()
                self._route_changed(real_filter, True)
            return
        members = self.shared_members.setdefault((group, real_filter), [])
        if client_id not in members:
            members.append(client_id)
            if len(members) == 1:
                self.shared.add(real_filter, group)
                self._route_changed(f"$share/{group}/{real_filter}", True)

    def _route_changed(self, route_filter: str, present: bool) -> None:
        if self.mesh is not None:
            self.mesh.route_changed(route_filter, present)

    # ------------------------------------------------------------------ publish

    def make_message(self, topic: str, payload: bytes, qos: int, retain: bool, properties: Properties, publisher: str | None, now: float) -> Message:
        expires_at = None
        if properties is not EMPTY_PROPERTIES:
            if properties.message_expiry_interval is not None:
                expires_at = now + properties.message_expiry_interval
            if properties.topic_alias is not None or properties.subscription_identifiers:
                # Per hop: an inbound PUBLISH's alias and subscription ids are never forwarded.
                properties = replace(properties, topic_alias=None, subscription_identifiers=())
        return Message(topic, payload, qos, retain, properties, expires_at, publisher, next(self._msg_ids), self.node_id)

    def has_subscribers(self, topic: str) -> bool:
        """Whether a message on `topic` published now would reach a session here."""
        # Not through `_match`: asked once per topic ($SYS client events), it would fill the cache.
        return bool(self.subscriptions.match_filters(topic)) or bool(len(self.shared) and self.shared.match_filters(topic))

    def _match(self, topic: str) -> list[tuple[str, set[str]]]:
        """Each local filter matching `topic` with its subscribers (never mutate them)."""
        found = self._matches.get(topic)
        if found is None:
            found = self.subscriptions.match_filters(topic)
            matches = self._matches
            if len(matches) >= MATCH_CACHE_TOPICS:
                matches.clear()
            matches[topic] = found
        return found

    def publish(self, msg: Message, now: float, *, internal: bool = False, gate: AckGate | None = None,
                replay: bool = False, here: bool = False) -> int:
        """Route a message published by a local client (or the node itself) to every
        matching session here and once to every other node with a matching route;
        return how many sessions here got it. `internal` messages ($SYS) are not
        counted, not stored and not forwarded. `gate` collects what the publisher's
        acknowledgement must wait for (remote nodes' acks). `replay`: the message may
        have gone out once already (a delayed one fired again after a restart): the
        nodes it is forwarded to drop a copy they took. `here`: the caller found that
        the mesh wants none of it (`Mesh.stays_here`, asked once per message)."""
        if not internal:
            self.stats.messages_in[msg.qos] += 1
            streams = self.streams
            if streams is not None and streams.specs:
                msg = streams.append(msg, now)  # kept (with its position) if it is a stream's
        if msg.retain:
            self._set_retained(msg, persist=not internal)
        mesh = self.mesh
        if mesh is None or internal or here or mesh.stays_here(msg.retain):
            return self._route(msg, now, plain=True, only_groups=None, remote=None)
        # One shared share for every plain-only node (no object per node per message).
        remote = dict.fromkeys(mesh.plain_nodes(msg.topic), PLAIN_ONLY)
        if msg.retain:
            # Retained messages are replicated: every node keeps the latest one.
            for node in mesh.retained_targets():
                target = remote.get(node)
                remote[node] = RETAINED_ONLY if target is None else target.keeping_retained()
        if self._match(msg.topic) or len(self.shared) or mesh.has_shared_routes():
            matched = self._route(msg, now, plain=True, only_groups=None, remote=remote)
        else:
            matched = 0  # no subscriber here, no shared group anywhere: a forward's common case
        if replay:
            for node, target in remote.items():
                remote[node] = target.replayed()
        held = mesh.forward(msg, remote, gate)  # a subscriber on an unreachable member still matched
        return matched + len(remote) + held

    def publish_remote(self, msg: Message, now: float, *, plain: bool, groups: list[tuple[str, str]], keep_retained: bool,
                       skip: Callable[[str], bool] | None = None, maybe_sent: bool = False,
                       recovery: bool = False, also: tuple[str, ...] = ()) -> int:
        """A message another node forwarded here: deliver to local sessions only
        (plain subscribers if `plain`, one member of each listed shared group), except
        the plain subscribers `skip` names (sessions taken over here whose previous
        node had the message: see routing.handoff_driver `TakenIn`).  `maybe_sent`: it
        may have been delivered here before (a link batch resent to a node that
        restarted): a session that still holds it does not take it again, and the others
        get it with DUP=1.  `recovery`: held for this node while it was unreachable and
        replayed now it is back, accepted for its sessions already: the queue limit
        does not drop it (`Session.recovered` room, as at a takeover).  `also`: the
        other nodes its sender forwarded it to (`deliver`: a session taken from one of
        them gets it with DUP=1)."""
        if keep_retained:
            self._set_retained(msg, persist=True)
        if not plain and not groups:
            return 0
        if maybe_sent:
            skip = _skip_holders(self.sessions, message_key(msg), skip)
        forwarded_to = also if self._taken_from else ()
        if recovery or forwarded_to:
            self._recovering = recovery
            self._forwarded_to = forwarded_to
            try:
                return self._route(msg, now, plain=plain, only_groups=groups, remote=None, skip=skip, dup=maybe_sent)
            finally:
                self._recovering = False
                self._forwarded_to = ()
        return self._route(msg, now, plain=plain, only_groups=groups, remote=None, skip=skip, dup=maybe_sent)

    def deliver_remote(self, msg: Message, now: float) -> int:
        """`publish_remote` of a QoS 0 message forwarded for plain subscribers only,
        not sent here before (the common case: one call per message of a batch)."""
        return self._route(msg, now, plain=True, only_groups=_NO_GROUPS, remote=None)

    def keep_retained(self, msg: Message) -> None:
        self._set_retained(msg, persist=True)

    def _set_retained(self, msg: Message, *, persist: bool) -> None:
        if not msg.payload:
            if self.retained.delete(msg.topic) and persist:
                self.store.delete_retained(msg.topic)
        else:
            self.retained.set(msg.topic, msg)
            self.stats.retained_set += 1
            if persist:
                self.store.put_retained(msg)

    def _route(self, msg: Message, now: float, *, plain: bool, only_groups: list[tuple[str, str]] | None,
               remote: dict[str, ForwardTarget] | None, skip: Callable[[str], bool] | None = None,
               dup: bool = False) -> int:
        """Deliver to sessions here: plain subscribers (if `plain`) and one member per
        shared group this node serves (see `_shared_keys`); `dup`: each delivery goes
        with DUP=1 (it may have been sent before)."""
        topic = msg.topic
        matches = self._match(topic) if plain else ()
        # A forwarded message names its groups; else no shared group here, none
        # elsewhere to weigh: no keys (the common case).
        shared_keys = only_groups if only_groups is not None else self._shared_keys(topic, None, remote) \
            if len(self.shared) or remote is not None and self.mesh is not None and self.mesh.has_shared_routes() else ()
        if not matches and not shared_keys:
            return 0
        sessions = self.sessions
        if len(matches) == 1 and not shared_keys:
            # One filter and no shared group (the common case): no session can match
            # twice, so nothing to merge: no targets dict, no list per subscriber.
            topic_filter, client_ids = matches[0]
            msg_qos = msg.qos
            delivered = 0
            for client_id in client_ids:
                session = sessions[client_id]
                options = session.subscriptions[topic_filter]
                if options.no_local and client_id == msg.publisher or skip is not None and skip(client_id):
                    continue
                sub_id = options.subscription_id
                delivery = Delivery(msg, options.qos if options.qos < msg_qos else msg_qos,
                                    msg.retain and options.retain_as_published, (sub_id,) if sub_id else ())
                if dup:
                    delivery.dup = True
                self.deliver(session, delivery, now)
                delivered += 1
            return delivered
        # One copy per session: highest QoS, every subscription identifier (MQTT-3.3.4-2..5).
        targets: dict[str, _SessionTarget] = {}
        for topic_filter, client_ids in matches:
            for client_id in client_ids:
                session = sessions[client_id]
                options = session.subscriptions[topic_filter]
                if options.no_local and client_id == msg.publisher or skip is not None and skip(client_id):
                    continue
                self._merge_target(targets, session, options, msg)
        for group, real_filter in shared_keys:
            member = self._pick_shared(group, real_filter)
            if member is None:
                continue
            options = member.subscriptions[f"$share/{group}/{real_filter}"]
            self._merge_target(targets, member, options, msg)
        for t in targets.values():
            delivery = Delivery(msg, t.qos, t.retain, tuple(t.subscription_ids))
            if dup:
                delivery.dup = True
            self.deliver(t.session, delivery, now)
        return len(targets)

    def _shared_keys(self, topic: str, only_groups: list[tuple[str, str]] | None,
                     remote: dict[str, ForwardTarget] | None) -> list[tuple[str, str]]:
        """The shared groups this node serves for one message.

        A forwarded message names them (`only_groups`). For a local publish in a
        cluster, each matching group gets exactly one node, round-robin over the nodes
        with members (this one included); the groups given to other nodes are added
        to their forward targets."""
        if only_groups is not None:
            return only_groups
        local = [(g, f) for f, groups in self.shared.match_filters(topic) for g in groups] if len(self.shared) else []
        mesh = self.mesh
        if remote is None or mesh is None:
            return local
        elsewhere = mesh.shared_nodes(topic)
        if not elsewhere:
            return local
        mine: list[tuple[str, str]] = []
        for key in set(local) | elsewhere.keys():
            candidates = sorted(elsewhere.get(key, set()) | ({self.node_id} if key in local else set()))
            choice = mesh.pick_shared_node(key, candidates)
            if choice == self.node_id:
                mine.append(key)
            else:
                remote[choice] = remote.get(choice, GROUPS_ONLY).with_group(key)
        return mine

    @staticmethod
    def _merge_target(targets: dict[str, _SessionTarget], session: Session, options: SubscriptionOptions, msg: Message) -> None:
        qos = options.qos if options.qos < msg.qos else msg.qos
        retain = msg.retain and options.retain_as_published
        entry = targets.get(session.client_id)
        if entry is None:
            targets[session.client_id] = _SessionTarget(session, qos, retain, [options.subscription_id] if options.subscription_id else [])
            return
        if qos > entry.qos:
            entry.qos = qos
        entry.retain = entry.retain or retain
        if options.subscription_id:
            entry.subscription_ids.append(options.subscription_id)

    def _pick_shared(self, group: str, real_filter: str) -> Session | None:
        key = (group, real_filter)
        members = self.shared_members.get(key)
        if not members:
            return None
        start = self._shared_next.get(key, 0)
        n = len(members)
        fallback: Session | None = None
        for i in range(n):
            client_id = members[(start + i) % n]
            session = self.sessions.get(client_id)
            if session is None:
                continue
            if client_id in self.connections:
                self._shared_next[key] = (start + i + 1) % n
                return session
            if fallback is None and session.persistent:
                fallback = session
        self._shared_next[key] = (start + 1) % n
        return fallback

    def deliver(self, session: Session, delivery: Delivery, now: float) -> None:
        if self.remembered and session.client_id in self.remembered:
            # A session that remembers what it was given (a copy of it elsewhere is to
            # be merged into it) takes each message once, whichever way it came.
            msg = delivery.message
            if (msg.origin, msg.msg_id) in self.remembered[session.client_id]:
                return
            self._remember(session.client_id, msg)
            taken_from = self._taken_from.get(session.client_id) if delivery.qos else None
            if taken_from is not None and (msg.origin == taken_from or taken_from in self._forwarded_to):
                # Taken from a replica: the copy does not know what its owner delivered
                # last, and a message published there, or forwarded there too, may have
                # reached the client there before (simulator seed 183 of 5 nodes, 20
                # clients, 60 s, 2 replicas, a crash: p2/1/5, published and delivered on
                # n1 during a cut n1 -> n2, came to s1 again on n2, which had taken s1
                # from its replica, in the forward n1 had held for n2 and replayed at the
                # heal, without DUP; seed 338: the same, published on n4 beside n1 and
                # forwarded to both).
                delivery.dup = True
        conn = self.connections.get(session.client_id)
        if conn is not None:
            conn.deliver(delivery, now)
            if faults.DOUBLE_DELIVER_QOS2 and delivery.qos == 2:  # BUGGIFY: a second copy
                conn.deliver(Delivery(delivery.message, 2, delivery.retain, delivery.subscription_ids), now)
            return
        if not session.persistent:
            return
        if delivery.qos == 0 and not self.limits.queue_qos0:
            return
        self.enqueue(session, delivery)

    # ------------------------------------------- session state changes (mirrored to the store)

    def enqueue(self, session: Session, delivery: Delivery) -> None:
        if session.persistent and not delivery.seq:
            delivery.seq = session.take_seq()
        if self._recovering:  # a held message replayed (`publish_remote`): room beyond the limit
            queued_before = session.recovery_starts(1)
            dropped = session.enqueue(delivery, self.limits.max_queued_messages)
            session.recovery_ended(1, queued_before)
        else:
            dropped = session.enqueue(delivery, self.limits.max_queued_messages)
        if session.persistent and dropped is not delivery:
            self.store.put_queued(session.client_id, delivery)
        if dropped is not None:
            if session.stored and dropped.seq and dropped is not delivery:
                self.store.release_delivery(session.client_id, dropped)
            self._note_queue_drop(session, dropped)

    def dequeue(self, session: Session) -> Delivery:
        """The head of the queue, which the caller either sends (`add_inflight`, whose
        record replaces the queued one) or is done with (`release_dequeued`)."""
        delivery = session.queue.popleft()
        if session.recovered:
            session.taken_from_queue(1)
        return delivery

    def release_dequeued(self, session: Session, delivery: Delivery) -> None:
        """A dequeued delivery that goes no further (QoS 0 sent, expired)."""
        if session.stored and delivery.seq:
            self.store.release_delivery(session.client_id, delivery)

    def add_inflight(self, session: Session, packet_id: int, delivery: Delivery) -> None:
        session.inflight[packet_id] = InflightEntry(delivery)
        if session.persistent:
            if not delivery.seq:
                delivery.seq = session.take_seq()
            self.store.put_inflight(session.client_id, packet_id, delivery, "publish")

    def release_inflight(self, session: Session, packet_id: int) -> bool:
        entry = session.inflight.pop(packet_id, None)
        if entry is None:
            return False
        if session.stored:
            self.store.release_delivery(session.client_id, entry.delivery)
        return True

    def mark_pubrel(self, session: Session, packet_id: int, entry: InflightEntry) -> None:
        entry.state = "pubrel"
        if session.stored:
            self.store.put_inflight(session.client_id, packet_id, entry.delivery, "pubrel")

    def qos2_received(self, session: Session, packet_id: int) -> None:
        session.qos2_in.add(packet_id)
        if session.persistent:
            self.store.put_qos2_in(session.client_id, packet_id)

    def qos2_released(self, session: Session, packet_id: int) -> None:
        session.qos2_in.discard(packet_id)
        if session.stored:
            self.store.delete_qos2_in(session.client_id, packet_id)

    def set_expiry(self, session: Session, expiry: int) -> None:
        """Session expiry changed by DISCONNECT."""
        session.expiry_interval = expiry
        self._set_persistent(session, expiry > 0)
        if session.persistent:
            self._store_meta(session)

    def _set_persistent(self, session: Session, persistent: bool) -> None:
        if persistent and not session.stored:
            session.persistent = True
            self._store_everything(session)
        elif not persistent and session.stored:
            self.store.delete_session(session.client_id)
            session.stored = False
        session.persistent = persistent

    def _store_meta(self, session: Session) -> None:
        self.store.put_session(session.client_id, session.expiry_interval, session.protocol_level, session.disconnected_at, session.next_seq)
        session.stored = True

    def _store_everything(self, session: Session) -> None:
        """A session became persistent: write all it holds so far."""
        self._store_meta(session)
        cid = session.client_id
        store = self.store
        for topic_filter, options in session.subscriptions.items():
            store.put_subscription(cid, topic_filter, options)
        # A delivery may remember a record from an earlier stored spell of the session,
        # deleted with its other records since: forget it, so it is written again.
        for pid, entry in session.inflight.items():
            if not entry.delivery.seq:
                entry.delivery.seq = session.take_seq()
            store.forget(entry.delivery)
            store.put_inflight(cid, pid, entry.delivery, entry.state)
        for d in session.queue if session.queued else ():
            if not d.seq:
                d.seq = session.take_seq()
            store.forget(d)
            store.put_queued(cid, d)
        for pid in session.qos2_in:
            self.store.put_qos2_in(cid, pid)

    def on_durable(self) -> None:
        """The store committed a batch (or a remote node acknowledged a forward):
        release the acknowledgements that waited for it."""
        durable = self.store.durable_epoch
        for conn in list(self.ack_waiters):
            if conn.release_acks(durable):
                self.ack_waiters.pop(conn, None)
        if self._durable_callbacks and self._durable_callbacks[0][0] <= durable:
            ready = [cb for epoch, cb in self._durable_callbacks if epoch <= durable]
            self._durable_callbacks = [(e, cb) for e, cb in self._durable_callbacks if e > durable]
            for cb in ready:
                cb()

    def when_durable(self, epoch: int, callback: Callable[[], None]) -> None:
        """Call `callback` once every store change up to `epoch` is committed."""
        if epoch <= self.store.durable_epoch:
            callback()
        else:
            self._durable_callbacks.append((epoch, callback))
            self._durable_callbacks.sort(key=lambda entry: entry[0])

    # ------------------------------------------------------------------ restart

    def restore(self, state: RecoveredState, now: float, *, will_grace: float = 0.0) -> None:
        """Rebuild sessions, tries, retained messages and timers from the store.  A
        restored will goes `will_grace` seconds after the start at the earliest: a
        replica or the node that took its session over may have sent it while this
        node was down, and says so (`cancel_will`) once it sees this node back."""
        for msg in state.retained:
            if not msg.expired(now):
                self.retained.set(msg.topic, msg)
            else:
                self.store.delete_retained(msg.topic)
        for meta_key in state.meta:
            if meta_key.startswith(REMEMBERED_META):
                client_id, _, rest = meta_key[len(REMEMBERED_META):].partition("/")
                origin, _, msg_id = rest.rpartition("/")
                if msg_id.isdigit():
                    self.remembered.setdefault(client_id, set()).add((origin or None, int(msg_id)))
        ids = [msg.msg_id for msg in state.retained]
        for stored in state.sessions.values():
            session = self._rebuild_session(stored, now, from_store=True)
            ids.extend(e.delivery.message.msg_id for e in session.inflight.values())
            ids.extend(d.message.msg_id for d in session.queue if session.queued)
            if stored.will is not None:
                will, due = stored.will
                if due is None:  # connected at the crash: the close was abnormal
                    delay = will.properties.will_delay_interval or 0
                    due = now + delay
                if will_grace and due < now + will_grace:
                    if due <= now:
                        self._restored_due.add(stored.client_id)
                    due = now + will_grace
                token = next(self._timer_seq)
                self._pending_wills[stored.client_id] = (token, will)
                self._restored_wills[stored.client_id] = token
                self._add_timer(due, "will", stored.client_id, token)
            deadline = session.expires_at()
            if self.mesh is not None and deadline is not None and deadline <= now:
                # Its client may have resumed it on another node before it expired (a
                # takeover falls back while this node is down): kept a little, so the
                # handoff driver can merge it there.  A CONNECT here still finds it
                # expired (`open_session`), and the timer ends it after the grace.
                self.expired_while_down[session.client_id] = deadline
                self._add_timer(now + EXPIRED_WHILE_DOWN_GRACE, "expire", session.client_id, 0)
            else:
                self._schedule_expiry(session, now)
        if ids:
            self._msg_ids = itertools.count(max(max(ids) + 1, next(self._msg_ids)))
        if state.sessions or state.retained:
            log.info(
                "restored %d persistent sessions (%d queued, %d inflight messages) and %d retained messages%s",
                len(state.sessions), sum(len(s.queue) for s in state.sessions.values()),
                sum(len(s.inflight) for s in state.sessions.values()), len(state.retained),
                f"; skipped {state.skipped} unreadable records" if state.skipped else "",
            )

    def _rebuild_session(self, stored: StoredSession, now: float, *, from_store: bool) -> Session:
        """A session from its stored (or handed-over) form, indexed in the tries."""
        cid = stored.client_id
        seqs = [d.seq for _, d, _ in stored.inflight] + [d.seq for d in stored.queue]
        session = Session(
            client_id=cid, persistent=True, expiry_interval=stored.expiry_interval,
            protocol_level=stored.protocol_level, stored=from_store,
            # A session that was connected when the node stopped was disconnected then.
            disconnected_at=stored.disconnected_at if stored.disconnected_at is not None else now,
            next_seq=max([stored.next_seq] + [q + 1 for q in seqs]),
        )
        self.sessions[cid] = session
        for topic_filter, options in stored.subscriptions.items():
            session.subscriptions[topic_filter] = options
            self._index_subscription(cid, *parse_shared_subscription(topic_filter))
        for pid, delivery, st in stored.inflight:
            session.inflight[pid] = InflightEntry(delivery, st)
        if stored.queue:
            session.queue.extend(stored.queue)
            # What a recovery left beyond the limit stays (its room shrinks as it is sent).
            session.recovered = max(0, len(stored.queue) - self.limits.max_queued_messages)
        if stored.qos2_in:
            session.qos2_in.update(stored.qos2_in)
        if from_store:
            if stored.disconnected_at is None:
                self._store_meta(session)
        else:
            self._store_everything(session)
        return session

    def _schedule_expiry(self, session: Session, now: float) -> None:
        deadline = session.expires_at()
        if deadline is not None and deadline <= now:
            log_event(log, Event.SESSION_EXPIRED, client_id=session.client_id, expiry=session.expiry_interval, while_down=True)
            self._end_session(session, now, publish_pending_will=True)
        elif deadline is not None:
            self._add_timer(deadline, "expire", session.client_id, 0)

    # ------------------------------------------------------------------ handoff

    def detach_for_handoff(self, client_id: str, now: float) -> Session | None:
        """Another node takes this session over: close its connection here (0x8E) and
        keep queueing for it until the handoff commits.  The old connection's will goes
        out only if it has no delay (the reconnect elsewhere continues the session)."""
        session = self.sessions.get(client_id)
        conn = self.connections.pop(client_id, None)
        if conn is not None:
            self.ack_waiters.pop(conn, None)
            conn.close(ReasonCode.SESSION_TAKEN_OVER)
            will = conn.take_will()
            if will is not None and not (will.properties.will_delay_interval or 0):
                self._publish_will(client_id, will, now)
        self._reconnected(client_id, now)
        if session is None:
            return None
        if not session.persistent:
            # A clean session ends with its connection: nothing to hand over.
            self._end_session(session, now, publish_pending_will=False, released=False)
            return None
        session.will = None
        if session.disconnected_at is None:
            session.disconnected_at = now
        if session.stored:
            self.store.delete_will(client_id)
            self._store_meta(session)
        return session

    def install_session(self, stored: StoredSession, now: float) -> Session:
        """A session handed over by another node: replace any copy here, store it all,
        take its subscriptions into the tries (and so into the routes)."""
        old = self.sessions.get(stored.client_id)
        if old is not None:
            self._end_session(old, now, released=False, publish_pending_will=False)
        stored.disconnected_at = now
        session = self._rebuild_session(stored, now, from_store=False)
        if stored.will is not None:
            self._adopt_will(session, *stored.will, now)
        self._schedule_expiry(session, now)
        return session

    def _adopt_will(self, session: Session, will: Will, due: float | None, now: float) -> None:
        """The will of a session taken from a replica: its connection was lost with its
        dead owner (`due` None: connected then) or before (pending until `due`), and no
        one sent it.  Due now: sent now (a reconnect cannot cancel a will without
        delay); else pending as on its owner, so the CONNECT that continues the session
        cancels it (`open_session`) and its timer sends it otherwise."""
        if due is None:
            due = now + (will.properties.will_delay_interval or 0 if session.protocol_level == 5 else 0)
        if due <= now:
            self._publish_will(session.client_id, will, now)
            return
        token = next(self._timer_seq)
        self._pending_wills[session.client_id] = (token, will)
        self._add_timer(due, "will", session.client_id, token)
        if session.stored:
            self.store.put_will(session.client_id, will, due)

    def merge_handed_tail(self, session: Session, add: list[Delivery], drop: list[Delivery]) -> None:
        """A's tail joins the queue in sequence order; copies that also came directly go."""
        if not add and not drop:
            return
        dropped = {id(d) for d in drop}
        entries = [d for d in session.queue if id(d) not in dropped] + add
        entries.sort(key=lambda d: d.seq)
        session.queue.clear()
        session.queue.extend(entries)
        # Accepted on the session's behalf: room beyond the queue limit.
        session.recovered = min(session.recovered + len(add), session.queued)
        for d in drop:
            self.store.release_delivery(session.client_id, d)
        for d in add:
            self.store.put_queued(session.client_id, d)

    def _remember(self, client_id: str, msg: Message) -> None:
        keys = self.remembered[client_id]
        if len(keys) < REMEMBER_LIMIT:
            key = (msg.origin, msg.msg_id)
            keys.add(key)
            self.store.put_meta(_remembered_meta(client_id, key), 1)

    def remember(self, client_id: str, keys: Iterable[tuple[str | None, int]], *, taken_from: str | None = None) -> None:
        """Remember (from now on, and these) the messages a session is given: one it
        was given is not delivered to it again, whichever way it comes back.
        `taken_from`: the session came from a replica of this owner's copy (`deliver`)."""
        if taken_from is not None:
            self._taken_from[client_id] = taken_from
        known = self.remembered.setdefault(client_id, set())
        for key in keys:
            if key not in known and len(known) < REMEMBER_LIMIT:
                known.add(key)
                self.store.put_meta(_remembered_meta(client_id, key), 1)

    def taken_from(self, client_id: str) -> str | None:
        """The owner a remembering session was taken from, if it came from a replica."""
        return self._taken_from.get(client_id)

    def forget_remembered(self, client_id: str) -> None:
        self._taken_from.pop(client_id, None)
        for key in self.remembered.pop(client_id, ()):
            self.store.delete_meta(_remembered_meta(client_id, key))

    def merge_session(self, stored: StoredSession, now: float, *, ahead_of: int | None = None) -> int:
        """Another node's copy of a session this node owns (a takeover that fell back,
        a netsplit): subscriptions it lacks are added, its inflight and queued messages
        join the queue unless already here (same origin and message id).  `ahead_of`: a
        delivery sequence number; the queued deliveries from it on (come since, as the
        messages held for a dead owner are fetched at a takeover) are merged with the
        copy's in the order their origin nodes numbered them, so each publisher's come
        in its order.  Returns how many messages were added."""
        session = self.sessions.get(stored.client_id)
        if session is None:
            self.install_session(stored, now)
            return len(stored.inflight) + len(stored.queue)
        for topic_filter, options in stored.subscriptions.items():
            if topic_filter not in session.subscriptions:
                session.subscriptions[topic_filter] = options
                self._index_subscription(session.client_id, *parse_shared_subscription(topic_filter))
                if session.stored:
                    self.store.put_subscription(session.client_id, topic_filter, options)
        known = set(self.remembered.get(session.client_id, ()))
        known.update((e.delivery.message.origin, e.delivery.message.msg_id) for e in session.inflight.values())
        known.update((d.message.origin, d.message.msg_id) for d in (session.queue if session.queued else ()))
        added: list[tuple[Delivery, bool]] = []
        for d in [d for _, d, _ in stored.inflight] + stored.queue:
            key = (d.message.origin, d.message.msg_id)
            if key in known or d.message.expired(now):
                continue
            known.add(key)
            copy = Delivery(d.message, d.qos, d.retain, d.subscription_ids)
            copy.dup = d.dup
            added.append((copy, True))
        since: list[Delivery] = []
        if added and ahead_of is not None and session.queued:
            # (Only when something joins: the fetches after a takeover mostly find what
            # the session has, and the tail is rewritten to the store when re-sorted.)
            queue = session.queue
            while queue and queue[-1].seq >= ahead_of:
                since.append(queue.pop())
            since.reverse()
            if session.stored:
                for d in since:
                    self.store.release_delivery(session.client_id, d)  # queued again below, renumbered
        merging = list(added)
        if since:
            for d in since:
                again = Delivery(d.message, d.qos, d.retain, d.subscription_ids)  # a new record
                again.dup = d.dup
                merging.append((again, False))
            # Message ids rise with each origin node's publishes: one publisher's
            # messages keep its order (the sort is stable).
            merging = sorted(merging, key=lambda item: item[0].message.msg_id)
        # Accepted on the session's behalf already: the queue limit (against a slow
        # consumer) drops none of it (README "Session replication").
        queued_before = session.recovery_starts(len(merging))
        for d, new in merging:
            if new:
                self.deliver(session, d, now)
            else:
                self.enqueue(session, d)  # delivered here before: remembered already
        session.recovery_ended(len(merging), queued_before)
        return len(added)

    def discard_session(self, client_id: str, now: float) -> None:
        """Forget a session without its will (handed to another node, or a handoff undone)."""
        session = self.sessions.get(client_id)
        if session is not None and client_id not in self.connections:
            self._end_session(session, now, publish_pending_will=False)

    def dropped(self, msg: Message, reason: str) -> None:
        """message.dropped: a message that reached no one here, or one session's copy
        that is lost (queue_full, slow_consumer, expired, too_large, no_subscribers,
        dropped_by_hook). Counted by the caller in `stats`."""
        if self.hooks.message_dropped:
            self.hooks.notify(HookPoint.MESSAGE_DROPPED, msg, reason)

    def _note_queue_drop(self, session: Session, dropped: Delivery) -> None:
        self.stats.dropped_queue_full += 1
        self.dropped(dropped.message, "queue_full")
        if session.dropped == 1 or session.dropped % 1000 == 0:
            log.warning(
                "queue of %s full (max_queued_messages=%d): dropped a QoS %d message on %s (%d dropped so far)",
                session.client_id, self.limits.max_queued_messages, dropped.qos, dropped.message.topic, session.dropped,
            )

    # ------------------------------------------------------------------ inspection

    def close_all(self, reason: int) -> None:
        for conn in list(self.connections.values()):
            conn.close(reason)

    def client_count(self) -> int:
        return len(self.connections)

    def subscription_count(self) -> int:
        return sum(s.subscription_count for s in self.sessions.values())


def _skip_holders(sessions: Mapping[str, Session], key: tuple[str | None, int],
                  skip: Callable[[str], bool] | None) -> Callable[[str], bool]:
    """`skip`, and every session that holds the message `key` names (in flight or
    queued): it came again, and the copy it holds is the one it gets."""
    def skip_holders(client_id: str) -> bool:
        if skip is not None and skip(client_id):
            return True
        session = sessions.get(client_id)
        if session is None:
            return False
        held = [e.delivery.message for e in session.inflight.values()]
        if session.queued:
            held.extend(d.message for d in session.queue)
        return any(message_key(m) == key for m in held)
    return skip_holders
