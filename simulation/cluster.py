"""A whole meshd cluster in one Trio run, in virtual time, deterministic by seed.

`run_cluster(params, scenario)` builds N complete nodes with `mesh.compose.build_node`
(broker, session store, routing, netsplit, gossip: the code a `meshd` process runs),
joined by an in-memory network (`gossip.memory_network.MemoryNetwork`, which carries both
the gossip datagrams and the mesh links' streams), and runs `scenario(cluster)` under
`trio.testing.MockClock(autojump_threshold=0)`: time moves only when every task
waits, straight to the next deadline, so a minute of cluster life takes milliseconds
when little happens.  Clients are `SimClient`s (`simulation.sim_client`): the
project's own MQTT codec over an in-memory pipe into the node's normal connection
path (`Node.serve_client_stream`, the `ClientConnection` a TLS client gets); no TCP,
no HTTP listener (`SimCluster.api` calls the node's API router in-process).

What a scenario can do (`SimCluster`): connect clients, kill a node (as kill -9: its
tasks are cancelled with no goodbye, its client connections reset, and its store keeps
only what was synced), restart it on the same store, cut and heal links (both ways or
one way), skew a node's wall clock, and wait for conditions in virtual time.

Determinism: the same `ClusterParams` give the same run, event for event, within one
process: node ids, the wall epoch and every node's RNG are fixed by the seed, the
network draws from its own seeded RNG, commits run inline (a worker thread would let
virtual time jump while it writes), and Trio's scheduler is made deterministic
(`_deterministic_scheduling`).  Across processes Python's string hashing must match
too (set iteration order): `PYTHONHASHSEED` (the simulator's CLI sets it).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import random
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterator, Sequence, TypeVar

import outcome
import trio
import trio.testing

from clock import TrioClock
from gossip.service import GossipService
from gossip.memory_network import MemoryNetwork, MemoryTransport
from mesh.compose import build_node
from mesh.config import Settings, load_settings
from mesh.http_api import Request
from mesh.node import Node
from mqtt import Will
from routing.cluster import Cluster
from session_store.store import MemoryDisk, MemoryStore, SessionStore
from simulation.events import SimEvent
from simulation.pipe import Pipe
from simulation.sim_client import NodeDown, SimClient

log = logging.getLogger("meshd.simulation")

T = TypeVar("T")

EPOCH = 1_800_000_000.0  # every node's wall clock at virtual time 0 (before skew)
GOSSIP_PORT = 7946
POLL = 0.01  # virtual seconds between two looks at a condition in `wait_for`


@dataclass
class ClusterParams:
    nodes: int = 3
    seed: int = 1
    store: str = "memory"  # or "rocks" (RocksDB in <data_dir>/<node>/sessions)
    data_dir: str | None = None  # traces go to <data_dir>/<node>/traces when trace=True
    trace: bool = False
    settings: dict[str, object] = field(default_factory=dict)  # overrides for every node's Settings
    latency: float = 0.002  # MemoryNetwork: one-way delay (s), +- jitter as a fraction
    jitter: float = 0.5
    loss: float = 0.0
    gossip_preset: str = "lan"
    client_latency: float = 0.001  # one way, between a client and its node
    time_limit: float = 3600.0  # virtual seconds the scenario may take (SimTimeout past it)


class SkewedClock(TrioClock):
    """A node's clock: Trio's virtual time, and a wall clock `skew` seconds off the
    cluster's (HLC stamps, session expiry, traces read it)."""

    def __init__(self, wall_epoch: float) -> None:
        super().__init__(wall_epoch=wall_epoch)
        self.skew = 0.0

    def wall(self) -> float:
        return super().wall() + self.skew


class SimTimeout(AssertionError):
    """A condition a scenario waited for did not hold in time (virtual seconds)."""


@dataclass
class _Machine:
    """What outlives one process of a node: its id, settings, disk and clock."""

    node_id: str
    settings: Settings
    clock: SkewedClock
    disk: MemoryDisk | None  # None: RocksDB in the data dir
    starts: int = 0
    write_delay: float = 0.0  # seconds each store commit takes (`slow_disk`)
    node: Node | None = None
    scope: trio.CancelScope | None = None
    stopped: trio.Event | None = None
    pipes: list[Pipe] = field(default_factory=list)  # client connections into this process


