"""The single-node broker: sessions, subscriptions, retained messages, wills, routing.

Synchronous and clock-free: every entry point takes `now` (wall-clock seconds, so
expiry survives restarts) and the Trio shells (`mesh.connection`, `mesh.node`) call in.
It writes to connections only through `ClientConnection.deliver` / `.close`, which
append to that connection's outbox; it never awaits.

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
import uuid
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, Iterable

from mesh.mqtt import EMPTY_PROPERTIES, Connect, Properties, ReasonCode, Subscription
from mesh.mqtt.topics import parse_shared_subscription
from routing.retained import RetainedIndex
from routing.trie import TopicTrie
from session_store.model import NEVER_EXPIRES, Delivery, Message, Session, SubscriptionOptions

if TYPE_CHECKING:
    from mesh.connection import ClientConnection

log = logging.getLogger("meshd.broker")


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

    @classmethod
    def from_settings(cls, settings: Any) -> "BrokerLimits":
        return cls(**{name: getattr(settings, name) for name in cls.__dataclass_fields__})


class BrokerStats:
    """Plain counters on the hot path; `/metrics` and `$SYS` read them."""

    __slots__ = (
        "messages_in", "messages_out", "bytes_in", "bytes_out", "dropped_queue_full",
        "dropped_slow_consumer", "dropped_expired", "dropped_too_large", "connections_total",
        "protocol_errors", "retained_set",
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
        self.connections_total = 0
        self.protocol_errors = 0
        self.retained_set = 0


# Properties of an inbound PUBLISH that are per-hop and never forwarded.
_PER_HOP = {"topic_alias": None, "subscription_identifiers": ()}


class Broker:
    def __init__(self, limits: BrokerLimits | None = None, *, node_id: str = "meshd") -> None:
        self.limits = limits or BrokerLimits()
        self.node_id = node_id
        self.sessions: dict[str, Session] = {}
        self.connections: dict[str, ClientConnection] = {}
        self.subscriptions: TopicTrie[str] = TopicTrie()
        # filter -> group names with members on that filter; (group, filter) -> client ids
        self.shared: TopicTrie[str] = TopicTrie()
        self.shared_members: dict[tuple[str, str], list[str]] = {}
        self._shared_next: dict[tuple[str, str], int] = {}
        self.retained: RetainedIndex[Message] = RetainedIndex()
        self.stats = BrokerStats()
        self._timers: list[tuple[float, int, str, str, int]] = []
        self._timer_seq = itertools.count()
        self._pending_wills: dict[str, tuple[int, Any]] = {}
        self._msg_ids = itertools.count(1)
        # Set by the node: called when an earlier timer deadline appears.
        self.on_timer_change: Callable[[], None] = lambda: None

    # ------------------------------------------------------------------ connect

    def assign_client_id(self) -> str:
        return "auto-" + uuid.uuid4().hex[:16]

    def open_session(self, conn: "ClientConnection", connect: Connect, client_id: str, now: float) -> tuple[Session, bool]:
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
        self._pending_wills.pop(client_id, None)

        level = connect.protocol_level
        if level == 5:
            expiry = connect.properties.session_expiry_interval or 0
        else:
            expiry = 0 if connect.clean_start else NEVER_EXPIRES

        session = self.sessions.get(client_id)
        present = False
        if session is not None and not connect.clean_start:
            present = True
        elif session is not None:
            self._end_session(session, now, publish_pending_will=False)
            session = None
        if session is None:
            session = Session(client_id=client_id, persistent=expiry > 0)
            self.sessions[client_id] = session
        session.expiry_interval = expiry
        session.persistent = expiry > 0
        session.protocol_level = level
        session.disconnected_at = None
        session.will = connect.will
        self.connections[client_id] = conn
        self.stats.connections_total += 1
        return session, present

    def connection_lost(self, conn: "ClientConnection", now: float, *, publish_will: bool) -> None:
        """The connection of a session ended (cleanly or not)."""
        session = conn.session
        if session is None or self.connections.get(session.client_id) is not conn:
            return  # never attached, or already taken over by a newer connection
        del self.connections[session.client_id]
        session.disconnected_at = now
        will = conn.take_will()
        session.will = None
        if publish_will and will is not None:
            delay = will.properties.will_delay_interval or 0 if conn.protocol_level == 5 else 0
            if delay == 0:
                self._publish_will(session.client_id, will, now)
            else:
                token = next(self._timer_seq)
                self._pending_wills[session.client_id] = (token, will)
                self._add_timer(now + delay, "will", session.client_id, token)
        if session.expiry_interval == 0:
            self._end_session(session, now, publish_pending_will=True)
        elif session.expiry_interval != NEVER_EXPIRES:
            self._add_timer(now + session.expiry_interval, "expire", session.client_id, 0)

    def _end_session(self, session: Session, now: float, *, publish_pending_will: bool) -> None:
        for topic_filter in list(session.subscriptions):
            self._remove_subscription(session, topic_filter)
        self.sessions.pop(session.client_id, None)
        pending = self._pending_wills.pop(session.client_id, None)
        if pending is not None and publish_pending_will:
            # A will whose delay outlives the session is sent when the session ends.
            self._publish_will(session.client_id, pending[1], now)
        if session.dropped:
            log.info("session %s ended; %d queued messages had been dropped", session.client_id, session.dropped)

    def _publish_will(self, client_id: str, will: Any, now: float) -> None:
        props = will.properties
        expires_at = None
        if props.message_expiry_interval is not None:
            expires_at = now + props.message_expiry_interval
        if props is not EMPTY_PROPERTIES:
            props = replace(props, will_delay_interval=None, message_expiry_interval=None)
        msg = Message(will.topic, will.payload, will.qos, will.retain, props, expires_at, client_id, next(self._msg_ids))
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
                    self._publish_will(key, pending[1], now)
            elif kind == "expire":
                session = self.sessions.get(key)
                if session is None or key in self.connections:
                    continue
                deadline = session.expires_at()
                if deadline is not None and deadline <= now:
                    log.info("session %s expired", key)
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
        if group is None:
            self.subscriptions.add(real_filter, session.client_id)
        else:
            members = self.shared_members.setdefault((group, real_filter), [])
            if session.client_id not in members:
                members.append(session.client_id)
            self.shared.add(real_filter, group)
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
        return True

    def _remove_subscription(self, session: Session, topic_filter: str) -> None:
        session.subscriptions.pop(topic_filter, None)
        group, real_filter = parse_shared_subscription(topic_filter)
        if group is None:
            self.subscriptions.remove(real_filter, session.client_id)
            return
        key = (group, real_filter)
        members = self.shared_members.get(key)
        if members and session.client_id in members:
            members.remove(session.client_id)
        if not members:
            self.shared_members.pop(key, None)
            self._shared_next.pop(key, None)
            self.shared.remove(real_filter, group)

    # ------------------------------------------------------------------ publish

    def make_message(self, topic: str, payload: bytes, qos: int, retain: bool, properties: Properties, publisher: str | None, now: float) -> Message:
        expires_at = None
        if properties is not EMPTY_PROPERTIES:
            if properties.message_expiry_interval is not None:
                expires_at = now + properties.message_expiry_interval
            if properties.topic_alias is not None or properties.subscription_identifiers:
                properties = replace(properties, **_PER_HOP)
        return Message(topic, payload, qos, retain, properties, expires_at, publisher, next(self._msg_ids))

    def publish(self, msg: Message, now: float, *, internal: bool = False) -> int:
        """Route one message to every matching session; return how many got it.
        `internal` messages ($SYS) are not counted as received."""
        if not internal:
            self.stats.messages_in[msg.qos] += 1
        if msg.retain:
            if not msg.payload:
                self.retained.delete(msg.topic)
            else:
                self.retained.set(msg.topic, msg)
                self.stats.retained_set += 1
        return self._route(msg, now)

    def _route(self, msg: Message, now: float) -> int:
        topic = msg.topic
        matches = self.subscriptions.match_filters(topic)
        shared = self.shared.match_filters(topic) if len(self.shared) else ()
        if not matches and not shared:
            return 0
        sessions = self.sessions
        cache: dict[Any, bytes] = {}
        # One copy per session: highest QoS, every subscription identifier (MQTT-3.3.4-2..5).
        targets: dict[str, list[Any]] = {}
        for topic_filter, client_ids in matches:
            for client_id in client_ids:
                session = sessions[client_id]
                options = session.subscriptions[topic_filter]
                if options.no_local and client_id == msg.publisher:
                    continue
                self._merge_target(targets, session, options, msg)
        for real_filter, groups in shared:
            for group in groups:
                session = self._pick_shared(group, real_filter)
                if session is None:
                    continue
                options = session.subscriptions[f"$share/{group}/{real_filter}"]
                self._merge_target(targets, session, options, msg)
        for session, qos, retain, sub_ids in targets.values():
            self.deliver(session, Delivery(msg, qos, retain, tuple(sub_ids)), now, cache)
        return len(targets)

    @staticmethod
    def _merge_target(targets: dict[str, list[Any]], session: Session, options: SubscriptionOptions, msg: Message) -> None:
        qos = options.qos if options.qos < msg.qos else msg.qos
        retain = msg.retain and options.retain_as_published
        entry = targets.get(session.client_id)
        if entry is None:
            targets[session.client_id] = [session, qos, retain, [options.subscription_id] if options.subscription_id else []]
            return
        if qos > entry[1]:
            entry[1] = qos
        entry[2] = entry[2] or retain
        if options.subscription_id:
            entry[3].append(options.subscription_id)

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

    def deliver(self, session: Session, delivery: Delivery, now: float, cache: dict[Any, bytes] | None = None) -> None:
        conn = self.connections.get(session.client_id)
        if conn is not None:
            conn.deliver(delivery, now, cache)
            return
        if not session.persistent:
            return
        if delivery.qos == 0 and not self.limits.queue_qos0:
            return
        dropped = session.enqueue(delivery, self.limits.max_queued_messages)
        if dropped is not None:
            self.note_queue_drop(session, dropped)

    def note_queue_drop(self, session: Session, dropped: Delivery) -> None:
        self.stats.dropped_queue_full += 1
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
        return sum(len(s.subscriptions) for s in self.sessions.values())

    def iter_sessions(self) -> Iterable[Session]:
        return self.sessions.values()
