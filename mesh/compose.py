"""The composition root: one function that builds a whole node, part by part, in
dependency order. Read top to bottom, it is the node: every part gets its
collaborators here, at construction, and nothing is wired in afterwards.

    clock, rng             time and randomness, injected into everything below
    node id, security      who we are; who may connect and do what (and node-to-node TLS)
    store                  sessions on disk, recovered; this start's route epoch
    delayed messages       `$delayed/...` publishes kept in the store until due
    trace                  the event trace (`meshd report`), when enabled
    partition view         netsplit verdicts: read by security and fed by the monitor
    gossip                 SWIM membership, broadcasts and push-pull
    partition monitor      turns membership changes into partition events
    hooks                  the chains at each point of a client's and a message's life
    mesh port              the route table and links, shared by broker and cluster
    queries, streams       cluster queries; durable streams (appends, replays, retention)
    broker                 sessions, subscriptions, retained messages, wills
    bridges                MQTT and HTTP targets behind durable cache queues (egress at message.publish)
    delayed runner         publishes delayed messages through the broker when due
    plugins, rules         callbacks on the hooks: this node's plugins, the rule engine
    replication            copies of persistent sessions on other members; takeover from them
    cluster                routes and forwards between nodes, handoffs, held traffic
    config sync            cluster-wide settings over gossip
    $SYS publisher         the broker's numbers as retained topics
    inventory              clients and subscriptions cluster-wide: each member answers for its own
    API                    HTTP JSON API and /metrics
    Node                   the listeners and the tasks that run all of the above

The drivers' wake-ups go the same way: a `Doorbell` is made before the core that
rings it (the store's commits, the broker's timers) and handed to the Node that waits.
"""

from __future__ import annotations

import os
import random
from typing import Callable, Mapping, TypeVar

from clock import Clock, TrioClock
from delayed.service import DelayedMessages, DelayedRunner
from bridges.actions import bridge_factory, webhook_factory
from gossip.config import preset as gossip_preset
from gossip.service import GossipService
from gossip.trace import NullTraceWriter, TraceWriter
from gossip.transport import StreamTls, Transport
from hooks import Hooks
from mesh.api import build_router
from mesh.bridging import add_bridge_metrics, bridge_configs, bridge_routes, build_bridges, configure_families
from mesh.broker import Broker, BrokerLimits
from mesh.config import ConfigError, Settings, resolve_node_id
from mesh.config_sync import ConfigSync
from mesh.delayed_ops import delayed_answers, delayed_metrics, delayed_routes
from mesh.doorbell import Doorbell
from mesh.extensions import add_extension_metrics, build_rule_engine, load_node_plugins
from mesh.extensions_api import plugin_routes, rule_routes
from mesh.inventory import Inventory
from mesh.node import Node, WriteRunner
from mesh.node_metrics import node_metrics
from mesh.node_stats import NodeStats, RateHistory
from mesh.replication_ops import replication_metrics
from mesh.security import Security
from mesh.sys_topics import SysPublisher
from mesh.tls import TlsConfigError, cluster_contexts
from netsplit.detector import detector_for
from netsplit.monitor import PartitionMonitor
from netsplit.view import PartitionView
from routing.cluster import Cluster
from routing.port import MeshPort
from routing.queries import MeshQueries
from replication.service import RESTORED_WILL_GRACE, Replication
from routing.table import RouteTable
from session_store.rocks import RocksStore, StoreOpenError
from session_store.store import SessionStore
from streams.service import StreamService
from streams.spec import parse_specs

T = TypeVar("T")

# Opens the node's session store, given the doorbell the store rings when it has work.
StoreOpener = Callable[[Callable[[], None]], SessionStore]


