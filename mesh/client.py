"""One client as the broker sees it: the MQTT machine's events turned into broker calls,
and the broker's deliveries turned into bytes. No Trio, no sockets, no await.

`mqtt.server.ServerConnection` says what the protocol allows; this class decides what
the node does: authentication, ACLs and limits (`mesh.security`), sessions, routing and
retained messages (`mesh.broker`), and when an acknowledgement may leave (principle 6:
only once what its packet wrote is synced, and once the nodes a message was forwarded
to acknowledged it). `mesh.connection.ClientConnection` subclasses it with the I/O:
it feeds the machine, calls `handle_events`, and sends what `write` collected.

Back-pressure: QoS 1/2 deliveries beyond the inflight window wait in the session queue
(bounded by `max_queued_messages`); QoS 0 deliveries are dropped, and counted, while
the outbox holds more than `OUTBOX_LIMIT` bytes (a slow consumer loses QoS 0 first and
never makes the node grow without bound).
"""

from __future__ import annotations

import functools
import logging
from collections import deque
from dataclasses import replace
from typing import TYPE_CHECKING, Iterator, Protocol

from clock import Clock
from delayed.topic import PREFIX as DELAYED_PREFIX, DelayedTopic, DelayedTopicRefused, parse_delayed
from hooks import HookPoint
from hooks.registry import PendingPublish
from hooks.points import AuthVerdict, ClientInfo, ConnectInfo
from mesh.acl import ClientAcl
from mesh.limits import TokenBucket
from mqtt import EMPTY_PROPERTIES, Connect, Properties, Disconnect, Pingreq, Puback, Pubcomp, Publish, Pubrec, ReasonCode, Subscribe, Unsubscribe, Will, split_publish
from mqtt.server import ConnectRefused, ProtocolViolation, PublishReleased, PublishRepeated, ServerConnection, ServerSettings
from oplog import Event, log_event
from routing.links import AckGate
from session_store.model import NEVER_EXPIRES, Delivery, Message, Session
from streams.cursor import StreamTap
from streams.request import REPLAY_PREFIX, ReplayRefused, ReplayRequest, parse_request, real_filter, replay_from

if TYPE_CHECKING:
    from mesh.broker import Broker, BrokerLimits, DelayedIntake
    from mesh.security import Security

log = logging.getLogger("meshd.connection")

OUTBOX_LIMIT = 4 * 1024 * 1024
# Filters of one SUBSCRIBE handled per step: a SUBSCRIBE of more is handled by the
# reader a slice at a time, the event loop free between (`pending_subscribe`). At a
# million routes, nodes taking SUBSCRIBEs of 1,000 filters from 10 clients at once held
# their loop for whole ticks of them, gossip probes went unanswered past lan's 0.5 s,
# and members were declared dead.
SUBSCRIBE_SLICE = 100

# At most this many encodings kept on a message (`Message.encoded`): subscription
# identifiers differ per subscriber, and a message may wait in queues a long time.
_ENCODED_KINDS = 4

# Topics no client may publish to: the server's $SYS tree and shared-subscription names.
_RESERVED_TOPIC_PREFIXES = ("$SYS/", "$share/")

# Protocol violations that are a configured limit biting, counted per limit.
_LIMIT_BY_REASON: dict[int, str] = {
    ReasonCode.PACKET_TOO_LARGE: "max_packet_size",
    ReasonCode.TOPIC_ALIAS_INVALID: "topic_alias_maximum",
    ReasonCode.RECEIVE_MAXIMUM_EXCEEDED: "receive_maximum",
}


@functools.lru_cache(maxsize=8)
def _server_settings(limits: "BrokerLimits", connect_timeout: float) -> ServerSettings:
    return ServerSettings(
        receive_maximum=limits.receive_maximum, max_packet_size=limits.max_packet_size,
        topic_alias_maximum=limits.topic_alias_maximum, max_keepalive=limits.max_keepalive,
        retain_available=limits.retain_available, max_inflight=limits.max_inflight, connect_timeout=connect_timeout,
    )


def reason_name(code: int) -> str:
    """`not_authorized` for 0x87: the name of a v5 reason code, for log lines."""
    try:
        return ReasonCode(code).name.lower()
    except ValueError:
        return "unknown"


def server_settings(broker: "Broker", connect_timeout: float) -> ServerSettings:
    """What the machine grants, shared by every connection under the same limits."""
    return _server_settings(broker.limits, connect_timeout)


class _Rare:
    """What few clients need, made on first use: every slot of a `Client` is 8 bytes of
    each idle connection, and these are None for nearly all of them."""

    __slots__ = ("cert_cn", "publish_bucket", "rate_delay", "close_reason", "hook_info", "pending_connect", "pending_publish",
                 "pending_subscribe")

    def __init__(self) -> None:
        self.cert_cn: str | None = None  # TLS: the client certificate's CN, for the CONNECT
        self.publish_bucket: TokenBucket | None = None  # publish_rate
        self.rate_delay = 0.0  # seconds the reader pauses (publish_rate)
        # Why the connection ended, for the `client.disconnected` line: (reason, code);
        # None until it ends, and then a lost connection (no DISCONNECT, no close).
        self.close_reason: tuple[str, int | None] | None = None
        self.hook_info: ClientInfo | None = None  # made when a hook first needs it
        self.pending_connect: Connect | None = None  # a CONNECT whose handshake must await
        # A PUBLISH whose message.publish hooks must be awaited before it is routed.
        self.pending_publish: tuple[Publish, PendingPublish] | None = None
        self.pending_subscribe: Subscribe | None = None  # a SUBSCRIBE to handle in slices

    def empty(self) -> bool:
        return (self.cert_cn is None and self.publish_bucket is None and not self.rate_delay and self.close_reason is None
                and self.hook_info is None and self.pending_connect is None and self.pending_publish is None
                and self.pending_subscribe is None)