class SimCluster:
    """The running cluster a scenario gets from `run_cluster`.

    Nodes: `node_ids` ("n0".."n{N-1}"), `node(id)` (None while killed), `alive_nodes()`,
    `running(id)`, `cluster(id)` and `gossip(id)` (a running node's parts), `api(id, ...)`.
    Faults: `kill`, `restart`, `stop`, `cut`/`heal`, `skew`, `slow_disk`; `net` is the
    `MemoryNetwork` itself (`set_link`, `reset`, `down` for finer ones).  Clients:
    `connect` (a `SimClient`; `clients` by id).  Time: `run_for`, `wait_for`,
    `wait_converged` (`convergence_gaps` says what is missing).  `on_event`: every
    `SimEvent` as it happens."""

    def __init__(self, params: ClusterParams, nursery: trio.Nursery) -> None:
        if params.store not in ("memory", "rocks"):
            raise ValueError(f"store must be 'memory' or 'rocks', not {params.store!r}")
        if (params.store == "rocks" or params.trace) and params.data_dir is None:
            raise ValueError("a data_dir is needed for store='rocks' and for traces")
        self.params = params
        self.node_ids = [f"n{i}" for i in range(params.nodes)]
        self.clock = TrioClock()  # virtual time, for the events' timestamps
        self.net = MemoryNetwork(latency=params.latency, jitter=params.jitter, loss=params.loss,
                                 rng=random.Random(f"{params.seed}:network"), clock=self.clock)
        self.clients: dict[str, SimClient] = {}
        self.gone: set[str] = set()  # crashed for good (`crash`)
        self._nursery = nursery
        self._handlers: list[Callable[[SimEvent], None]] = []
        self._machines = {nid: self._machine(nid) for nid in self.node_ids}

    def _machine(self, node_id: str) -> _Machine:
        p = self.params
        # Without a data dir nothing is written to one (memory store, no traces): a path
        # that does not exist makes sure of it.
        data_dir = os.path.join(p.data_dir, node_id) if p.data_dir is not None else f"/nonexistent/meshd-sim/{node_id}"
        flags: dict[str, object] = {
            "node_id": node_id,
            "data_dir": data_dir,
            "mqtt": "off", "ws": "off", "http": "off",
            "gossip": f"{node_id}:{GOSSIP_PORT}",
            # Every other node is a seed, so a node restarted while some are down still finds the rest.
            "seed": [f"{other}:{GOSSIP_PORT}" for other in self.node_ids if other != node_id],
            "mdns": False,
            "trace": p.trace,
            "gossip_preset": p.gossip_preset,
            "sys_interval": 0,
        }
        flags.update(p.settings)
        settings = load_settings(flags, env={})
        return _Machine(node_id, settings, SkewedClock(EPOCH), MemoryDisk() if p.store == "memory" else None)

    # ------------------------------------------------------------------ events

    def on_event(self, handler: Callable[[SimEvent], None]) -> None:
        """Call `handler` with every `SimEvent` from now on."""
        self._handlers.append(handler)

    def emit(self, kind: str, *, node: str | None = None, client: str | None = None, **detail: object) -> None:
        if self._handlers:
            event = SimEvent(self.clock.now(), kind, node, client, detail)
            for handler in self._handlers:
                handler(event)

    # ------------------------------------------------------------------ nodes

    def node(self, node_id: str) -> Node | None:
        """The running node, None while it is killed (or stopped)."""
        return self._machines[node_id].node

    def alive_nodes(self) -> list[str]:
        return [nid for nid in self.node_ids if self._machines[nid].node is not None]

    def running(self, node_id: str) -> Node:
        node = self._machines[node_id].node
        if node is None:
            raise NodeDown(f"{node_id} is not running")
        return node

    def cluster(self, node_id: str) -> Cluster:
        """A running node's routing cluster (route table, links, held traffic, handoffs)."""
        cluster = self.running(node_id).cluster
        assert isinstance(cluster, Cluster)
        return cluster

    def gossip(self, node_id: str) -> GossipService:
        gossip = self.running(node_id).gossip
        assert isinstance(gossip, GossipService)
        return gossip

    async def start(self) -> None:
        """Start every node (in id order; each joins through the others)."""
        for node_id in self.node_ids:
            await self._start(self._machines[node_id])

    async def _start(self, machine: _Machine) -> None:
        if machine.node is not None:
            raise RuntimeError(f"{machine.node_id} is running")
        await self._nursery.start(self._run_node, machine)

    async def _run_node(self, machine: _Machine, *,
                        task_status: trio.TaskStatus[dict[str, int]] = trio.TASK_STATUS_IGNORED) -> None:
        machine.starts += 1
        disk = machine.disk
        open_store: Callable[[Callable[[], None]], SessionStore] | None = None
        if disk is not None:
            def open_store(on_dirty: Callable[[], None]) -> SessionStore:
                return MemoryStore(on_dirty=on_dirty, disk=disk)
        # Each start of each node draws from its own stream of the seed.
        rng = random.Random(f"{self.params.seed}:{machine.node_id}:{machine.starts}")
        transport = self.net.transport(machine.node_id, GOSSIP_PORT)

        async def write_inline(write: Callable[[], None]) -> None:
            # The committer's writes run on the Trio thread: under a MockClock, virtual
            # time would jump ahead while a worker thread writes.  A slow disk takes
            # `write_delay` first (a kill meanwhile loses the write).
            if machine.write_delay:
                await trio.sleep(machine.write_delay)
            write()
            await trio.lowlevel.checkpoint()

        node = build_node(machine.settings, clock=machine.clock, rng=rng, node_id=machine.node_id,
                          transport=transport, open_store=open_store, run_write=write_inline)
        stopped = machine.stopped = trio.Event()
        try:
            with trio.CancelScope() as scope:
                machine.scope = scope
                machine.node = node
                await node.serve(task_status=task_status)
        finally:
            machine.node = None
            machine.scope = None
            machine.pipes.clear()
            stopped.set()

    async def kill(self, node_id: str) -> None:
        """As kill -9: the node's client connections reset, its tasks are cancelled with
        no leave and no last commit, and its store keeps only what was synced (the
        in-memory disk drops unsynced writes; RocksDB is closed as the dead process's
        OS would, keeping what it wrote to its log)."""
        machine = self._machines[node_id]
        node = machine.node
        if node is None:
            return
        self.emit("kill", node=node_id)
        for pipe in machine.pipes:
            pipe.sever()
        transport = self.net.transports.get((node_id, GOSSIP_PORT))
        if isinstance(transport, MemoryTransport):
            transport.close()
        assert machine.scope is not None and machine.stopped is not None
        machine.scope.cancel()
        await machine.stopped.wait()
        if machine.disk is not None:
            machine.disk.lose_unsynced()
        else:
            node.store.close()
        node.trace.close()

    async def crash(self, node_id: str) -> None:
        """A kill -9 of a node that never comes back (the machine is gone): its
        routes, which the others hold for it as for any dead member, no longer count
        for convergence."""
        self.gone.add(node_id)
        await self.kill(node_id)

    def routes_seen(self, node_id: str) -> dict[str, set[str]]:
        """The node's route table without the routes of members gone for good."""
        routes = self.cluster(node_id).table.routes()
        if not self.gone:
            return routes
        kept = {f: n - self.gone for f, n in routes.items()}
        return {f: n for f, n in kept.items() if n}

    async def stop(self, node_id: str) -> None:
        """A graceful stop (SIGTERM): the node leaves the cluster, disconnects its
        clients and commits what is pending."""
        machine = self._machines[node_id]
        node = machine.node
        if node is None:
            return
        self.emit("stop", node=node_id)
        node.request_shutdown()
        assert machine.stopped is not None
        await machine.stopped.wait()

    async def restart(self, node_id: str) -> None:
        """Start a killed or stopped node again: same id, same store, same clock."""
        self.emit("restart", node=node_id)
        await self._start(self._machines[node_id])

    # ------------------------------------------------------------------ faults

    def cut(self, a: Sequence[str], b: Sequence[str], *, one_way: bool = False) -> None:
        """Partition nodes `a` from nodes `b` (one_way: only what goes from a to b is lost)."""
        self.emit("cut", a=sorted(a), b=sorted(b), one_way=one_way)
        self.net.cut(a, b, one_way=one_way)

    def heal(self) -> None:
        self.emit("heal")
        self.net.heal()

    def slow_disk(self, node_id: str, seconds: float) -> None:
        """Every store commit of that node takes `seconds` from now on (0: instant)."""
        self.emit("slow_disk", node=node_id, seconds=seconds)
        self._machines[node_id].write_delay = seconds

    def fail_disk(self, node_id: str, error: OSError | None) -> None:
        """Every store write of that node raises `error` from now on, as a full or
        failing disk does (None: writes work again). The in-memory store only."""
        self.emit("fail_disk", node=node_id, error=None if error is None else str(error))
        disk = self._machines[node_id].disk
        assert disk is not None, "fail_disk needs the in-memory store"
        disk.failure = error

    def skew(self, node_id: str, seconds: float) -> None:
        """That node's wall clock (HLC stamps, session expiry) runs `seconds` off."""
        self.emit("skew", node=node_id, seconds=seconds)
        self._machines[node_id].clock.skew = seconds

    # ------------------------------------------------------------------ time

    async def run_for(self, seconds: float) -> None:
        await trio.sleep(seconds)

    async def wait_for(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        """Wait (virtual time) until `predicate()` holds; SimTimeout naming `what` if it
        does not within `timeout` seconds."""
        deadline = self.clock.now() + timeout
        while not predicate():
            if self.clock.now() >= deadline:
                raise SimTimeout(f"timed out after {timeout} virtual seconds waiting for {what}")
            await trio.sleep(POLL)

    async def wait_converged(self, timeout: float = 30.0) -> None:
        """Every running node sees every running node alive, and every running node's
        route table is the truth: the local filters of the running nodes."""
        await self.wait_for(lambda: not self.convergence_gaps(), timeout,
                            what="convergence")

    def convergence_gaps(self) -> list[str]:
        """What keeps the cluster from being converged (empty when it is)."""
        alive = self.alive_nodes()
        truth: dict[str, set[str]] = {}
        for nid in alive:
            for f in self.cluster(nid).port.local_filters():
                truth.setdefault(f, set()).add(nid)
        gaps = []
        for nid in alive:
            gossip = self.gossip(nid)
            not_alive = [o for o in alive if o != nid and gossip.member_state(o) != "alive"]
            if not_alive:
                gaps.append(f"{nid} does not see {not_alive} alive")
            routes = self.routes_seen(nid)
            if routes != truth:
                gaps.append(f"{nid}'s routes differ: {_route_diff(routes, truth)}")
        return gaps

    # ------------------------------------------------------------------ clients

    async def connect(self, node_id: str, client_id: str, *, clean_start: bool = True, session_expiry: int = 0,
                      protocol: int = 5, keepalive: int = 60, receive_maximum: int | None = None,
                      ack_delay: float = 0.0, will: Will | None = None, resend: bool = False) -> SimClient:
        """A new client connected to `node_id` (see `SimClient.connect`)."""
        client = SimClient(client_id, dial=self._dial, nursery=self._nursery, clock=self.clock, emit=self.emit,
                           protocol=protocol, keepalive=keepalive, ack_delay=ack_delay, resend=resend)
        self.clients[client_id] = client
        return await client.connect(node_id, clean_start=clean_start, session_expiry=session_expiry,
                                    receive_maximum=receive_maximum, will=will)

    def _dial(self, node_id: str, client_id: str) -> Pipe:
        machine = self._machines[node_id]
        node = machine.node
        if node is None:
            raise NodeDown(f"{node_id} is not running")
        pipe = Pipe(self.clock, self.params.client_latency)
        machine.pipes[:] = [p for p in machine.pipes if p.open]
        machine.pipes.append(pipe)
        node.serve_client_stream(pipe.server, f"sim:{client_id}")
        return pipe

    # ------------------------------------------------------------------ the API

    async def api(self, node_id: str, method: str, path: str, body: object = None) -> tuple[int, Any]:
        """Call a node's HTTP API in-process (no listener): (status, JSON body or text)."""
        import json

        request = Request.from_target(method, path, body=b"" if body is None else json.dumps(body).encode())
        response = await self.running(node_id).api.dispatch(request)
        if response.content_type.startswith("application/json"):
            return response.status, json.loads(response.body)
        return response.status, response.body.decode()


def _route_diff(routes: dict[str, set[str]], truth: dict[str, set[str]]) -> str:
    wrong = sorted(f for f in set(routes) | set(truth) if routes.get(f) != truth.get(f))
    return ", ".join(f"{f}: {sorted(routes.get(f, ()))} not {sorted(truth.get(f, ()))}" for f in wrong[:5])


@contextlib.contextmanager
def _deterministic_scheduling(seed: int) -> Iterator[None]:
    """Make Trio's scheduler replay by seed, for this run only.

    Trio shuffles each batch of runnable tasks on purpose, with its module-level
    `random.Random` (`trio._core._run._r`), so that code does not come to rely on an
    order.  With `_ALLOW_DETERMINISTIC_SCHEDULING` (what Trio's Hypothesis plugin
    switches on) the batch is sorted by task creation before the shuffle, and `_r`
    seeded from ours gives the same order on every run: the whole cluster's
    interleaving becomes a function of the seed.  Both are private: restored after
    the run so nothing else in the process is affected."""
    run = trio._core._run
    allowed = run._ALLOW_DETERMINISTIC_SCHEDULING
    state = run._r.getstate()
    setattr(run, "_ALLOW_DETERMINISTIC_SCHEDULING", True)
    run._r.seed(f"trio-scheduler:{seed}")
    try:
        yield
    finally:
        setattr(run, "_ALLOW_DETERMINISTIC_SCHEDULING", allowed)
        run._r.setstate(state)


async def _start_then(cluster: SimCluster, scenario: Callable[[SimCluster], Awaitable[T]]) -> T:
    await cluster.start()
    return await scenario(cluster)


def run_cluster(params: ClusterParams, scenario: Callable[[SimCluster], Awaitable[T]]) -> T:
    """Start the cluster, run `scenario(cluster)` and return its result; every node is
    killed at the end (what is left of the run goes with it).  `trio.run` with
    `MockClock(autojump_threshold=0)` and scheduling seeded from `params.seed`."""

    async def main() -> T:
        async with trio.open_nursery() as nursery:
            cluster = SimCluster(params, nursery)
            await nursery.start(cluster.net.run)
            # Gossip's timers never let the clock stand still: a scenario stuck on
            # something that never comes would run through virtual time forever.
            with trio.move_on_after(params.time_limit) as limit:
                # Captured, not raised here: out of the nursery it would come wrapped
                # in an ExceptionGroup; the caller gets the scenario's own exception.
                result = await outcome.acapture(_start_then, cluster, scenario)
            if limit.cancel_called and isinstance(result, outcome.Error) and isinstance(result.error, trio.Cancelled):
                result = outcome.Error(SimTimeout(f"the scenario ran past its time limit ({params.time_limit} virtual s)"))
            with trio.CancelScope(shield=True):
                for node_id in cluster.node_ids:
                    await cluster.kill(node_id)
            nursery.cancel_scope.cancel()
        # A node's heap freeze (routing.heap) is the process's: a killed node's process
        # takes it along, but these nodes share the caller's, so it is thawed here (else
        # what runs next keeps the nodes' garbage out of every collection).
        gc.unfreeze()
        return result.unwrap()

    with _deterministic_scheduling(params.seed):
        return trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


__all__ = ["ClusterParams", "SimCluster", "SimTimeout", "SkewedClock", "run_cluster", "EPOCH"]
