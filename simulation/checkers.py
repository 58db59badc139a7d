"""Checkers over one simulated run: pure functions of the history and the final
cluster state, each returning the first violation it finds (with the events that
show it) or None.

Properties (the names are what `meshd simulate --cluster` prints):

survival
    In a run where one node crashed for good (`--crash`): the delivery property below,
    after the crash, so every message acknowledged for a persistent session whose node
    died reaches its client on another node (session replication, `--replicas 2`).
delivery
    Every QoS >= 1 message acknowledged to its publisher (reason < 0x80) reaches every
    persistent-session subscriber whose matching subscription (granted QoS >= 1) was
    acknowledged before the publish was sent (and had time to reach the other nodes'
    route tables: `subscription_counts_from`), unless that session expired (its client
    stayed away at least its expiry interval after the publish) or its queue limit was
    hit after the publish (dropped by policy, excused only when it shows in the node's
    metrics: see `metrics`).
metrics
    Every queue-limit drop a node made shows in that node's `dropped_queue_full` metric.
order
    MQTT 4.6 (Ordered Topics): the server sends the PUBLISH packets of one publisher
    connection on one topic at one QoS to a consumer in the order it received them.
    Checked per subscriber connection, over the first copy of each message (a DUP resend
    of a message already delivered is not a new message), for QoS 1 and 2 publishes;
    QoS 0 is left out, since the broker may drop it anywhere (4.3.1: at most once).
    Exempt: a message delivered after a takeover fell back (a clean_start=0 reconnect
    answered session present 0 because the owner was unreachable) and published before
    the new session's routes reached every node (`subscription_counts_from`): it may
    have gone to the old owner's copy, which is merged into the new session later
    (routing.handoff_driver), behind what that session got meanwhile.  Such messages
    are checked for loss and duplicates, not for order.
    Exempt too, for the same reason: a message published while some node could not
    hear others (a cut, a node down, and `HEAL_SETTLE` after it, while the nodes still
    hold each other dead and hold traffic for each other) and delivered after its
    subscriber's session moved to another node (before the publish, or less than
    `HEAL_SETTLE` after it): the forward may have been held or stuck on its way to the
    old owner, or sent by a member the takeover could not fence (unreachable then, and
    fenced by the new owner only once it is seen back), and reaches the session only
    through the old owner's relay (routing.handoff_driver `relay_moved`), behind newer
    messages.
duplicate
    QoS 2 (4.3.3): a subscriber session (a clean client's connection, a persistent
    client's connections until its session ends) receives a message at most once; the only
    second copy allowed is a DUP resend with the packet id of the copy before it (the
    client still holds that packet id and does not pass it on again). QoS 1 (4.3.2): a
    second copy must be a DUP resend.
owner
    After the quiet period: at most one live node holds a persistent session for a
    client id, and a connected client's session is on the node it is connected to.
routes
    After the quiet period: every live node's route table (filter -> nodes) equals the
    truth, the filters of the sessions that exist on each live node.
config
    After the quiet period: every live node holds the same cluster settings and applies
    them (its broker limits agree).
backlog
    After the quiet period nothing has piled up: link send queues and unacknowledged
    batches, held traffic, handoffs under way, acknowledgements waiting, store changes
    not yet durable, routes waiting for a snapshot are back at their baseline.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from mqtt.topics import topic_matches
from simulation.history import (
    Acked, Connected, Delivered, Disconnected, Event, Fault, History, QueueDrop, Sent, Subscribed,
)

MAX_SHOWN = 40  # events shown with a violation


@dataclass(frozen=True)
class Violation:
    prop: str
    detail: str
    events: tuple[str, ...] = ()

    def line(self) -> str:
        return f"VIOLATION {self.prop}: {self.detail}"


@dataclass
class SessionState:
    persistent: bool
    connected: bool
    filters: frozenset[str]


@dataclass
class NodeState:
    node_id: str
    sessions: dict[str, SessionState] = field(default_factory=dict)
    routes: dict[str, tuple[str, ...]] = field(default_factory=dict)  # the node's table: filter -> nodes
    route_filters: frozenset[str] = frozenset()  # filters the node's sessions subscribe (the truth, for its routes)
    config: dict[str, object] = field(default_factory=dict)  # cluster registers: key -> value
    limits: dict[str, object] = field(default_factory=dict)  # the broker limits those registers set
    backlog: dict[str, int] = field(default_factory=dict)


@dataclass
class FinalState:
    nodes: dict[str, NodeState] = field(default_factory=dict)  # live nodes only
    baseline: dict[str, dict[str, int]] = field(default_factory=dict)  # backlog after the first convergence
    connected_to: dict[str, str] = field(default_factory=dict)  # client id -> node it is connected to at the end


Checker = Callable[[History, FinalState], "Violation | None"]


def _shown(events: Iterable[Event]) -> tuple[str, ...]:
    """The events, once each, in the order they happened."""
    unique = {id(e): e for e in events}
    lines = [str(e) for e in sorted(unique.values(), key=lambda e: e.at)]
    if len(lines) > MAX_SHOWN:
        lines = lines[:10] + [f"    ... {len(lines) - MAX_SHOWN} more ..."] + lines[-(MAX_SHOWN - 10):]
    return tuple(lines)


def _faults(history: History) -> list[Event]:
    return [e for e in history.events if isinstance(e, Fault)]


def _session_events(history: History, client: str) -> list[Event]:
    return [e for e in history.events
            if isinstance(e, (Connected, Disconnected, Subscribed, QueueDrop)) and e.client == client]


# ----------------------------------------------------------------- delivery and metrics


def _expiry_gaps(history: History, client: str, expiry: int) -> list[tuple[float, float]]:
    """(away from, back at) of every time the client stayed away at least its session
    expiry interval (less a second of slack for the nodes' clock skew): its session may
    have ended then. A client still away at the end: back at the end of the run."""
    gaps: list[tuple[float, float]] = []
    away_from: float | None = None
    for e in history.ordered():
        if isinstance(e, Disconnected) and e.client == client:
            away_from = e.at if away_from is None else away_from
        elif isinstance(e, Connected) and e.client == client and e.reason < 0x80:
            if away_from is not None and e.at - away_from >= expiry - 1.0:
                gaps.append((away_from, e.at))
            away_from = None
    if away_from is not None and history.ended_at - away_from >= expiry - 1.0:
        gaps.append((away_from, history.ended_at))
    return gaps


SUBSCRIBE_SETTLE = 2.0  # a new route reaches every node by gossip within this (gossip_interval 0.2 s, a few rounds)
HEAL_SETTLE = 12.0  # after a heal or restart: gossip sees the member again, anti-entropy (every 2.5-7.5 s) pulls the routes


def _disruptions(history: History) -> list[tuple[float, float]]:
    """(from, to) of every time some node could not hear others: a cut until the heal,
    a kill until the restart (to = the end of the run when never undone)."""
    out: list[tuple[float, float]] = []
    cut_since: float | None = None
    killed: dict[str, float] = {}
    for e in history.ordered():
        if not isinstance(e, Fault):
            continue
        word, _, rest = e.what.partition(" ")
        if word == "cut" and cut_since is None:
            cut_since = e.at
        elif word in ("heal", "final") and cut_since is not None:
            out.append((cut_since, e.at))
            cut_since = None
        elif word in ("kill", "crash"):
            killed.setdefault(rest, e.at)
        elif word == "restart" and rest in killed:
            out.append((killed.pop(rest), e.at))
    end = history.ended_at
    out += [(since, end) for since in killed.values()] + ([(cut_since, end)] if cut_since is not None else [])
    return sorted(out)


def subscription_counts_from(subscribed_at: float, disruptions: list[tuple[float, float]]) -> float:
    """When a subscription starts to oblige: a SUBACK does not wait for the cluster to
    learn the route (routing.cluster spreads it by gossip afterwards), so a publish on
    another node in the next moments, or on the far side of a cut until the routes are
    pulled after the heal, finds no route there.  The subscription counts from
    `SUBSCRIBE_SETTLE` after its SUBACK, pushed to `HEAL_SETTLE` after the end of every
    disruption under way meanwhile."""
    start = subscribed_at + SUBSCRIBE_SETTLE
    for since, until in disruptions:
        if since <= start and until >= subscribed_at:
            start = max(start, until + HEAL_SETTLE)
    return start


def check_delivery(history: History, final: FinalState) -> Violation | None:
    sent = {e.msg: e for e in history.events if isinstance(e, Sent)}
    acked = [e for e in history.events if isinstance(e, Acked) and e.reason < 0x80 and sent[e.msg].qos >= 1]
    received: dict[tuple[str, str], list[Delivered]] = defaultdict(list)
    for e in history.events:
        if isinstance(e, Delivered):
            received[(e.client, e.msg)].append(e)
    subs: dict[str, list[Subscribed]] = defaultdict(list)
    expiry: dict[str, int] = {}
    for e in history.events:
        if isinstance(e, Subscribed) and e.reason < 0x80 and min(e.qos, e.reason) >= 1:
            subs[e.client].append(e)
        elif isinstance(e, Connected) and not e.clean_start and e.expiry > 0:
            expiry[e.client] = e.expiry
    drops: dict[str, list[QueueDrop]] = defaultdict(list)
    for e in history.events:
        if isinstance(e, QueueDrop) and e.count > 0:
            drops[e.client].append(e)
    disruptions = _disruptions(history)
    # Per client, the subscriptions that oblige: from when they count, unless the
    # session may have expired after them (before the publish, the subscription was
    # gone; after it, the message went with the session).
    obliging: dict[str, list[tuple[float, str]]] = {}
    for client in sorted(expiry):
        gaps = _expiry_gaps(history, client, expiry[client])
        obliging[client] = [(subscription_counts_from(s.at, disruptions), s.topic_filter) for s in subs[client]
                            if not any(back > s.at for _, back in gaps)]
    for ack in sorted(acked, key=lambda e: e.at):
        msg = sent[ack.msg]
        for client in sorted(expiry):
            if not any(since < msg.at and topic_matches(f, msg.topic) for since, f in obliging[client]):
                continue
            if received.get((client, msg.msg)):
                continue
            if any(d.at >= msg.at and d.metric > 0 for d in drops[client]):
                continue
            events: list[Event] = [msg, ack]
            events += [e for e in history.events if isinstance(e, Delivered) and e.client == client
                       and e.msg.rsplit("/", 1)[0] == msg.msg.rsplit("/", 1)[0]]
            events += _session_events(history, client) + _faults(history)
            return Violation("delivery", f"{msg.msg} (qos {msg.qos}, {msg.topic}, acknowledged at {ack.at:.3f})"
                             f" never reached persistent subscriber {client}", _shown(events))
    return None


def check_survival(history: History, final: FinalState) -> Violation | None:
    """In a run where a node crashed for good (never restarted, its disk gone): every
    message acknowledged for a persistent session still reaches its client, which
    resumed the session on another node (from a replica: `session_replicas` >= 2).
    The delivery property, judged after the crash; a violation here is one that only
    a replica could have prevented."""
    if not any(isinstance(e, Fault) and e.what.startswith("crash ") for e in history.events):
        return None
    found = check_delivery(history, final)
    return None if found is None else Violation("survival", found.detail, found.events)


def check_metrics(history: History, final: FinalState) -> Violation | None:
    for e in history.events:
        if isinstance(e, QueueDrop) and e.count > e.metric:
            return Violation("metrics", f"{e.client} lost {e.count} queued messages at {e.node} but the node's"
                             f" dropped_queue_full grew by {e.metric}", _shown([e]))
    return None


# ----------------------------------------------------------------- order and duplicates


def _fallbacks(history: History) -> dict[str, list[float]]:
    """client -> when a reconnect of its persistent session found no session
    (CONNACK session present 0 on a clean_start=0 CONNECT after the first): the takeover
    fell back (owner unreachable) and the old copy is merged later."""
    out: dict[str, list[float]] = defaultdict(list)
    seen: set[str] = set()
    for e in history.ordered():
        if isinstance(e, Connected) and e.reason < 0x80 and not e.clean_start:
            if e.client in seen and not e.session_present:
                out[e.client].append(e.at)
            seen.add(e.client)
    return out


def _moves(history: History) -> dict[str, list[float]]:
    """client -> when a reconnect of its persistent session (a clean_start=0 CONNECT
    after the first) succeeded: the session may have moved to another node then."""
    out: dict[str, list[float]] = defaultdict(list)
    seen: set[str] = set()
    for e in history.ordered():
        if isinstance(e, Connected) and e.reason < 0x80 and not e.clean_start:
            if e.client in seen:
                out[e.client].append(e.at)
            seen.add(e.client)
    return out


def _relayed_late(msg: Sent, delivered_at: float, moves: list[float], disruptions: list[tuple[float, float]]) -> bool:
    """Published during a disruption (or while the nodes had not yet seen its end),
    delivered after the session moved: it may have come through the old owner's relay
    (see `order`)."""
    return (any(msg.at - HEAL_SETTLE < moved <= delivered_at for moved in moves)
            and any(since <= msg.at <= until + HEAL_SETTLE for since, until in disruptions))


def _given_by_the_crashed(history: History) -> dict[tuple[str, str], float]:
    """(client, msg) -> when the node crashed for good that had delivered that message
    to that client, for every delivery on a connection to a node that crashed later
    (`--crash`).  A takeover from a replica cannot know what the dead owner delivered
    last: such a message may come again, late (a copy pushed or held elsewhere), after
    newer ones, with DUP=1 (README, "What a takeover from a replica cannot know")."""
    crashed_at: dict[str, float] = {}
    for e in history.events:
        if isinstance(e, Fault) and e.what.startswith("crash "):
            crashed_at.setdefault(e.what.split()[1], e.at)
    if not crashed_at:
        return {}
    node_of = {(e.client, e.conn): e.node for e in history.events if isinstance(e, Connected)}
    out: dict[tuple[str, str], float] = {}
    for e in history.events:
        if isinstance(e, Delivered):
            at = crashed_at.get(node_of.get((e.client, e.conn), ""))
            if at is not None and e.at <= at:
                out.setdefault((e.client, e.msg), at)
    return out


def check_order(history: History, final: FinalState) -> Violation | None:
    sent = {e.msg: e for e in history.events if isinstance(e, Sent)}
    disruptions = _disruptions(history)
    given_by_crashed = _given_by_the_crashed(history)
    moves = _moves(history)
    # (fallback, when the new session's routes had reached every node)
    resets = {c: [(r, subscription_counts_from(r, disruptions)) for r in rs] for c, rs in _fallbacks(history).items()}
    seen: set[tuple[str, int, str]] = set()  # (client, conn, msg) delivered on that connection
    last: dict[tuple[str, int, str, int, str, int], Delivered] = {}
    for e in history.ordered():
        if not isinstance(e, Delivered):
            continue
        msg = sent.get(e.msg)
        if msg is None or msg.qos == 0:
            continue
        key = (e.client, e.conn, e.msg)
        if key in seen:
            continue
        seen.add(key)
        crashed = given_by_crashed.get((e.client, e.msg))
        if e.dup and crashed is not None and crashed < e.at:
            continue  # a repeat of what the crashed owner delivered (`_given_by_the_crashed`): judged as a duplicate
        stream = (e.client, e.conn, msg.publisher, msg.conn, msg.topic, msg.qos)
        before = last.get(stream)
        if before is not None and sent[before.msg].seq > msg.seq and not any(
                reset <= e.at and msg.at < settled for reset, settled in resets.get(e.client, ())) and not (
                _relayed_late(msg, e.at, moves.get(e.client, []), disruptions)):
            events: list[Event] = [d for d in history.events if isinstance(d, Delivered) and d.client == e.client
                      and d.conn == e.conn and sent.get(d.msg) is not None
                      and (sent[d.msg].publisher, sent[d.msg].conn, sent[d.msg].topic) == (msg.publisher, msg.conn, msg.topic)]
            events += [s for s in sent.values() if s.msg in (e.msg, before.msg)]
            events += _session_events(history, e.client) + _faults(history)
            return Violation("order", f"{e.client}#{e.conn} got {e.msg} after {before.msg} (same publisher"
                             f" connection, topic {msg.topic}, qos {msg.qos})", _shown(events))
        last[stream] = e
    return None


def _sessions(history: History) -> dict[tuple[str, int], int]:
    """(client, connection) -> the session it belongs to: a clean client's every
    connection is a session of its own; a persistent client's connections share one
    (numbered by its first connection)."""
    out: dict[tuple[str, int], int] = {}
    first: dict[str, int] = {}
    for e in history.events:
        if isinstance(e, Connected):
            out[(e.client, e.conn)] = e.conn if e.clean_start else first.setdefault(e.client, e.conn)
    return out


def check_duplicates(history: History, final: FinalState) -> Violation | None:
    session_of = _sessions(history)
    copies: dict[tuple[str, int, str], list[Delivered]] = defaultdict(list)
    for e in history.ordered():
        if isinstance(e, Delivered):
            copies[(e.client, session_of.get((e.client, e.conn), e.conn), e.msg)].append(e)
    for (client, _, msg), got in copies.items():
        for before, again in zip(got, got[1:]):
            if again.qos == 2 and not (again.dup and again.packet_id == before.packet_id):
                why = "QoS 2 message delivered twice"
            elif again.qos == 1 and not again.dup:
                why = "QoS 1 message delivered again without DUP"
            else:
                continue
            events: list[Event] = [*got, *(e for e in history.events if isinstance(e, Sent) and e.msg == msg)]
            events += _session_events(history, client) + _faults(history)
            return Violation("duplicate", f"{why}: {msg} to {client} (#{before.conn} at {before.at:.3f},"
                             f" #{again.conn} at {again.at:.3f})", _shown(events))
    return None


# ----------------------------------------------------------------- the state after heal


def check_owner(history: History, final: FinalState) -> Violation | None:
    holders: dict[str, list[str]] = defaultdict(list)
    for node in final.nodes.values():
        for cid, s in node.sessions.items():
            if s.persistent:
                holders[cid].append(node.node_id)
    for cid in sorted(holders):
        if len(holders[cid]) > 1:
            return Violation("owner", f"session {cid} is held by {', '.join(sorted(holders[cid]))}",
                             _shown(_session_events(history, cid) + _faults(history)))
    for cid, node_id in sorted(final.connected_to.items()):
        at = final.nodes.get(node_id)
        if at is None:
            continue
        session = at.sessions.get(cid)
        if session is None or not session.connected:
            elsewhere = sorted(holders.get(cid, []))
            return Violation("owner", f"{cid} is connected to {node_id}, which does not serve its session"
                             f" (held by {', '.join(elsewhere) or 'no node'})",
                             _shown(_session_events(history, cid) + _faults(history)))
    return None


def route_truth(final: FinalState) -> dict[str, tuple[str, ...]]:
    truth: dict[str, set[str]] = defaultdict(set)
    for node in final.nodes.values():
        for f in node.route_filters:
            truth[f].add(node.node_id)
    return {f: tuple(sorted(n)) for f, n in truth.items()}


def check_routes(history: History, final: FinalState) -> Violation | None:
    truth = route_truth(final)
    for node_id in sorted(final.nodes):
        table = final.nodes[node_id].routes
        if table != truth:
            diff = []
            for f in sorted(set(table) | set(truth)):
                if table.get(f) != truth.get(f):
                    diff.append(f"{f}: table {list(table.get(f, ()))} truth {list(truth.get(f, ()))}")
            return Violation("routes", f"{node_id}'s route table differs from the subscriptions: {'; '.join(diff)}",
                             _shown(_faults(history)))
    return None


def check_config(history: History, final: FinalState) -> Violation | None:
    nodes = [final.nodes[n] for n in sorted(final.nodes)]
    if not nodes:
        return None
    first = nodes[0]
    for node in nodes[1:]:
        for what, mine, theirs in (("cluster settings", first.config, node.config), ("broker limits", first.limits, node.limits)):
            if mine != theirs:
                keys = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
                detail = ", ".join(f"{k}: {first.node_id}={mine.get(k)!r} {node.node_id}={theirs.get(k)!r}" for k in keys)
                return Violation("config", f"{what} differ: {detail}", _shown(_faults(history)))
    return None


def check_backlog(history: History, final: FinalState) -> Violation | None:
    for node_id in sorted(final.nodes):
        backlog = final.nodes[node_id].backlog
        base = final.baseline.get(node_id, {})
        grown = {k: v for k, v in sorted(backlog.items()) if v > base.get(k, 0)}
        if grown:
            detail = ", ".join(f"{k} {base.get(k, 0)} -> {v}" for k, v in grown.items())
            return Violation("backlog", f"{node_id} did not drain after the heal: {detail}", _shown(_faults(history)))
    return None


CHECKERS: Sequence[Checker] = (
    check_survival, check_delivery, check_metrics, check_order, check_duplicates,
    check_owner, check_routes, check_config, check_backlog,
)


def first_violation(history: History, final: FinalState) -> Violation | None:
    for checker in CHECKERS:
        found = checker(history, final)
        if found is not None:
            return found
    return None
