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
from routing.links import OutboundLink
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


def test_a_qos0_message_queued_as_itself_is_never_held_nor_owed() -> None:
    # QoS 0 forwards to plain subscribers are queued as the message itself
    # (`routing.batch.Queued`): a dead member's link hands them back with the rest, and
    # only the QoS >= 1 items among them are held for it or owed to a takeover.
    cluster, gossip, _ = node_a(MemoryDisk())
    b = RouteTable("B", 7)
    delta = b.local_changes([("split/#", True)])
    assert delta is not None
    gossip.set("B", "alive")
    gossip.broadcasts["route"]("B", [delta.to_wire(), 1])
    link = OutboundLink("B", gossip, "A", "1.1", "t", lambda items: None)
    qos0 = Message("split/x", b"m", 0, False, EMPTY_PROPERTIES, None, "p", 1, "A")
    qos1 = held_item(2, sent=False)
    assert link.enqueue(qos0) and link.enqueue(qos1) and link.sent_queued == 0
    cluster.links["B"] = link
    assert cluster.held_messages("B") == [qos1.message]
    link.unacked[1] = link._take_batch()  # sent, not acknowledged
    link.enqueue(Message("split/y", b"n", 0, False, EMPTY_PROPERTIES, None, "p", 3, "A"))
    gossip.set("B", "dead")  # its link fails everything it had (`OutboundLink.fail_all`)
    assert "B" not in cluster.links and not link.queue and not link.unacked and qos1.sent
    assert cluster.held.counts() == {"B": 1}
    assert [msg.msg_id for _, msg, _ in cluster.held.take_with_also("B")] == [2]
