"""The mesh port the broker and the cluster share: route changes made before the
cluster exists (a restore) reach the cluster's first delta, a local publish is
forwarded through the handler the cluster registered, and the cluster's held traffic
is stamped by the clock it was given."""

from __future__ import annotations

from typing import Any, Callable

from clock import ManualClock
from gossip.trace import NullTraceWriter
from mesh.broker import Broker
from mqtt import EMPTY_PROPERTIES, Subscription
from routing.cluster import Cluster
from routing.forward import ForwardTarget
from routing.links import AckGate
from routing.port import MeshPort
from routing.table import RouteTable
from routing.wire import RouteBroadcast
from session_store.model import Message, Session
from session_store.store import MemoryStore


class Gossip:
    def __init__(self) -> None:
        self.alive: list[str] = []
        self.broadcasts: list[tuple[str, str, object]] = []
        self.handlers: dict[str, Callable[[str, Any], None]] = {}
        self.member_handlers: list[Callable[[str, str], None]] = []

    def alive_members(self) -> list[str]:
        return list(self.alive)

    def has_peers(self) -> bool:
        return bool(self.alive)

    def member_state(self, member: str) -> str | None:
        return "alive" if member in self.alive else None

    def broadcast(self, kind: str, key: str, payload: object) -> None:
        self.broadcasts.append((kind, key, payload))

    def on_broadcast(self, kind: str, handler: Callable[[str, Any], None]) -> None:
        self.handlers[kind] = handler

    def on_member_change(self, handler: Callable[[str, str], None]) -> None:
        self.member_handlers.append(handler)

    def register_push_pull(self, name: str, get: Callable[..., Any], merge: Callable[..., Any]) -> None:
        pass

    def register_stream_handler(self, frame_type: str, handler: Any) -> None:
        pass


def test_route_changes_from_a_restore_reach_the_clusters_first_delta() -> None:
    gossip = Gossip()
    port = MeshPort(RouteTable("A", 4), gossip)
    store = MemoryStore()
    broker = Broker(node_id="A", store=store, mesh=port)
    session = broker.sessions["c"] = Session("c", False)
    broker.subscribe(session, Subscription("a/+", 1), None, 0.0)  # before the cluster exists
    cluster = Cluster(node_id="A", port=port, broker=broker, store=store, gossip=gossip, trace=NullTraceWriter(),
                      cluster_name="t", clock=ManualClock())
    cluster.flush_routes_now()
    ((kind, _, payload),) = gossip.broadcasts
    delta = RouteBroadcast.from_wire(payload).delta
    assert kind == "route" and delta.origin == "A" and delta.epoch == 4 and delta.changes == (("a/+", True),)
    cluster.flush_routes_now()  # the queue was taken
    assert len(gossip.broadcasts) == 1


def test_a_publish_is_forwarded_through_the_registered_handler() -> None:
    gossip = Gossip()
    table = RouteTable("A", 1)
    port = MeshPort(table, gossip)
    forwards: list[tuple[str, dict[str, ForwardTarget], AckGate | None]] = []

    def forward(msg: Message, targets: dict[str, ForwardTarget], gate: AckGate | None) -> int:
        forwards.append((msg.topic, targets, gate))
        return 0

    port.on_forward(forward)
    peer = RouteTable("B", 1)
    delta = peer.local_changes([("a/#", True)])
    assert delta is not None
    table.apply_delta(delta)
    gossip.alive = ["B", "C"]
    broker = Broker(node_id="A", mesh=port)
    gate = AckGate()
    msg = Message("a/1", b"x", 1, True, EMPTY_PROPERTIES, None, "pub", 1, "A")
    assert broker.publish(msg, 0.0, gate=gate) == 2  # no session here; two nodes
    ((topic, targets, given),) = forwards
    assert topic == "a/1" and given is gate
    assert targets == {"B": ForwardTarget(True, (), True), "C": ForwardTarget(False, (), True)}


def test_held_routes_are_stamped_by_the_clusters_clock() -> None:
    gossip = Gossip()
    port = MeshPort(RouteTable("A", 1), gossip)
    store = MemoryStore()
    clock = ManualClock(start=5.0, wall_epoch=1_000.0)
    cluster = Cluster(node_id="A", port=port, broker=Broker(node_id="A", store=store, mesh=port), store=store,
                      gossip=gossip, trace=NullTraceWriter(), cluster_name="t", clock=clock)
    peer = RouteTable("B", 1)
    delta = peer.local_changes([("a/#", True)])
    assert delta is not None
    gossip.handlers["route"]("B", RouteBroadcast(delta, 1).to_wire())
    for handler in gossip.member_handlers:
        handler("B", "dead")
    assert cluster.held.members["B"].since == 1_005.0
    assert store.has_pending()  # the held routes are written for a restart