def build_node(settings: Settings, *, clock: Clock | None = None, rng: random.Random | None = None,
               node_id: str | None = None, transport: Transport | None = None,
               open_store: StoreOpener | None = None, run_write: WriteRunner | None = None) -> Node:
    """A node for `settings`, ready to `serve()`. `clock` defaults to Trio's (pass a
    `TrioClock(wall_epoch=...)` under a MockClock to drive the whole node in virtual
    time); `rng` to an unseeded `random.Random` (seed it to replay random choices).
    The cluster simulator (`simulation.cluster`) also passes the gossip `transport` (an
    in-memory network instead of UDP and TCP), `open_store` (a store on a simulated disk
    instead of RocksDB in `data_dir`) and `run_write` (how the committer runs a blocking
    write: inline, since virtual time would jump while a worker thread writes).
    Raises ConfigError for settings that cannot work (an unreadable file, a locked
    data directory)."""
    clock = clock if clock is not None else TrioClock()
    rng = rng if rng is not None else random.Random()
    node_id = node_id or resolve_node_id(settings)
    bridge_tables = bridge_configs(settings)  # refused (naming the key) before anything is opened

    # Lost members are retried for reconnect_dead_for; partitions are judged from the
    # same gossip settings.
    gossip_config = gossip_preset(settings.gossip_preset).with_(reconnect_dead_for=settings.reconnect_dead_for)
    partition_view = PartitionView(detector_for(node_id, gossip_config), clock=clock)
    # Plugins, the password file and ACL, the rule engine and the bridges add their
    # callbacks to these chains.
    hooks = Hooks()
    security = Security(settings, clock=clock, in_minority=partition_view.in_minority, hooks=hooks)
    stream_tls = cluster_stream_tls(settings)

    store_dirty = Doorbell()
    store = open_store(store_dirty.ring) if open_store is not None else _open_rocks(settings, store_dirty.ring)
    recovered = store.load()
    # Every start is a new route epoch, so peers never mistake fresh route versions
    # for old news (routing.table).
    route_epoch = int(recovered.meta.get("route_epoch", 0)) + 1
    store.put_meta("route_epoch", route_epoch)
    started_at = clock.wall()
    delayed_changed = Doorbell()
    delayed = DelayedMessages(store=store, clock=clock, node_id=node_id, max_delay=settings.delayed_max_delay,
                              on_change=delayed_changed.ring)

    trace: TraceWriter | NullTraceWriter = (
        TraceWriter(os.path.join(settings.data_dir, "traces"), node_id) if settings.trace else NullTraceWriter()
    )
    gossip = GossipService(
        node_id=node_id,
        bind_host=settings.gossip.host,
        bind_port=settings.gossip.port,
        seeds=[(a.host, a.port) for a in settings.seed],
        cluster_name=settings.cluster_name,
        cluster_key=settings.cluster_key,
        mdns=settings.mdns,
        mdns_port=settings.mdns_port,
        trace=trace,
        config=gossip_config,
        advertise_host=settings.gossip_advertise,
        clock=clock,
        rng=_child(rng),
        transport=transport,
        stream_tls=stream_tls,
    )
    partitions = PartitionMonitor(partition_view, gossip, trace, clock=clock)

    # The broker and the cluster share the mesh port (route answers, forwards, route
    # changes), so neither is wired into the other.
    mesh = MeshPort(RouteTable(node_id, route_epoch), gossip)
    # Cluster queries: each member answers for its own sessions (the inventory) and
    # serves its part of the streams.
    queries = MeshQueries(node_id=node_id, cluster_name=settings.cluster_name, gossip=gossip)
    # Durable streams: the broker appends to them; reads run off the Trio thread
    # (inline where the committer's writes do: virtual time must not jump meanwhile).
    streams = StreamService(node_id=node_id, clock=clock, store=store, specs=parse_specs(settings.streams),
                            recovered_meta=recovered.meta, queries=queries, members=gossip, routes=mesh.table,
                            offload=_inline if run_write is not None else None)
    timers_changed = Doorbell()
    broker = Broker(BrokerLimits.from_settings(settings), node_id=node_id, store=store, clock=clock, mesh=mesh,
                    on_timer_change=timers_changed.ring, rng=_child(rng), hooks=hooks, delayed=delayed, streams=streams)
    broker.restore(recovered, started_at, will_grace=RESTORED_WILL_GRACE if settings.session_replicas > 1 else 0.0)
    bridges = build_bridges(settings, bridge_tables, node_id=node_id, clock=clock, rng=_child(rng), broker=broker,
                            hooks=hooks, in_memory=open_store is not None, run_write=run_write)
    # Plugins (this node's `plugins`) and the rule engine with this node's `[[rules]]`.
    plugins = load_node_plugins(settings.plugins, hooks, node_id)
    # The bridges give the rules their webhook and bridge actions (through their queues).
    rules = build_rule_engine(settings.rules, node_id=node_id, clock=clock, hooks=hooks, broker=broker,
                              connections=broker,
                              more_actions={"webhook": webhook_factory(bridges), "bridge": bridge_factory(bridges)})
    # Persistent sessions copied to other members (the store tells it every change;
    # the cluster's handoff driver takes a session from it when its owner is gone).
    replication = Replication(node_id=node_id, copies=settings.session_replicas, mode=settings.session_replication,
                              store=store, broker=broker, queries=queries, members=gossip, clock=clock,
                              recovered_meta=recovered.meta, recovered_replica=recovered.replica,
                              bandwidth=settings.replication_bandwidth,
                              recovered_wills={cid: s.will for cid, s in recovered.sessions.items() if s.will is not None},
                              sides=partition_view)
    cluster = Cluster(
        node_id=node_id, port=mesh, broker=broker, store=store, gossip=gossip, trace=trace,
        cluster_name=settings.cluster_name, clock=clock, rng=_child(rng),
        hold_period=settings.netsplit_hold, held_max_messages=settings.held_max_messages,
        held_max_age=settings.held_max_age, recovered_meta=recovered.meta, replicas=replication,
    )
    # Rules and bridges see a delayed message when it is published (message.publish).
    delayed_runner = DelayedRunner(messages=delayed, publisher=broker, clock=clock, doorbell=delayed_changed,
                                   hooks=hooks, routes_known=lambda: _routes_known(gossip.alive_members(), mesh.table.remote,
                                                                      seeded=bool(settings.seed)))
    # Config sync lives through its gossip handlers; the API reads and changes it.
    config_sync = ConfigSync(node_id=node_id, clock=clock, broker=broker, gossip=gossip, store=store, trace=trace,
                             recovered_meta=recovered.meta, security=security,
                             families={**configure_families(bridges), "rule": rules.apply_cluster}, streams=streams,
                             replication=replication)

    def uptime() -> float:
        return clock.wall() - started_at

    sys = SysPublisher(broker=broker, clock=clock, interval=settings.sys_interval, uptime=uptime,
                       gossip=gossip, cluster=cluster, partitions=partitions, hooks=hooks)
    ports: dict[str, int] = {}  # filled in by Node.serve as each listener binds
    metrics = node_metrics(broker=broker, store=store, gossip=gossip, partitions=partitions, cluster=cluster,
                           security=security, uptime=uptime, streams=streams)
    add_bridge_metrics(metrics, bridges)
    delayed_metrics(metrics, delayed)
    replication_metrics(metrics, replication)
    add_extension_metrics(metrics, hooks=hooks, plugins=plugins, rules=rules)
    # Cluster-wide clients and subscriptions: each member answers for its own sessions.
    inventory = Inventory(node_id=node_id, broker=broker, gossip=gossip, queries=queries, clock=clock,
                          extra_answers=delayed_answers(delayed), session_extra=replication.describe)
    history = RateHistory(broker=broker, store=store, clock=clock)  # the dashboard's last ten minutes
    api = build_router(node_id=node_id, settings=settings, ports=ports, uptime=uptime, security=security,
                       broker=broker, gossip=gossip, partitions=partitions, cluster=cluster,
                       config_sync=config_sync, metrics=metrics, inventory=inventory,
                       node_stats=NodeStats(broker=broker, store=store, history=history,
                                            store_dir=os.path.join(settings.data_dir, "sessions")),
                       extra_routes=[*bridge_routes(bridges, config_sync), *delayed_routes(inventory),
                                     *rule_routes(node_id=node_id, rules=rules, config_sync=config_sync),
                                     *plugin_routes(node_id=node_id, plugins=plugins, hooks=hooks)],
                       streams=streams)

    return Node(
        settings=settings, node_id=node_id, clock=clock, started_at=started_at, security=security,
        store=store, store_dirty=store_dirty, trace=trace, gossip=gossip, partitions=partitions,
        broker=broker, timers_changed=timers_changed, cluster=cluster, sys=sys,
        ports=ports, api=api, run_write=run_write,
        services=(bridges, history, delayed_runner, rules, streams, replication),
    )


