"""The session model: what the server keeps for a client between connections.

Pure state and bookkeeping (no Trio, no sockets, no clock reads: time is passed in).
The broker drives it; `session_store.store` persists it.

A session holds, per MQTT 5 section 4.1:
- its subscriptions (filter -> options),
- QoS 1/2 messages sent to the client and not yet completely acknowledged
  (`inflight`, keyed by packet id, in send order),
- messages waiting for the client (`queue`: offline, or while the inflight window is full),
- QoS 2 packet ids received from the client whose PUBREL is awaited (`qos2_in`),
- the will message and the session expiry interval.

Queue overflow policy (`max_queued_messages`): when the queue is full, a QoS 0 message
is dropped first (the oldest queued QoS 0 one, else the new one if it is QoS 0);
otherwise the oldest queued message is dropped to make room for the newest.  Every drop
is counted in `Session.dropped`; the broker turns that into a metric and a log line.

The limit protects against a slow consumer, not against the cluster's own recovery:
what a recovery merges into the queue (a takeover's messages held for the dead owner,
a returned owner's copy, a handoff's tail) was accepted on the session's behalf
already and is not counted: it gets room beyond the limit (`Session.recovered`), which
shrinks as the client takes messages from the head of the queue.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import faults
from mqtt import Properties, Will

NEVER_EXPIRES = 0xFFFFFFFF

# One message's PUBLISH bytes for its subscribers, by what makes them differ (protocol
# level, QoS, retain flag, subscription identifiers): the bytes before the packet id and
# after it (`mqtt.split_publish`; QoS 0: the whole packet, and b"").
PublishCache = dict[tuple[int, int, bool, tuple[int, ...]], tuple[bytes, bytes]]


class Message:
    """One application message as published; shared by every subscriber it goes to.

    Treated as immutable once built.  `expires_at` is wall-clock seconds (so it survives
    restarts); `properties` are the v5 properties forwarded to subscribers (no topic
    alias, no subscription identifiers: those are per delivery).
    """

    __slots__ = ("topic", "payload", "qos", "retain", "properties", "expires_at", "publisher", "msg_id", "origin",
                 "encoded")

    def __init__(
        self,
        topic: str,
        payload: bytes,
        qos: int,
        retain: bool,
        properties: Properties,
        expires_at: float | None = None,
        publisher: str | None = None,
        msg_id: int = 0,
        origin: str | None = None,
    ) -> None:
        self.topic = topic
        self.payload = payload
        self.qos = qos
        self.retain = retain
        self.properties = properties
        self.expires_at = expires_at
        self.publisher = publisher
        self.msg_id = msg_id
        # The node that accepted the publish: (origin, msg_id) names a message
        # cluster-wide, which is how a session handoff drops copies that came twice.
        self.origin = origin
        # Its PUBLISH bytes as sent to subscribers, by what makes them differ (`PublishCache`),
        # made by the first send: encoded once per message, whether it leaves at once or
        # from a session's queue (the packet id is patched in).
        self.encoded: PublishCache | None = None

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at

    def remaining_expiry(self, now: float) -> int | None:
        """Seconds left for the Message Expiry Interval property, rounded up."""
        if self.expires_at is None:
            return None
        left = self.expires_at - now
        return max(1, int(left + 0.999))

    def __repr__(self) -> str:
        return f"Message({self.topic!r}, {len(self.payload)}B, qos={self.qos}, retain={self.retain})"


@dataclass(frozen=True, slots=True)
class SubscriptionOptions:
    """What a SUBSCRIBE granted for one filter (filter kept as sent, `$share/...` included)."""

    qos: int
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0
    subscription_id: int | None = None


class Delivery:
    """A message on its way to one session, with that session's view of it.

    The `store_*` fields and `owner` belong to `session_store.store`: a persistent
    session's store tracks its deliveries on the objects themselves (the state the
    store should hold, the state it holds, whether a change is pending), so the
    per-message store calls are a few attribute writes instead of building keys and
    records (see `SessionStore`)."""

    __slots__ = ("message", "qos", "retain", "subscription_ids", "seq", "owner", "store_state", "store_disk", "store_gen",
                 "dup")

    # Set by the store before it reads them (no default: most deliveries never need them).
    owner: str  # the client id whose store record this is
    store_state: int  # the record the store should hold

    def __init__(self, message: Message, qos: int, retain: bool, subscription_ids: tuple[int, ...]) -> None:
        self.message = message
        self.qos = qos
        self.retain = retain
        self.subscription_ids = subscription_ids
        # Position in the session's stream, for the store's key order (0 = not stored).
        self.seq = 0
        # No record in the store, not in its list of changes.  (`owner` and
        # `store_state` are set by the store before they are read.)
        self.store_disk = -1
        self.store_gen = 0
        # May have been sent already: queued in a copy taken from a replica, which may
        # have missed its move into the owner's in-flight window (sent with DUP=1).
        self.dup = False


class InflightEntry:
    """A QoS 1/2 message sent to the client: `state` is 'publish' (PUBACK/PUBREC
    awaited) or 'pubrel' (PUBREL sent, PUBCOMP awaited)."""

    __slots__ = ("delivery", "state")

    def __init__(self, delivery: Delivery, state: str = "publish") -> None:
        self.delivery = delivery
        self.state = state


@dataclass(slots=True)
class Session:
    client_id: str
    persistent: bool
    expiry_interval: int = 0
    protocol_level: int = 4
    # Created on first use, as the queue below: two empty dicts are ~0.13 KB, and an
    # idle client of a clean session may never subscribe nor receive at QoS 1. Read
    # them through `subscriptions` and `inflight`.
    _subscriptions: dict[str, SubscriptionOptions] | None = field(default=None, repr=False, compare=False)
    _inflight: dict[int, InflightEntry] | None = field(default=None, repr=False, compare=False)
    # The queue is created on first use: an empty deque costs ~0.6 KB, and most
    # sessions (clean, keeping up) never queue anything. Read it through `queue`.
    _queue: deque[Delivery] | None = field(default=None, repr=False, compare=False)
    # Created on first use too (an empty set is ~0.2 KB): only QoS 2 publishers need it.
    _qos2_in: set[int] | None = field(default=None, repr=False, compare=False)
    will: Will | None = None
    disconnected_at: float | None = None
    # The CONNECT that attached the current connection: its wall time and Clean Start
    # flag (for the operator's view of clients; not stored, a resumed session's next
    # CONNECT sets them again).
    connected_at: float | None = None
    clean_start: bool = True
    dropped: int = 0
    # Room in the queue beyond the limit, for what a recovery put there
    # (`recovery_starts`): it shrinks as the client takes messages from the head.
    recovered: int = 0
    stored: bool = False  # has records in the store (so ending it must delete them)
    next_seq: int = 1

    @property
    def subscriptions(self) -> dict[str, SubscriptionOptions]:
        subscriptions = self._subscriptions
        if subscriptions is None:
            subscriptions = self._subscriptions = {}
        return subscriptions

    @property
    def inflight(self) -> dict[int, InflightEntry]:
        inflight = self._inflight
        if inflight is None:
            inflight = self._inflight = {}
        return inflight

    @property
    def queue(self) -> deque[Delivery]:
        queue = self._queue
        if queue is None:
            queue = self._queue = deque()
        return queue

    @property
    def qos2_in(self) -> set[int]:
        qos2_in = self._qos2_in
        if qos2_in is None:
            qos2_in = self._qos2_in = set()
        return qos2_in

    @property
    def subscription_count(self) -> int:
        """How many subscriptions it holds (without creating the dict: a count taken over
        every session, as $SYS does every 10 s, must not give each idle one a dict)."""
        subscriptions = self._subscriptions
        return len(subscriptions) if subscriptions is not None else 0

    @property
    def inflight_count(self) -> int:
        """How many messages are in flight (without creating the dict)."""
        inflight = self._inflight
        return len(inflight) if inflight is not None else 0

    @property
    def queued(self) -> int:
        """How many deliveries wait in the queue (without creating it)."""
        queue = self._queue
        return len(queue) if queue is not None else 0

    def take_seq(self) -> int:
        seq = self.next_seq
        self.next_seq += 1
        return seq

    def enqueue(self, delivery: Delivery, limit: int) -> Delivery | None:
        """Queue a delivery under the overflow policy; return the one dropped, if any."""
        room = limit + self.recovered
        if room <= 0:
            self.dropped += 1
            return delivery
        queue = self.queue  # once: a property (per message while a window is full)
        if len(queue) < room:
            if faults.REORDER_QUEUE and queue:
                queue.insert(len(queue) - 1, delivery)  # BUGGIFY: ahead of the one before
                return None
            queue.append(delivery)
            return None
        # Full: QoS 0 goes first.
        if delivery.qos == 0:
            self.dropped += 1
            return delivery
        for i, queued in enumerate(self.queue):
            if queued.qos == 0:
                del self.queue[i]
                self.queue.append(delivery)
                self.dropped += 1
                return queued
        dropped = self.queue.popleft()
        self.queue.append(delivery)
        self.dropped += 1
        return dropped

    def recovery_starts(self, coming: int) -> int:
        """A recovery is about to merge up to `coming` deliveries (accepted on the
        session's behalf already): room beyond the limit for all of them.  Returns the
        queue's length, for `recovery_ended`."""
        self.recovered += coming
        return self.queued

    def recovery_ended(self, coming: int, queued_before: int) -> None:
        """The room stays for what the recovery put into the queue, and no more."""
        self.recovered = max(0, min(self.recovered - coming + self.queued - queued_before, self.queued))

    def taken_from_queue(self, n: int) -> None:
        """`n` deliveries left the head of the queue: the recovered room shrinks with them."""
        self.recovered = max(0, min(self.recovered - n, self.queued))

    def expires_at(self) -> float | None:
        """Wall-clock time at which this (disconnected) session ends, None = never."""
        if self.disconnected_at is None:
            return None
        if self.expiry_interval == NEVER_EXPIRES:
            return None
        return self.disconnected_at + self.expiry_interval
