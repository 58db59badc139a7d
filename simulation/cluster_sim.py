"""One seed of the cluster simulator: a schedule (`simulation.schedule`) played against
a whole cluster in virtual time (`simulation.cluster`), its history recorded
(`simulation.history`) and judged by the checkers (`simulation.checkers`).

The run has four phases:

1. start: every node, wait until membership and routes converge; the persistent and
   clean subscribers connect and subscribe, and the routes converge again (the backlog
   counters measured now are the baseline);
2. the schedule: clients publish, go away and come back on other nodes, while nodes
   are killed and restarted, links cut and healed, clocks skewed, settings changed;
3. the final heal: every cut healed, every killed node restarted, convergence awaited,
   every persistent subscriber connected again; then a quiet period;
4. the final state of every node is read, and the checkers run.

Nothing here reads a system clock or an unseeded RNG: the same seed replays the same
run, event for event (across processes too when PYTHONHASHSEED is fixed: some node code
iterates sets of strings).
"""

from __future__ import annotations

import logging
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import trio

import faults
from clock import TrioClock
from mesh.cluster_config import CLUSTER_KEYS
from mesh.node import Node
from routing.cluster import Cluster
from session_store.model import Session
from simulation.checkers import FinalState, NodeState, SessionState, Violation, first_violation
from simulation.cluster import ClusterParams, SimCluster, SimTimeout, run_cluster
from simulation.events import SimEvent
from simulation.history import (
    Acked, Connected, ConnectFailed, Delivered, Disconnected, Fault, History, QueueDrop, Sent, Subscribed, Unacked,
    message_id, parse_message_id,
)
from simulation.schedule import QUIET_SECONDS, ClientPlan, ClientStep, Schedule, SimSpec, WorldStep, make_schedule
from simulation.sim_client import ConnectionLost, SimClient

PUBLISH_TIMEOUT = 30.0  # a QoS >= 1 acknowledgement later than this counts as never
CONNECT_TIMEOUT = 15.0
CONNECT_TRIES = 4
SAMPLE_EVERY = 0.25  # virtual seconds between two looks at the nodes' drop counters
SETTLE_TIMEOUT = 60.0


@dataclass
class SeedResult:
    seed: int
    violation: Violation | None
    counts: dict[str, int] = field(default_factory=dict)
    history: History = field(default_factory=History, repr=False)

    def line(self) -> str:
        return f"seed={self.seed} ok" if self.violation is None else f"seed={self.seed} {self.violation.line()}"


def run_seed(spec: SimSpec, *, buggify: tuple[str, ...] = (), out_dir: Path | None = None) -> SeedResult:
    """Run one seed and judge it. `buggify` switches deliberate defects on for this run
    only; `out_dir` receives the nodes' traces (`<out_dir>/<node>/traces/<node>.jsonl`)
    and `history.txt`."""
    schedule = make_schedule(spec)
    params = ClusterParams(
        nodes=spec.nodes, seed=spec.seed, store="memory",
        settings={"session_replicas": spec.replicas},  # explicit: the node default is 2
        data_dir=str(out_dir) if out_dir is not None else None, trace=out_dir is not None,
        time_limit=spec.seconds + QUIET_SECONDS + 4 * SETTLE_TIMEOUT + 120.0,
    )
    history = History()
    quiet = logging.getLogger("meshd")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)  # the nodes' own logs are not the simulator's output
    faults.switch_on(buggify)
    workload = Workload(schedule, history, random.Random(f"{spec.seed}:runtime"))
    try:
        final = run_cluster(params, workload.run)
    except BaseExceptionGroup as group:
        # Something the workload waited on never came and the harness's time limit
        # ended the run (its Cancelled arrives wrapped by the workload's nurseries).
        if group.subgroup((trio.Cancelled, SimTimeout)) is None:
            raise
        final = FinalState()
        workload.stuck(f"the run did not end within its limit of {params.time_limit:g} virtual s")
    except SimTimeout as exc:
        final = FinalState()
        workload.stuck(str(exc))
    finally:
        faults.switch_off()
        quiet.setLevel(level)
    violation = workload.failure or first_violation(history, final)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        lines = [str(e) for e in history.ordered()]
        (out_dir / "history.txt").write_text("\n".join(lines) + "\n")
    counts = {
        "published": sum(isinstance(e, Sent) for e in history.events),
        "acked": sum(isinstance(e, Acked) for e in history.events),
        "delivered": sum(isinstance(e, Delivered) for e in history.events),
        "faults": sum(isinstance(e, Fault) for e in history.events),
    }
    return SeedResult(spec.seed, violation, counts, history)