def _routes_known(peers: list[str], remote_routes: Mapping[str, object], *, seeded: bool) -> bool:
    """Whether this node knows the routes of every member it sees (a restarted node
    starts with none): delayed messages that fell due while it was down wait for it."""
    if not peers:
        return not seeded
    return all(peer in remote_routes for peer in peers)


def _open_rocks(settings: Settings, on_dirty: Callable[[], None]) -> SessionStore:
    try:
        return RocksStore(os.path.join(settings.data_dir, "sessions"), on_dirty=on_dirty)
    except StoreOpenError as exc:
        raise ConfigError("data_dir", str(exc)) from None


CLUSTER_TLS_SETTINGS = ("cluster_tls_cert", "cluster_tls_key", "cluster_tls_ca")


def cluster_stream_tls(settings: Settings) -> StreamTls | None:
    """TLS for node-to-node streams when all three `cluster_tls_*` settings are given;
    None when none is. Refused (ConfigError naming the key) when only some are, or a
    file cannot be used."""
    given = {name: getattr(settings, name) for name in CLUSTER_TLS_SETTINGS}
    if not any(given.values()):
        return None
    missing = [name for name, value in given.items() if not value]
    if missing:
        raise ConfigError(missing[0], "node-to-node TLS needs all of " + ", ".join(CLUSTER_TLS_SETTINGS)
                          + f"; {missing[0]} is not set")
    try:
        server, client = cluster_contexts(given["cluster_tls_cert"], given["cluster_tls_key"], given["cluster_tls_ca"])
    except TlsConfigError as exc:
        message = str(exc)
        key = message.split(" ", 1)[0] if message.startswith("cluster_tls_") else "cluster_tls_cert"
        raise ConfigError(key, message) from None
    return StreamTls(server=server, client=client)


async def _inline(fn: Callable[[], T]) -> T:
    return fn()


def _child(rng: random.Random) -> random.Random:
    """An independent stream for one part: adding a part, or a draw in one, does not
    shift the choices of the others."""
    return random.Random(rng.getrandbits(64))