class Client:
    __slots__ = (
        "broker", "clock", "machine", "security", "_peer", "peer_ip", "transport", "client_id", "username",
        "session", "acl", "acl_generation", "closing", "_pending_acks", "_holds_slot", "replays", "_rare",
    )

    def __init__(self, broker: "Broker", clock: Clock, settings: ServerSettings, peer: str | int, transport: str, *,
                 security: "Security | None", peer_ip: str, cert_cn: str | None) -> None:
        """`peer`: the client's address for logs and hooks, or just its port: then the
        address is `peer_ip:port`, formatted when asked (a plain TCP client, idle most
        of its life, keeps no string of it)."""
        self.broker = broker
        self.clock = clock
        self.machine = ServerConnection(settings, clock.now())
        self.security = security
        self._peer = peer
        self.peer_ip = peer_ip
        self._rare: _Rare | None = None  # see `_Rare`
        if cert_cn is not None:
            self._more().cert_cn = cert_cn
        self.transport = transport
        self.client_id = ""
        self.username: str | None = None
        self.session: Session | None = None
        self.acl: ClientAcl | None = None  # None: no ACL configured, everything allowed
        self.acl_generation = 0
        self.closing = False
        rate = security.settings.publish_rate if security is not None else 0.0
        if rate:
            self._more().publish_bucket = TokenBucket(rate, max(1.0, rate))
        # Acks waiting for a sync or a remote node, in order; created on first use.
        self._pending_acks: deque[tuple[int, AckGate | None, bytes]] | None = None
        self._holds_slot = False  # admitted: one of security's max_connections slots is ours
        # This client's replay subscriptions (streams), asked about every delivery; None: none.
        self.replays: StreamTap | None = None

    def _more(self) -> _Rare:
        rare = self._rare
        if rare is None:
            rare = self._rare = _Rare()
        return rare

    def _less(self) -> None:
        """A rare field went back to its default: drop the holder once all did (a CONNECT
        that awaited its handshake leaves none behind)."""
        if self._rare is not None and self._rare.empty():
            self._rare = None

    @property
    def cert_cn(self) -> str | None:
        return self._rare.cert_cn if self._rare is not None else None

    @property
    def _publish_bucket(self) -> TokenBucket | None:
        return self._rare.publish_bucket if self._rare is not None else None

    @property
    def close_reason(self) -> tuple[str, int | None] | None:
        """Why the connection ended (see `_Rare`)."""
        return self._rare.close_reason if self._rare is not None else None

    @close_reason.setter
    def close_reason(self, reason: tuple[str, int | None] | None) -> None:
        self._more().close_reason = reason

    @property
    def pending_connect(self) -> Connect | None:
        """A CONNECT whose handshake must await (the reader task takes it)."""
        return self._rare.pending_connect if self._rare is not None else None

    @pending_connect.setter
    def pending_connect(self, connect: Connect | None) -> None:
        if connect is not None or self._rare is not None:
            self._more().pending_connect = connect
            if connect is None:
                self._less()

    @property
    def pending_publish(self) -> tuple[Publish, PendingPublish] | None:
        """A PUBLISH whose message.publish hooks must be awaited before it is routed."""
        return self._rare.pending_publish if self._rare is not None else None

    @pending_publish.setter
    def pending_publish(self, pending: tuple[Publish, PendingPublish] | None) -> None:
        if pending is not None or self._rare is not None:
            self._more().pending_publish = pending
            if pending is None:
                self._less()

    @property
    def pending_subscribe(self) -> Subscribe | None:
        """A SUBSCRIBE of more than `SUBSCRIBE_SLICE` filters, for the reader to handle
        a slice at a time (`subscribe_steps`)."""
        return self._rare.pending_subscribe if self._rare is not None else None

    @pending_subscribe.setter
    def pending_subscribe(self, pending: Subscribe | None) -> None:
        if pending is not None or self._rare is not None:
            self._more().pending_subscribe = pending
            if pending is None:
                self._less()

    @property
    def awaits_work(self) -> bool:
        """A CONNECT, PUBLISH or SUBSCRIBE read and not yet handled because it must
        await (the reader task takes it; an idle connection with one never parks)."""
        rare = self._rare
        return rare is not None and (rare.pending_connect is not None or rare.pending_publish is not None
                                     or rare.pending_subscribe is not None)

    @property
    def _rate_delay(self) -> float:
        """Seconds the reader pauses before it reads again (publish_rate)."""
        return self._rare.rate_delay if self._rare is not None else 0.0

    @_rate_delay.setter
    def _rate_delay(self, delay: float) -> None:
        if delay or self._rare is not None:
            self._more().rate_delay = delay
            if not delay:
                self._less()

    # -------------------------------------------------------------- to the I/O side

    # Bytes written and not yet sent (the I/O shell's outbox): QoS 0 is dropped above OUTBOX_LIMIT.
    _outbox_bytes: int

    def write(self, data: bytes) -> None:
        raise NotImplementedError  # the I/O shell sends it

    def _stop(self) -> None:
        raise NotImplementedError  # the I/O shell ends its reader

    @property
    def peer(self) -> str:
        peer = self._peer
        return peer if type(peer) is str else f"{self.peer_ip}:{peer}"

    @property
    def protocol_level(self) -> int:
        return self.machine.protocol_level

    @property
    def keep_alive(self) -> int:
        return self.machine.keep_alive

    def close(self, reason: int | None = None) -> None:
        """Close from the server side: the machine says what to send first (DISCONNECT
        with `reason` on v5, or the CONNACK of a refused CONNECT)."""
        if self.closing:
            return
        self.closing = True
        self.release_slot()
        if self.close_reason is None:
            self.close_reason = ("closed", None) if reason is None else (reason_name(reason), reason)
        data = self.machine.close(reason)
        if data:
            self.write(data)
        self._stop()

    def take_will(self) -> Will | None:
        return self.machine.take_will()

    # -------------------------------------------------------------- events

    def handle_events(self, now: float) -> bool:
        """Handle every event the machine has (`now`: wall clock, the broker's); True
        when the connection must end. Stops at a CONNECT that must await (`pending_connect`)
        and at a PUBLISH whose message.publish hooks must be awaited (`pending_publish`)."""
        machine = self.machine
        acked = False  # a PUBACK or PUBCOMP freed a slot: the window is filled once, after them all
        try:
            while not self.closing:
                event = machine.next_event()
                if event is None:
                    return False
                if type(event) is Publish:
                    if self._on_publish(event, now):
                        return False
                elif type(event) is Puback or type(event) is Pubcomp:
                    self._on_ack(event.packet_id)
                    acked = True
                elif type(event) is Pubrec:
                    self._on_pubrec(event, now)
                elif type(event) is PublishReleased:
                    if event.known:
                        assert self.session is not None
                        self.broker.qos2_released(self.session, event.packet_id)
                    self.write(machine.pubcomp(event.packet_id, event.known))
                elif type(event) is PublishRepeated:
                    self.write(machine.pubrec(event.packet_id))  # taken already: not routed again
                elif type(event) is Subscribe:
                    if len(event.subscriptions) > SUBSCRIBE_SLICE:
                        self.pending_subscribe = event  # the reader takes it, in slices
                        return False
                    self._on_subscribe(event, now)
                elif type(event) is Unsubscribe:
                    self._on_unsubscribe(event)
                elif type(event) is Pingreq:
                    self.write(machine.pingresp())
                elif type(event) is Disconnect:
                    if event.properties.session_expiry_interval is not None:
                        assert self.session is not None
                        self.broker.set_expiry(self.session, event.properties.session_expiry_interval)
                    self.close_reason = ("client_disconnect", event.reason_code)
                    self.closing = True
                    self.release_slot()  # the client is gone as of now: its slot is free for its reconnect
                elif type(event) is Connect:
                    self.client_id, self.username = event.client_id, event.username
                    if not self.can_connect_now(event):
                        self.pending_connect = event
                        return False
                    if not (self.admit() and self.authorize(event, self.authenticate_now(event))):
                        return True
                    self.open_session(event, now)
                elif type(event) is ConnectRefused:
                    self.refuse(event.reason_code, event.message)
                elif type(event) is ProtocolViolation:
                    self._protocol_violation(event)
            return True
        finally:
            if acked:
                self._window_freed(now)

    def refuse(self, reason_code: int, detail: str) -> None:
        """Refuse the CONNECT: one `client.refused` line, then the CONNACK with the code."""
        log_event(log, Event.CLIENT_REFUSED, client_id=self.client_id or None, address=self.peer,
                  listener=self.transport, username=self.username, code=f"0x{reason_code:02X}",
                  reason=reason_name(reason_code), detail=detail)
        self.close(reason_code)

    def log_disconnected(self) -> None:
        """The `client.disconnected` line of a connection whose CONNECT was accepted."""
        reason, code = self.close_reason or ("connection_lost", None)
        log_event(log, Event.CLIENT_DISCONNECTED, client_id=self.client_id, address=self.peer,
                  listener=self.transport, reason=reason, code=None if code is None else f"0x{code:02X}")
        hooks = self.broker.hooks
        if hooks.client_disconnected:
            hooks.notify(HookPoint.CLIENT_DISCONNECTED, self.hook_info(keep=False), reason)

    def hook_info(self, *, keep: bool = True) -> ClientInfo:
        """Who this client is, as hook callbacks see it (made once, after CONNECT).
        `keep=False` for a callback that comes once (connected, disconnected): an idle
        client then holds no ClientInfo (~90 bytes) that nothing asks for again."""
        info = self._rare.hook_info if self._rare is not None else None
        if info is None or info.acl is not self.acl or info.client_id != self.client_id or info.username != self.username:
            info = ClientInfo(self.client_id, self.username, self.peer, self.transport,
                              self.machine.protocol_level, self.broker.node_id, self.acl)
            if keep:
                self._more().hook_info = info
        return info

    def _protocol_violation(self, event: ProtocolViolation) -> None:
        self.broker.stats.protocol_errors += 1
        limit = _LIMIT_BY_REASON.get(event.reason_code)
        if limit is not None and self.security is not None:
            self.security.limits_hit[limit] += 1
        log.info("%s: %s protocol violation: %s (reason 0x%02X); closing", self.peer, self.client_id or "(no CONNECT)",
                 event.message, event.reason_code)
        self.close(event.reason_code)

    # -------------------------------------------------------------- CONNECT, in steps

    def can_connect_now(self, c: Connect) -> bool:
        """Whether no step of the handshake must await: no password hash to check (a
        thread), no connection slot to wait for, no session to claim or fetch from
        another node."""
        security = self.security
        if security is not None and (security.needs_hashing(c.username) or security.at_capacity()):
            return False
        mesh = self.broker.mesh
        if mesh is None:
            return True
        return _handoff_is_noop(mesh, c.client_id, c.clean_start, _persistent(c))

    def admit(self) -> bool:
        """Connection limits (MQTT-3.2.2-7 reason codes; v3 return codes by the encoder)."""
        security = self.security
        if security is None:
            return True
        refusal = security.admit(self.peer_ip, self.clock.now())
        if refusal is not None:
            self.refuse(refusal, "connection limits")
            return False
        self._holds_slot = True
        return True

    def release_slot(self) -> None:
        """The connection ended (or will, with nothing more read): give its slot back, once."""
        if self._holds_slot:
            self._holds_slot = False
            assert self.security is not None
            self.security.release()

    def connect_info(self, c: Connect) -> ConnectInfo:
        return ConnectInfo(ClientInfo(c.client_id, c.username, self.peer, self.transport, c.protocol_level,
                                      self.broker.node_id), c.password, c.clean_start, self.cert_cn, self.peer_ip)

    def authenticate_now(self, c: Connect) -> AuthVerdict | None:
        """client.connect, then the client.authenticate chain (the password file is its
        built-in first callback, `mesh.security`); None when no hook has a say. May run
        in a worker thread (`Security.needs_hashing`): it touches no Trio state."""
        hooks = self.broker.hooks
        chain = hooks.client_authenticate
        if not hooks.client_connect:
            if not chain:
                return None
            security = self.security
            if len(chain) == 1 and security is not None and chain[0] is security.password_hook:
                # Only the built-in callback: its answer without a ConnectInfo or a chain
                # to run (what `fold` would give, a raise counted and skipped included).
                try:
                    return security.verdict(c.username, c.password, self.peer_ip, self.cert_cn)
                except Exception as exc:
                    hooks.failed(chain[0], exc)
                    return AuthVerdict()
        info = self.connect_info(c)
        if hooks.client_connect:
            code = hooks.fold(HookPoint.CLIENT_CONNECT, 0, info)
            if isinstance(code, int) and code >= 0x80:
                return AuthVerdict(False, code, "refused by a client.connect hook")
        return hooks.fold(HookPoint.CLIENT_AUTHENTICATE, AuthVerdict(), info) if hooks.client_authenticate else None

    def authorize(self, c: Connect, result: AuthVerdict | None) -> bool:
        """Authentication's verdict, then the client's ACL and the will's check against it."""
        if result is None:
            return True
        if result.ok is False:
            self.refuse(result.reason_code or ReasonCode.NOT_AUTHORIZED, result.detail or "authentication")
            return False
        if result.username is not None:
            self.username = result.username
        security = self.security
        if security is None:
            return True
        self.acl = security.client_acl(self.username, c.client_id, self.peer_ip)
        self.acl_generation = security.acl_generation
        if c.will is not None and not self.may("publish", c.will.topic):
            security.denied("publish")
            self.refuse(ReasonCode.NOT_AUTHORIZED, "the will topic is not allowed by the ACL")
            return False
        return True

    def may(self, action: str, topic: str) -> bool:
        """client.authorize: may this client publish to / subscribe to `topic`? The
        ACL is the chain's built-in first callback (`mesh.security`); with nothing
        registered (no ACL, no plugin) everything is allowed."""
        hooks = self.broker.hooks
        if not hooks.client_authorize:
            return True
        return bool(hooks.fold(HookPoint.CLIENT_AUTHORIZE, True, self.hook_info(), action, topic))

    def open_session(self, c: Connect, now: float) -> None:
        """The session, CONNACK, and a resumed session's backlog."""
        client_id = c.client_id
        assigned = None
        if not client_id:
            client_id = self.client_id = assigned = self.broker.assign_client_id()
        old = self.broker.connections.get(client_id)
        if old is not None and old is not self:
            log_event(log, Event.CLIENT_TAKEN_OVER, client_id=client_id, from_connection=old.peer, address=self.peer)
        session, present = self.broker.open_session(self, c, client_id, now)
        self.session = session
        self.write(self.machine.accept(session_present=present, assigned_client_identifier=assigned,
                                       response_information=f"meshd/response/{client_id}"))
        if log.isEnabledFor(logging.INFO):  # as log_event asks, before its fields are made (the address a string)
            expiry = session.expiry_interval
            log_event(log, Event.CLIENT_CONNECTED, client_id=client_id, address=self.peer, listener=self.transport,
                      protocol=c.protocol_level, clean=c.clean_start, expiry="never" if expiry == NEVER_EXPIRES else expiry,
                      keepalive=self.machine.keep_alive, session_present=present, username=self.username)
        hooks = self.broker.hooks
        if hooks.client_connected:
            hooks.notify(HookPoint.CLIENT_CONNECTED, self.hook_info(keep=False))
        if present:
            self._resume(now)

    # -------------------------------------------------------------- delivery

    def deliver(self, delivery: Delivery, now: float) -> None:
        """Send one delivery now, or queue it behind the inflight window."""
        replays = self.replays
        if replays is not None and replays.intercept(delivery):
            return  # a replay of its stream holds it until the stored part is delivered
        session = self.session
        assert session is not None
        expires_at = delivery.message.expires_at
        if expires_at is not None and now >= expires_at:  # Message.expired, inline: asked per delivery
            self.broker.stats.dropped_expired += 1
            self.broker.dropped(delivery.message, "expired")
            return
        if self.closing:
            # DISCONNECT is on its way: nothing may follow it on the wire (QoS >= 1
            # waits in the session for the next connection).
            if delivery.qos:
                self.broker.enqueue(session, delivery)
            return
        if delivery.qos == 0:
            if self._outbox_bytes > OUTBOX_LIMIT:
                self.broker.stats.dropped_slow_consumer += 1
                self.broker.dropped(delivery.message, "slow_consumer")
                return
            self._send_publish(delivery, None, False, now)
            return
        if session.queued or self.machine.window_full:
            self.broker.stats.window_full += 1
            self.broker.enqueue(session, delivery)
            return
        pid = self.machine.allocate_packet_id()
        self.broker.add_inflight(session, pid, delivery)
        self._send_publish(delivery, pid, delivery.dup, now)

    def replay_has_room(self) -> bool:
        """Whether a replay may hand this client its next message now (flow control:
        an inflight window with room, an outbox that is not piling up)."""
        session = self.session
        return (session is not None and not self.closing and not session.queued and not self.machine.window_full
                and self._outbox_bytes < OUTBOX_LIMIT // 4)

    def _send_publish(self, d: Delivery, packet_id: int | None, dup: bool, now: float) -> None:
        machine = self.machine
        msg = d.message
        data: bytes | None = None
        key = None
        cache = msg.encoded
        level = machine.protocol_level
        # The message's bytes for this client's kind (`Message.encoded`), unless they are
        # this client's own (topic aliases), depend on `now` (v5 message expiry), the
        # message is retained (kept for later subscribers: its bytes would be kept too),
        # or this is a resend (DUP: rare).
        if not dup and not machine.topic_alias_out_max and not msg.retain and (level != 5 or msg.expires_at is None):
            key = (level, d.qos, d.retain, d.subscription_ids)
            if cache is None:
                cache = msg.encoded = {}
            else:
                parts = cache.get(key)
                if parts is not None:
                    data = parts[0] if packet_id is None else b"".join((parts[0], packet_id.to_bytes(2, "big"), parts[1]))
        if data is None:
            props = EMPTY_PROPERTIES
            if level == 5:
                props = msg.properties
                if d.subscription_ids or msg.expires_at is not None:  # per delivery (MQTT-3.3.2-6, 3.3.4-3)
                    props = replace(
                        props, subscription_identifiers=d.subscription_ids or props.subscription_identifiers,
                        message_expiry_interval=props.message_expiry_interval if msg.expires_at is None
                        else msg.remaining_expiry(now))
            data = machine.publish(msg.topic, msg.payload, d.qos, d.retain, packet_id, props, dup)
            if data is None:
                self._drop_too_large(d.message, packet_id)
                return
            if key is not None and cache is not None and len(cache) < _ENCODED_KINDS:
                cache[key] = (data, b"") if packet_id is None else split_publish(data)
        else:
            limit = machine.client_max_packet
            if limit is not None and len(data) > limit:
                machine.release_packet_id(packet_id or 0)
                self._drop_too_large(d.message, packet_id)
                return
        self.broker.stats.messages_out[d.qos] += 1
        if d.qos == 2 and self.broker.store.replicated_floor is not None:
            # Sync session replication: a QoS 2 PUBLISH leaves once its packet id is on
            # the replicas, so a takeover resends it under the same id (exactly once).
            self._write_when_durable(data)
        elif d.qos == 2 and self.broker.store.exchange_floor is not None and self.session is not None \
                and self.session.stored:
            self._write_when_replicated(data)  # the same in async replication
        else:
            self.write(data)
        if self.broker.hooks.message_delivered:
            self.broker.hooks.notify(HookPoint.MESSAGE_DELIVERED, self.client_id, d.message)

    def _drop_too_large(self, msg: Message, packet_id: int | None) -> None:
        # MQTT-3.1.2-25: too big for this client: discard as if delivered.
        self.broker.stats.dropped_too_large += 1
        self.broker.dropped(msg, "too_large")
        if packet_id is not None and self.session is not None:
            self.broker.release_inflight(self.session, packet_id)

    def _fill_window(self, now: float) -> None:
        session = self.session
        assert session is not None
        if not session.queued:
            return
        queue = session.queue
        broker = self.broker
        machine = self.machine
        queued = len(queue)
        while queue and not machine.window_full and not self.closing:
            d = queue.popleft()  # `Broker.dequeue`, inline: once per queued delivery
            expires_at = d.message.expires_at
            if expires_at is not None and now >= expires_at:  # Message.expired, inline
                broker.release_dequeued(session, d)
                broker.stats.dropped_expired += 1
                broker.dropped(d.message, "expired")
                continue
            if d.qos == 0:
                broker.release_dequeued(session, d)
                self._send_publish(d, None, False, now)
                continue
            pid = machine.allocate_packet_id()
            broker.add_inflight(session, pid, d)
            self._send_publish(d, pid, d.dup, now)
        if session.recovered:
            session.taken_from_queue(queued - len(queue))

    def _resume(self, now: float) -> None:
        """Session resumed: resend unacknowledged PUBLISHes with DUP=1 and pending
        PUBRELs, in their original order (MQTT-4.4.0-1), then drain the queue."""
        session = self.session
        assert session is not None
        machine = self.machine
        machine.resume_qos2(session.qos2_in)
        for pid, entry in session.inflight.items():
            machine.resume_inflight(pid, entry.state == "pubrel")
        for pid, entry in list(session.inflight.items()):
            if entry.state == "pubrel":
                self.write(machine.pubrel(pid))
            elif entry.delivery.qos == 1 and entry.delivery.message.expired(now):
                # QoS 2 is exempt: once its PUBLISH was sent, no expiry [MQTT-4.3.3-7].
                self.broker.release_inflight(session, pid)
                machine.release_packet_id(pid)
                self.broker.stats.dropped_expired += 1
                self.broker.dropped(entry.delivery.message, "expired")
            else:
                self._send_publish(entry.delivery, pid, True, now)
        self._fill_window(now)

    # -------------------------------------------------------------- handlers

    def _on_publish(self, p: Publish, now: float) -> bool:
        """True when the message.publish hooks must be awaited first (`pending_publish`)."""
        broker = self.broker
        machine = self.machine
        qos = p.qos
        pid = p.packet_id or 0
        delayed = broker.delayed
        if delayed is not None and p.topic.startswith(DELAYED_PREFIX):
            self._on_delayed_publish(p, delayed, now)
            return False
        if p.topic.startswith(_RESERVED_TOPIC_PREFIXES):
            # $SYS/ is the server's own; $share/ names a shared subscription, never a
            # topic [MQTT-4.8.2]. Not delivered, counted; a v5 QoS 1/2 publisher is told
            # 0x87 (as Mosquitto does), the others get the usual ack (3.1.1 has no way to refuse).
            broker.stats.dropped_reserved_topic += 1
            log.debug("%s: %s published to the reserved topic %r: dropped", self.peer, self.client_id, p.topic)
            refused = ReasonCode.NOT_AUTHORIZED if machine.protocol_level == 5 else ReasonCode.SUCCESS
            if qos == 1:
                self.write(machine.puback(pid, refused))
            elif qos == 2:
                if refused == ReasonCode.SUCCESS and self.session is not None:
                    broker.qos2_received(self.session, pid)  # its PUBREL ends the exchange
                self.write(machine.pubrec(pid, refused))
            return False
        if self.security is not None:
            refusal = self._publish_refusal(p.topic)
            if refusal is not None:
                # v5 says why on QoS 1/2; v3 has no negative ack: the message is dropped.
                if qos == 1:
                    self.write(machine.puback(pid, refusal))
                elif qos == 2:
                    self.write(machine.pubrec(pid, refusal))
                return False
        msg = broker.make_message(p.topic, p.payload, qos, p.retain, p.properties, self.client_id, now)
        hooks = broker.hooks
        if hooks.message_publish:
            started = hooks.start_publish(msg)
            if isinstance(started, PendingPublish):
                # A callback awaits (a bridge's durable enqueue): the reader awaits the
                # rest of the chain (`pending_publish`), then calls `route_publish`.
                self.pending_publish = (p, started)
                return True
            self.route_publish(p, started, now)
            return False
        if qos == 0 and not hooks.message_dropped:
            broker.publish(msg, now)  # nothing to acknowledge, no hook to tell: the hot path, one call
            return False
        self.route_publish(p, msg, now)
        return False

    def route_publish(self, p: Publish, msg: Message | None, now: float) -> None:
        """Route what the message.publish hooks left of a PUBLISH (None: dropped by
        one) and acknowledge it."""
        broker = self.broker
        machine = self.machine
        qos = p.qos
        pid = p.packet_id or 0
        store = broker.store
        epoch_before = store.write_epoch
        # In a cluster the ack also waits for the nodes the message was forwarded to.
        mesh = broker.mesh
        here = mesh is None or msg is None or mesh.stays_here(msg.retain)
        gate = AckGate() if qos and not here else None
        matched = broker.publish(msg, now, gate=gate, here=here) if msg is not None else 0
        if not matched and broker.hooks.message_dropped:
            broker.dropped(msg if msg is not None else broker.make_message(p.topic, p.payload, qos, p.retain, p.properties,
                                                                          self.client_id, now),
                           "no_subscribers" if msg is not None else "dropped_by_hook")
        if qos == 0 or self.closing:
            return
        rc = ReasonCode.SUCCESS if matched or machine.protocol_level != 5 else ReasonCode.NO_MATCHING_SUBSCRIBERS
        if qos == 1:
            ack = machine.puback(pid, rc)
        else:
            assert self.session is not None
            broker.qos2_received(self.session, pid)
            ack = machine.pubrec(pid, rc)
        self._send_ack(ack, epoch_before, gate if gate is not None and gate.waiting else None)

    def _on_delayed_publish(self, p: Publish, delayed: "DelayedIntake", now: float) -> None:
        """`$delayed/<seconds>/<topic>`: checked as a PUBLISH to its target (ACL,
        limits) at receipt, kept in the store and acknowledged once that is durable,
        in every durability mode; published to the target when due (`delayed.service`)."""
        machine = self.machine
        qos = p.qos
        pid = p.packet_id or 0
        target: DelayedTopic | None = None
        try:
            target = parse_delayed(p.topic, delayed.max_delay)
        except DelayedTopicRefused as exc:
            delayed.refused()
            log.info("%s: %s: delayed publish refused (reason 0x%02X): %s", self.peer, self.client_id,
                     exc.reason_code, exc)
            refusal: int | None = exc.reason_code
        else:
            refusal = self._publish_refusal(target.topic) if self.security is not None else None
        if refusal is not None or target is None:
            # v5 says why on QoS 1/2; v3 has no negative ack: the message is dropped.
            if qos == 1:
                self.write(machine.puback(pid, refusal or ReasonCode.UNSPECIFIED_ERROR))
            elif qos == 2:
                self.write(machine.pubrec(pid, refusal or ReasonCode.UNSPECIFIED_ERROR))
            return
        broker = self.broker
        epoch_before = broker.store.write_epoch
        msg = broker.make_message(target.topic, p.payload, qos, p.retain, p.properties, self.client_id, now)
        delayed.accept(msg, target.delay, now)
        if qos == 0:
            return
        if qos == 1:
            ack = machine.puback(pid, ReasonCode.SUCCESS)
        else:
            assert self.session is not None
            broker.qos2_received(self.session, pid)
            ack = machine.pubrec(pid, ReasonCode.SUCCESS)
        self._send_ack(ack, epoch_before, durable=True)

    def _send_ack(self, ack: bytes, epoch_before: int, gate: AckGate | None = None, *, durable: bool = False) -> None:
        """Principle 6: acknowledge only once what the acknowledged packet wrote to the
        store is synced (in `sync` durability; with `durable`, in every mode). Acks leave
        in the order of the packets they answer (MQTT-4.6.0-2), so once one waits, later
        ones queue behind it."""
        broker = self.broker
        store = broker.store
        wait_for = store.write_epoch if (broker.acks_wait_for_sync or durable) and store.write_epoch != epoch_before else 0
        if self._pending_acks or wait_for > store.durable_epoch or gate is not None:
            if self._pending_acks is None:
                self._pending_acks = deque()
            self._pending_acks.append((wait_for, gate, ack))
            broker.ack_waiters[self] = None
        else:
            self.write(ack)

    def _write_when_durable(self, data: bytes) -> None:
        """Write `data` once every store change made so far is durable (behind the
        acknowledgements already waiting)."""
        store = self.broker.store
        if not self._pending_acks and store.write_epoch <= store.durable_epoch:
            self.write(data)
            return
        if self._pending_acks is None:
            self._pending_acks = deque()
        self._pending_acks.append((store.write_epoch, None, data))
        self.broker.ack_waiters[self] = None

    def _write_when_replicated(self, data: bytes) -> None:
        """Write `data` once every store change made so far is on the session's
        replicas (`async` replication: `SessionStore.when_replicated`), behind what
        already waits."""
        gate = AckGate()
        gate.waiting = 1

        def replicated() -> None:
            gate.waiting = 0  # the replication service wakes the waiters (`Broker.on_durable`)

        self.broker.store.when_replicated(self.broker.store.write_epoch, replicated)
        if not self._pending_acks and not gate.waiting:
            self.write(data)
            return
        if self._pending_acks is None:
            self._pending_acks = deque()
        self._pending_acks.append((0, gate, data))
        self.broker.ack_waiters[self] = None

    def release_acks(self, durable_epoch: int) -> bool:
        """Send the acks that no longer wait (durable here, acknowledged by the nodes
        they were forwarded to); True when none are left."""
        pending = self._pending_acks
        if pending is None:
            return True
        while pending:
            epoch, gate, ack = pending[0]
            if epoch > durable_epoch or (gate is not None and gate.waiting > 0):
                break
            pending.popleft()
            self.write(ack)
        return not pending

    def _publish_refusal(self, topic: str) -> int | None:
        """Limits and ACL for one PUBLISH: a reason code to refuse it with, or None."""
        security = self.security
        assert security is not None
        bucket = self._publish_bucket
        if bucket is not None:
            now = self.clock.now()
            if not bucket.take(now):
                # Over publish_rate: slow the reader down instead of refusing (back-pressure).
                security.limits_hit["publish_rate"] += 1
                self._rate_delay = bucket.delay_until_available(now)
        if topic.count("/") >= security.settings.max_topic_levels:
            security.limits_hit["max_topic_levels"] += 1
            return ReasonCode.TOPIC_NAME_INVALID
        if security.refuse_during_netsplit("publish"):
            return ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR
        if not self.broker.hooks.client_authorize:
            return None  # no ACL, no plugin: allowed (and the ACL is refreshed when one asks)
        self._refresh_acl()
        if not self.may("publish", topic):
            security.denied("publish")
            log.debug("%s: %s may not publish to %r", self.peer, self.client_id, topic)
            return ReasonCode.NOT_AUTHORIZED
        return None

    def _refresh_acl(self) -> None:
        """Rules changed (SIGHUP, file edit, cluster-wide set): recompile this client's."""
        security = self.security
        assert security is not None
        if self.acl_generation != security.acl_generation:
            self.acl = security.client_acl(self.username, self.client_id, self.peer_ip)
            self.acl_generation = security.acl_generation

    def _subscribe_refusal(self, topic_filter: str) -> int | None:
        security = self.security
        session = self.session
        assert security is not None and session is not None
        if topic_filter.count("/") >= security.settings.max_topic_levels:
            security.limits_hit["max_topic_levels"] += 1
            return ReasonCode.TOPIC_FILTER_INVALID
        if topic_filter not in session.subscriptions and len(session.subscriptions) >= security.settings.max_subscriptions_per_client:
            security.limits_hit["max_subscriptions_per_client"] += 1
            return ReasonCode.QUOTA_EXCEEDED
        if security.refuse_during_netsplit("subscribe"):
            return ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR
        self._refresh_acl()
        if not self.may("subscribe", topic_filter):
            security.denied("subscribe")
            log.debug("%s: %s may not subscribe to %r", self.peer, self.client_id, topic_filter)
            return ReasonCode.NOT_AUTHORIZED
        return None

    def _on_ack(self, packet_id: int) -> None:
        """PUBACK or PUBCOMP: the exchange ended. The window is filled once the read's
        acks are all handled (`_window_freed`): one pass for all the slots they freed."""
        session = self.session
        assert session is not None
        broker = self.broker
        if broker.hooks.message_acked:
            entry = session.inflight.get(packet_id)
            if entry is not None:
                broker.hooks.notify(HookPoint.MESSAGE_ACKED, self.client_id, entry.delivery.message)
        broker.release_inflight(session, packet_id)

    def _window_freed(self, now: float) -> None:
        self._fill_window(now)
        if self.replays is not None:
            self.replays.room()

    def _on_pubrec(self, p: Pubrec, now: float) -> None:
        session = self.session
        assert session is not None
        entry = session.inflight.get(p.packet_id)
        if entry is not None and p.reason_code >= 0x80:
            # The receiver refused the message: the exchange ends here.
            self.broker.release_inflight(session, p.packet_id)
            self._fill_window(now)
            return
        if entry is not None and entry.state != "pubrel":
            self.broker.mark_pubrel(session, p.packet_id, entry)
        data = self.machine.pubrel(p.packet_id)  # 0x92 on v5 for an id not inflight
        if data and entry is not None and session.stored and self.broker.store.replicated_floor is not None:
            # Sync replication: the PUBREL lets the receiver forget the packet id, so it
            # leaves once the session's replicas know the PUBREL state; a node that takes
            # the session over then sends PUBREL again, not the PUBLISH as a new message.
            self._write_when_durable(data)
        elif data and entry is not None and session.stored and self.broker.store.exchange_floor is not None:
            self._write_when_replicated(data)  # the same in async replication
        elif data:
            self.write(data)

    def _on_subscribe(self, p: Subscribe, now: float) -> None:
        # At most SUBSCRIBE_SLICE filters: no pause is needed, the steps run to the end.
        deque(self.subscribe_steps(p, now), maxlen=0)

    def subscribe_steps(self, p: Subscribe, now: float) -> Iterator[None]:
        """Handle a SUBSCRIBE, pausing (a yield) after each `SUBSCRIBE_SLICE` filters;
        the SUBACK goes once all are handled."""
        session = self.session
        assert session is not None
        sub_id = p.properties.subscription_identifiers[0] if p.properties.subscription_identifiers else None
        codes: list[int] = []
        retained: list[Delivery] = []
        epoch_before = self.broker.store.write_epoch
        streams = self.broker.streams
        asked_from = replay_from(p.properties.user_properties) if p.properties is not EMPTY_PROPERTIES else None
        reasons: list[str] = []
        user_properties: list[tuple[str, str]] = []
        for n, sub in enumerate(p.subscriptions, 1):
            if n % SUBSCRIBE_SLICE == 0:
                yield
            request: ReplayRequest | None = None
            if streams is not None and (asked_from is not None or sub.topic_filter.startswith(REPLAY_PREFIX)):
                try:
                    request = parse_request(sub.topic_filter, asked_from)
                except ReplayRefused as exc:
                    codes.append(exc.code)
                    reasons.append(exc.reason)
                    continue
                if request is not None:
                    # Kept under its real filter (routes, ACL); no retained messages: a replay is the stream.
                    sub = replace(sub, topic_filter=request.topic_filter, retain_handling=2)
            refusal = self._subscribe_refusal(sub.topic_filter) if self.security is not None else None
            if refusal is not None:
                codes.append(refusal)
                continue
            if request is not None and streams is not None:
                try:
                    opened = streams.open_replay(self, request, sub.qos, (sub_id,) if sub_id else ())
                except ReplayRefused as exc:
                    codes.append(exc.code)
                    reasons.append(exc.reason)
                    continue
                self.replays = opened.tap
                user_properties.extend(opened.user_properties)
            code, found = self.broker.subscribe(session, sub, sub_id, now)
            codes.append(code)
            retained.extend(found)
        properties = EMPTY_PROPERTIES
        if reasons or user_properties:
            properties = Properties(reason_string="; ".join(reasons) or None, user_properties=tuple(user_properties))
        self._send_ack(self.machine.suback(p.packet_id, codes, properties), epoch_before)
        for d in retained:
            self.deliver(d, now)

    def _on_unsubscribe(self, p: Unsubscribe) -> None:
        session = self.session
        assert session is not None
        epoch_before = self.broker.store.write_epoch
        filters = [real_filter(f) for f in p.topic_filters] if self.broker.streams is not None else list(p.topic_filters)
        if self.replays is not None:
            for f in filters:
                self.replays.remove(f)
        codes = [
            ReasonCode.SUCCESS if self.broker.unsubscribe(session, f) else ReasonCode.NO_SUBSCRIPTION_EXISTED
            for f in filters
        ]
        self._send_ack(self.machine.unsuback(p.packet_id, codes), epoch_before)


def _persistent(c: Connect) -> bool:
    return (c.properties.session_expiry_interval or 0) > 0 if c.protocol_level == 5 else not c.clean_start


class _ConnectClaims(Protocol):
    def connect_is_local(self, client_id: str, clean_start: bool, persistent: bool) -> bool: ...


def _handoff_is_noop(handoffs: _ConnectClaims | None, client_id: str, clean_start: bool, persistent: bool) -> bool:
    """Whether the CONNECT can be answered without awaiting the session handoff."""
    return handoffs is not None and bool(handoffs.connect_is_local(client_id, clean_start, persistent))