class Workload:
    """Plays a schedule against a running cluster and records what happens."""

    def __init__(self, schedule: Schedule, history: History, rng: random.Random) -> None:
        self.schedule = schedule
        self.history = history
        self.rng = rng  # choices that depend on the run (which node is up): from the seed too
        self.clock = TrioClock()
        self.t0 = 0.0
        self.cluster: SimCluster | None = None
        self.clients: dict[str, SimClient] = {}
        self.conn: dict[str, int] = {}  # client id -> its current connection number
        self.seq: dict[str, int] = {}  # publisher -> sequence number on its connection
        self.failure: Violation | None = None  # the run itself could not go on (no convergence)
        self.crashed: set[str] = set()  # nodes crashed for good: never restarted
        self._samples: dict[str, tuple[Node, int, dict[str, tuple[Session, int]]]] = {}

    def now(self) -> float:
        return round(self.clock.now() - self.t0, 6)

    # ------------------------------------------------------------------ the run

    async def run(self, cluster: SimCluster) -> FinalState:
        self.cluster = cluster
        self.t0 = self.clock.now()
        cluster.on_event(self._on_event)
        final = FinalState()
        await self._settle("the start")
        subscribers = [p for p in self.schedule.clients if p.role != "publisher"]
        for plan in subscribers:
            await self._connect(plan, plan.nodes[0])
        await self._settle("the subscriptions")
        final.baseline = {n: _backlog(cluster, n) for n in cluster.alive_nodes()}
        self.t0 = self.clock.now()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._sampler)
            async with trio.open_nursery() as clients:
                for plan in self.schedule.clients:
                    clients.start_soon(self._client, plan, self.schedule.steps[plan.client_id])
                clients.start_soon(self._world, self.schedule.world)
            await self._final_heal(cluster)
            await cluster.run_for(QUIET_SECONDS)
            self._sample()
            nursery.cancel_scope.cancel()
        self.history.ended_at = self.now()
        final.nodes = {n: await _node_state(cluster, n) for n in cluster.alive_nodes()}
        final.connected_to = {cid: c.node_id for cid, c in sorted(self.clients.items()) if c.connected}
        return final

    async def _settle(self, after: str) -> None:
        """Wait until membership and routes converge. A cluster that does not within
        SETTLE_TIMEOUT has failed the liveness property (the run goes on, so the other
        checkers see the state it ended in)."""
        assert self.cluster is not None
        try:
            await self.cluster.wait_converged(SETTLE_TIMEOUT)
        except SimTimeout:
            if self.failure is None:
                gaps = "; ".join(self.cluster.convergence_gaps())
                self.failure = Violation("liveness", f"no convergence within {SETTLE_TIMEOUT:g} s after {after}: {gaps}",
                                         tuple(str(e) for e in self.history.ordered() if isinstance(e, Fault)))

    async def _final_heal(self, cluster: SimCluster) -> None:
        cluster.heal()
        for node_id in cluster.node_ids:
            if cluster.node(node_id) is None and node_id not in self.crashed:
                await cluster.restart(node_id)
        self.history.add(Fault(self.now(), "final heal: every link healed, every node running"))
        await self._settle("the final heal")
        for plan in self.schedule.clients:
            client = self.clients.get(plan.client_id)
            if plan.role == "persistent" and (client is None or not client.connected):
                await self._connect(plan, plan.nodes[0])
        self.history.healed_at = self.now()

    # ------------------------------------------------------------------ clients

    async def _client(self, plan: ClientPlan, steps: list[ClientStep]) -> None:
        if plan.role == "publisher":
            await self._connect(plan, plan.nodes[0])
        for step in steps:
            await trio.sleep_until(self.t0 + step.at)
            client = self.clients.get(plan.client_id)
            if step.action == "reconnect":
                if client is not None and client.connected:
                    if step.how == "drop":
                        await client.drop()
                    else:
                        await client.disconnect()
                    self.history.add(Disconnected(self.now(), plan.client_id, self.conn[plan.client_id], step.how))
                await trio.sleep(step.pause)
                await self._connect(plan, step.node)
            elif step.action == "publish":
                if client is None or not client.connected:
                    client = await self._connect(plan, step.node or plan.nodes[0])
                    if client is None:
                        continue
                await self._publish(plan, client, step)

    async def _connect(self, plan: ClientPlan, prefer: str) -> SimClient | None:
        """Connect (again) to `prefer` or, when it is down, another running node."""
        assert self.cluster is not None
        cid = plan.client_id
        persistent = plan.role == "persistent"
        for attempt in range(CONNECT_TRIES):
            alive = self.cluster.alive_nodes()
            if not alive:
                await trio.sleep(1.0)
                continue
            node = prefer if prefer in alive and attempt == 0 else self.rng.choice(alive)
            client = self.cluster.clients.get(cid)  # made by the first connect, even one that failed
            conn = self.conn[cid] = self.conn.get(cid, 0) + 1  # deliveries may come before the CONNACK is seen
            try:
                with trio.move_on_after(CONNECT_TIMEOUT) as scope:
                    if client is None:
                        client = await self.cluster.connect(node, cid, clean_start=not persistent,
                                                            session_expiry=plan.expiry)
                    else:
                        if client.connected:
                            await client.drop()
                        await client.connect(node, clean_start=not persistent, session_expiry=plan.expiry)
                if scope.cancelled_caught:
                    raise ConnectionLost("no CONNACK in time")
            except ConnectionLost as exc:
                self.history.add(ConnectFailed(self.now(), cid, node, str(exc) or type(exc).__name__))
                client = self.cluster.clients.get(cid)
                if client is not None and client.connected:
                    await client.drop()
                await trio.sleep(0.5)
                continue
            assert client is not None
            self.clients[cid] = client
            self.seq[cid] = 0
            self.history.add(Connected(self.now(), cid, conn, node, not persistent, plan.expiry,
                                       client.connack_reason, client.session_present))
            if not client.connected:
                await trio.sleep(0.5)
                continue
            if plan.filters and not client.session_present:
                for topic_filter, qos in plan.filters:
                    try:
                        with trio.move_on_after(CONNECT_TIMEOUT) as scope:
                            reason = await client.subscribe(topic_filter, qos)
                    except ConnectionLost:
                        break
                    if scope.cancelled_caught:
                        self.stuck(f"{cid}#{conn} got no SUBACK for {topic_filter} within {CONNECT_TIMEOUT:g} s")
                        await client.drop()
                        break
                    self.history.add(Subscribed(self.now(), cid, conn, topic_filter, qos, reason))
            return client
        return None

    def stuck(self, what: str) -> None:
        """A request the cluster never answered (the run goes on without it)."""
        if self.failure is None:
            self.failure = Violation("liveness", what, tuple(str(e) for e in self.history.ordered()[-40:]))

    async def _publish(self, plan: ClientPlan, client: SimClient, step: ClientStep) -> None:
        cid = plan.client_id
        conn = self.conn[cid]
        seq = self.seq[cid] = self.seq[cid] + 1
        msg = message_id(cid, conn, seq)
        self.history.add(Sent(self.now(), msg, cid, conn, seq, client.node_id, step.topic, step.qos))
        try:
            with trio.move_on_after(PUBLISH_TIMEOUT) as scope:
                reason = await client.publish(step.topic, msg.encode("ascii"), step.qos)
            if scope.cancelled_caught:
                self.history.add(Unacked(self.now(), msg, f"no acknowledgement within {PUBLISH_TIMEOUT:g} s"))
                await client.drop()
                self.history.add(Disconnected(self.now(), cid, conn, "drop"))
            elif reason is not None:
                self.history.add(Acked(self.now(), msg, reason))
        except ConnectionLost as exc:
            self.history.add(Unacked(self.now(), msg, str(exc) or "connection lost"))

    def _on_event(self, event: SimEvent) -> None:
        """Deliveries and lost connections, as the harness reports them."""
        cid = event.client
        if cid is None or cid not in self.conn:
            return
        at = round(event.at - self.t0, 6)
        if event.kind == "deliver":
            d = event.detail
            payload = d.get("payload")
            if not isinstance(payload, bytes) or parse_message_id(payload) is None:
                return
            packet_id = d.get("packet_id")
            self.history.add(Delivered(at, cid, self.conn[cid], payload.decode("ascii"), str(d.get("topic")),
                                       int(str(d.get("qos"))), bool(d.get("dup")), bool(d.get("retain")),
                                       packet_id if isinstance(packet_id, int) else None))
        elif event.kind in ("lost", "kicked"):
            self.history.add(Disconnected(at, cid, self.conn[cid], f"{event.kind} {event.detail}"))

    # ------------------------------------------------------------------ faults

    async def _world(self, steps: list[WorldStep]) -> None:
        assert self.cluster is not None
        cluster = self.cluster
        for step in steps:
            await trio.sleep_until(self.t0 + step.at)
            if step.node in self.crashed:
                continue
            if step.action == "crash":
                if cluster.node(step.node) is not None:
                    self._sample()
                    self.history.add(Fault(self.now(), f"crash {step.node}"))
                    await cluster.crash(step.node)
                self.crashed.add(step.node)
            elif step.action == "kill":
                if cluster.node(step.node) is not None:
                    self._sample()
                    self.history.add(Fault(self.now(), f"kill {step.node}"))
                    await cluster.kill(step.node)
            elif step.action == "restart":
                if cluster.node(step.node) is None:
                    self.history.add(Fault(self.now(), f"restart {step.node}"))
                    await cluster.restart(step.node)
            elif step.action in ("cut", "cut_one_way"):
                one_way = step.action == "cut_one_way"
                try:
                    cluster.cut([step.node], [step.other], one_way=one_way)
                except NotImplementedError:
                    one_way = False
                    cluster.cut([step.node], [step.other])
                self.history.add(Fault(self.now(), f"cut {step.node} -> {step.other}" if one_way
                                       else f"cut {step.node} <-> {step.other}"))
            elif step.action == "heal":
                cluster.heal()
                self.history.add(Fault(self.now(), "heal"))
            elif step.action == "skew":
                cluster.skew(step.node, step.seconds)
                self.history.add(Fault(self.now(), f"skew {step.node} {step.seconds:+.3f} s"))
            elif step.action == "config":
                alive = cluster.alive_nodes()
                node = step.node if step.node in alive else alive[0]
                status, _ = await cluster.api(node, "PUT", f"/api/v1/config/{step.key}", {"value": step.value})
                self.history.add(Fault(self.now(), f"config {step.key}={step.value} at {node} (HTTP {status})"))

    # ------------------------------------------------------------------ drops

    async def _sampler(self) -> None:
        while True:
            await trio.sleep(SAMPLE_EVERY)
            self._sample()

    def _sample(self) -> None:
        """Queue-limit drops since the last look, per node and session, with the node's
        metric beside them (a restarted node starts its counters over).  A session that
        left the node since the last look (handed over, ended) keeps its counter on the
        object it was, which this look still holds: its drops up to its leaving count
        for it (seed 35 of 5 nodes, 20 clients, 60 s: a drop 0.16 s before the session
        was handed over was counted by the node but never seen, and the message counted
        lost).  What the metric grew by beyond that (a session that came and went
        between two looks) is put down to those that left."""
        assert self.cluster is not None
        for node_id in self.cluster.alive_nodes():
            node = self.cluster.node(node_id)
            assert node is not None
            broker = node.broker
            sessions = dict(broker.sessions)
            metric = broker.stats.dropped_queue_full
            before = self._samples.get(node_id)
            if before is not None and before[0] is node:
                _, metric_before, sessions_before = before
                seen = 0
                left: list[str] = []
                for cid in sorted(set(sessions) | set(sessions_before)):
                    now_session = sessions.get(cid)
                    then = sessions_before.get(cid)
                    grown = 0
                    if then is not None:
                        old, old_count = then
                        if old is now_session:
                            grown = old.dropped - old_count
                        else:  # it left (and maybe came back as another session object)
                            grown = old.dropped - old_count
                            left.append(cid)
                            if now_session is not None:
                                grown += now_session.dropped
                    elif now_session is not None:
                        grown = now_session.dropped
                    if grown > 0:
                        seen += grown
                        self.history.add(QueueDrop(self.now(), node_id, cid, grown, metric - metric_before))
                unseen = metric - metric_before - seen
                if unseen > 0:
                    for cid in left:
                        self.history.add(QueueDrop(self.now(), node_id, cid, unseen, unseen))
            else:
                for cid in sorted(sessions):
                    if sessions[cid].dropped:
                        self.history.add(QueueDrop(self.now(), node_id, cid, sessions[cid].dropped, metric))
            self._samples[node_id] = (node, metric, {cid: (sess, sess.dropped) for cid, sess in sessions.items()})


