"""A held message that went in a batch its member never acknowledged keeps that mark in
the store: replayed after this node restarted, it still goes with the resend mark, so a
member that restarted too and holds it does not take it again (`LinkItem.sent`)."""

from __future__ import annotations

from clock import ManualClock
from gossip.trace import NullTraceWriter
from mesh.broker import Broker
from mqtt import EMPTY_PROPERTIES
from routing.batch import LinkItem
from routing.cluster import Cluster
from routing.port import MeshPort
from routing.table import RouteTable
from session_store.model import Message
from session_store.store import MemoryDisk, MemoryStore
from tests.routing.test_cluster_gone_routes import Gossip, RecordingCluster


def node_a(disk: MemoryDisk) -> tuple[Cluster, Gossip, MemoryStore]:
    gossip = Gossip()
    port = MeshPort(RouteTable("A", 1), gossip)
    store = MemoryStore(disk=disk)
    meta = store.load().meta
    broker = Broker(node_id="A", store=store, mesh=port)
    cluster = RecordingCluster(node_id="A", port=port, broker=broker, store=store, gossip=gossip,
                               trace=NullTraceWriter(), cluster_name="t", clock=ManualClock(), recovered_meta=meta)
    cluster.pulls = []
    cluster.asked = []
    return cluster, gossip, store


def commit(store: MemoryStore) -> None:
    batch, epoch = store.take_batch()
    store.write_batch(batch, sync=True)
    store.mark_durable(epoch)


def held_item(i: int, *, sent: bool) -> LinkItem:
    item = LinkItem(Message("split/x", b"m", 1, False, EMPTY_PROPERTIES, None, "p", i, "A"), also=("B",))
    item.sent = sent
    return item


def test_the_sent_before_mark_of_held_messages_survives_a_restart() -> None:
    disk = MemoryDisk()
    cluster, gossip, store = node_a(disk)
    b = RouteTable("B", 7)
    delta = b.local_changes([("split/#", True)])
    assert delta is not None
    gossip.set("B", "alive")
    gossip.broadcasts["route"]("B", [delta.to_wire(), 1])
    gossip.set("B", "dead")  # B's routes are held, and what its link never got acknowledged
    cluster._hold_failed("B", [held_item(1, sent=True), held_item(2, sent=False)])
    assert cluster.held.counts() == {"B": 2}
    commit(store)

    restarted, _, _ = node_a(disk)  # this node restarts before B comes back
    assert restarted.held.counts() == {"B": 2}
    seqs = {msg.msg_id: seq for seq, msg, _ in restarted.held.take_with_also("B")}
    assert ("B", seqs[1]) in restarted._held_sent and ("B", seqs[2]) not in restarted._held_sent