# ---------------------------------------------------------------------- final state


def _cluster_of(node: Node) -> Cluster:
    cluster = node.cluster
    assert isinstance(cluster, Cluster)
    return cluster


def _backlog(sim: SimCluster, node_id: str) -> dict[str, int]:
    """What must drain once the cluster is quiet: the counters a node exposes (and a
    few it only keeps), each back at its baseline after the heal."""
    node = sim.node(node_id)
    assert node is not None
    cluster = _cluster_of(node)
    broker = node.broker
    store = node.store
    links = [link for peer, link in cluster.links.items() if peer not in sim.gone]
    handoffs = cluster.handoffs
    return {
        "link_queue": sum(len(link.queue) for link in links),
        "link_unacked": sum(len(batch) for link in links for batch in link.unacked.values()),
        "link_requests": sum(len(link.requests) for link in links),
        # What is held for a member crashed for good stays held (for `netsplit_hold`):
        # a real cluster cannot tell it from one that comes back.
        "held_messages": sum(n for m, n in cluster.held.counts().items() if m not in sim.gone),
        "held_members": len([m for m in cluster.held.members if m not in sim.gone]),
        "handoffs_giving": len(handoffs.giving),
        "handoffs_taking": len(handoffs.taking),
        "ack_waiters": len(broker.ack_waiters),
        "store_not_durable": store.write_epoch - store.durable_epoch,
        "routes_wanted": len(cluster.table.wanted),
    }


async def _node_state(sim: SimCluster, node_id: str) -> NodeState:
    node = sim.node(node_id)
    assert node is not None
    cluster = _cluster_of(node)
    broker = node.broker
    state = NodeState(node_id)
    # A session past its expiry kept for a member that may have resumed it
    # (routing/contact.py) is no holder: with a member crashed for good it is kept
    # until `held_max_age`, beyond the quiet period.
    kept = broker.expired_while_down if sim.gone else {}
    for cid, session in sorted(broker.sessions.items()):
        if cid in kept:
            continue
        state.sessions[cid] = SessionState(session.persistent, cid in broker.connections, frozenset(session.subscriptions))
    state.routes = {f: tuple(sorted(n)) for f, n in sorted(sim.routes_seen(node_id).items())}
    state.route_filters = frozenset(f for s in broker.sessions.values() for f in s.subscriptions)
    status, body = await sim.api(node_id, "GET", "/api/v1/config")
    # The settings an operator may change cluster-wide, as each node has them in effect
    # (with where the value came from: a register, or the node's own settings).
    entries: list[dict[str, Any]] = body["config"] if status == 200 else []
    state.config = {e["key"]: (e["value"], e.get("source")) for e in entries if e["key"] in CLUSTER_KEYS}
    state.limits = asdict(broker.limits)
    state.backlog = _backlog(sim, node_id)
    return state
