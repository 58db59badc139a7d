"""Wills travel with a replicated session (issue 29): the owner dies, the client takes
its session over from the replica on another node, and its will is honoured there as
on the owner: sent when its connection was lost with no delay, cancelled by the
reconnect within its delay; a client that does not come back has it sent by its
replica when it is due, once."""

from __future__ import annotations

from mqtt import Properties, Will
from replication.changes import ReplicaCopy
from replication.placement import ranked, replicas_for
from simulation.cluster import SimCluster
from tests.cluster_sim.helpers import sim, wait_route
from tests.cluster_sim.test_replication import EXPIRY, replication, wait_dead


def held(c: SimCluster, client_id: str) -> ReplicaCopy | None:
    """The copy of the session on n1 or n2 (its replica: its owner is n0)."""
    return replication(c, "n1").copies_held.get(client_id) or replication(c, "n2").copies_held.get(client_id)


async def known_everywhere(c: SimCluster, client_id: str) -> None:
    """Until every node knows n0 owns the session and its replica holds a copy: a node
    that never heard of the owner's claim opens a new session, not a takeover."""
    await c.wait_for(lambda: held(c, client_id) is not None
                     and all(c.cluster(n).handoffs.register.get(client_id) is not None for n in c.alive_nodes()),
                     10, f"{client_id}'s claim and copy")


def will(topic: str, payload: bytes, delay: int | None = None) -> Will:
    return Will(topic, payload, 1, False, Properties(will_delay_interval=delay))


def test_a_will_without_delay_is_sent_once_across_the_owners_death_and_the_takeover() -> None:
    async def scenario(c: SimCluster) -> None:
        watcher = await c.connect("n1", "watcher")
        await watcher.subscribe("wills/#", 1)
        await wait_route(c, "wills/#", {"n1"})
        dev = await c.connect("n0", "dev", clean_start=False, session_expiry=EXPIRY, will=will("wills/dev", b"gone"))
        await dev.subscribe("dev/cmd", 1)
        await known_everywhere(c, "dev")
        await c.wait_for(lambda: (copy := held(c, "dev")) is not None and copy.will is not None, 10,
                         "the will on the replica")
        await c.crash("n0")
        await wait_dead(c, "n0")
        # Due at the owner's death: its replica sends it, or the node the client takes
        # the session over on, whichever comes first; once.
        await dev.reconnect("n2", session_expiry=EXPIRY)
        assert dev.session_present
        await c.wait_for(lambda: watcher.payloads("wills/dev") == [b"gone"], 10, "the will")
        await c.run_for(5.0)
        assert watcher.payloads("wills/dev") == [b"gone"]

    sim(scenario, session_replicas=2)


def test_a_delayed_will_is_cancelled_by_the_reconnect_and_sent_by_the_replica_when_its_delay_passed() -> None:
    async def scenario(c: SimCluster) -> None:
        watcher = await c.connect("n1", "watcher")
        await watcher.subscribe("wills/#", 1)
        await wait_route(c, "wills/#", {"n1"})
        # Connected at the owner's death, back within its 30 s delay: the will is cancelled.
        back = await c.connect("n0", "back", clean_start=False, session_expiry=EXPIRY,
                               will=will("wills/back", b"back gone", delay=30))
        # Gone abnormally while its owner lived (the owner holds the will for 10 s), the
        # owner dies before it is due, the client comes back after: it is sent then.
        late = await c.connect("n0", "late", clean_start=False, session_expiry=EXPIRY,
                               will=will("wills/late", b"late gone", delay=10))
        await late.drop()
        started = c.clock.now()
        await c.wait_for(lambda: (copy := held(c, "late")) is not None and copy.will is not None
                         and copy.disconnected_at is not None, 5, "late's pending will on its replica")
        await known_everywhere(c, "back")
        await known_everywhere(c, "late")
        await c.crash("n0")
        await wait_dead(c, "n0")
        await back.reconnect("n2", session_expiry=EXPIRY)
        assert back.session_present
        # Due 10 s after it left, its owner dead: its replica sends it, and the
        # reconnect after does not send it again.
        await c.wait_for(lambda: watcher.payloads("wills/late") == [b"late gone"],
                         max(1.0, started + 15.0 - c.clock.now()), "late's will, from its replica")
        assert c.clock.now() - started >= 10.0
        await late.reconnect("n2", session_expiry=EXPIRY)
        assert late.session_present
        await c.run_for(40.0)  # past back's delay: its will stays cancelled
        assert watcher.payloads("wills/back") == []
        assert watcher.payloads("wills/late") == [b"late gone"]

    sim(scenario, session_replicas=2)


def test_a_client_that_never_comes_back_has_its_will_sent_once_by_the_responsible_replica() -> None:
    """The owner dies and the client never reconnects: the replica that holds the copy
    sends the will when it is due (its delay after the owner's death; a client that had
    left before, at its recorded due time), once, and no other node sends it again;
    a will whose session ends first goes at the session's end."""

    async def scenario(c: SimCluster) -> None:
        watcher = await c.connect("n1", "watcher")
        await watcher.subscribe("wills/#", 1)
        await wait_route(c, "wills/#", {"n1"})
        gone = await c.connect("n0", "gone", clean_start=False, session_expiry=EXPIRY,
                               will=will("wills/gone", b"gone for good", delay=5))
        short = await c.connect("n0", "short", clean_start=False, session_expiry=3,
                                will=will("wills/short", b"short session", delay=60))
        await known_everywhere(c, "gone")
        await known_everywhere(c, "short")
        await c.wait_for(lambda: all((copy := held(c, cid)) is not None and copy.will is not None
                                     for cid in ("gone", "short")), 10, "the wills on the replicas")
        assert gone.connected and short.connected
        await c.crash("n0")
        killed = c.clock.now()
        await wait_dead(c, "n0")
        await c.wait_for(lambda: watcher.payloads("wills/short") == [b"short session"], 15,
                         "short's will, at its session's end")
        assert watcher.payloads("wills/gone") == []  # its 5 s delay has not passed
        await c.wait_for(lambda: watcher.payloads("wills/gone") == [b"gone for good"], 20, "gone's will")
        assert c.clock.now() - killed >= 5.0
        await c.run_for(30.0)
        assert watcher.payloads("wills/gone") == [b"gone for good"]
        assert watcher.payloads("wills/short") == [b"short session"]
        assert held(c, "gone") is not None and held(c, "gone").will is None  # sent: no takeover sends it again

    sim(scenario, session_replicas=2)


def test_with_two_replicas_the_first_in_rendezvous_order_sends_the_will_and_no_one_again() -> None:
    """Three copies: both replicas hold the will when the owner dies; the one first in
    the session's rendezvous order sends it, the other's copy loses it; the sender dies
    too, and the will is not sent again."""

    async def scenario(c: SimCluster) -> None:
        nodes = ["n0", "n1", "n2", "n3"]
        holders = replicas_for("twice", "n0", nodes, 3)
        elsewhere = next(n for n in nodes if n not in holders and n != "n0")
        watcher = await c.connect(elsewhere, "watcher")
        await watcher.subscribe("wills/#", 1)
        await wait_route(c, "wills/#", {elsewhere})
        dev = await c.connect("n0", "twice", clean_start=False, session_expiry=EXPIRY, will=will("wills/twice", b"once"))
        await c.wait_for(lambda: all((copy := replication(c, n).copies_held.get("twice")) is not None
                                     and copy.will is not None for n in holders), 10, "the will on both replicas")
        assert dev.connected
        await c.crash("n0")
        await wait_dead(c, "n0")
        await c.wait_for(lambda: watcher.payloads("wills/twice") == [b"once"], 10, "the will")
        sender = ranked("twice", holders)[0]
        assert [n for n in holders if replication(c, n).stats.orphan_wills] == [sender]
        await c.wait_for(lambda: all(replication(c, n).copies_held["twice"].will is None for n in holders), 10,
                         "no copy keeps the will")
        await c.crash(sender)
        await wait_dead(c, sender)
        await c.run_for(10.0)
        assert watcher.payloads("wills/twice") == [b"once"]

    sim(scenario, nodes=4, session_replicas=3)


def test_the_old_owner_back_from_the_dead_does_not_send_the_will_again() -> None:
    """Two wills with a 2 s delay: one the replica sent (its client never came back),
    one the reconnect to the node that took the session over cancelled.  The old
    owner restarts with both in its store and sends neither."""

    async def scenario(c: SimCluster) -> None:
        watcher = await c.connect("n1", "watcher")
        await watcher.subscribe("wills/#", 1)
        await wait_route(c, "wills/#", {"n1"})
        away = await c.connect("n0", "away", clean_start=False, session_expiry=EXPIRY,
                               will=will("wills/away", b"away", delay=2))
        moved = await c.connect("n0", "moved", clean_start=False, session_expiry=EXPIRY,
                                will=will("wills/moved", b"moved", delay=2))
        await known_everywhere(c, "away")
        await known_everywhere(c, "moved")
        await c.wait_for(lambda: all((copy := held(c, cid)) is not None and copy.will is not None
                                     for cid in ("away", "moved")), 10, "the wills on the replicas")
        assert away.connected and moved.connected
        await c.crash("n0")
        await wait_dead(c, "n0")
        await moved.reconnect("n2", session_expiry=EXPIRY)
        assert moved.session_present
        await c.wait_for(lambda: watcher.payloads("wills/away") == [b"away"], 10, "away's will")
        await c.restart("n0")
        await c.wait_converged(timeout=60)
        await c.run_for(30.0)
        assert watcher.payloads("wills/away") == [b"away"]
        assert watcher.payloads("wills/moved") == []
        assert moved.connected

    sim(scenario, session_replicas=2)


def test_a_replica_restarted_after_sending_the_will_still_tells_the_returning_owner() -> None:
    """The replica sends the will of a client that never came back, then restarts
    itself; the old owner comes back after that with the will in its store.  The
    replica kept on disk that it sent the will (its copy's mark), tells the owner when it
    sees it, and the will goes once."""

    async def scenario(c: SimCluster) -> None:
        replica = replicas_for("lost", "n0", c.node_ids, 2)[0]
        elsewhere = next(n for n in c.node_ids if n not in ("n0", replica))
        watcher = await c.connect(elsewhere, "watcher")
        await watcher.subscribe("wills/#", 1)
        await wait_route(c, "wills/#", {elsewhere})
        lost = await c.connect("n0", "lost", clean_start=False, session_expiry=EXPIRY, will=will("wills/lost", b"lost"))
        await known_everywhere(c, "lost")
        await c.wait_for(lambda: (copy := replication(c, replica).copies_held.get("lost")) is not None
                         and copy.will is not None, 10, "the will on the replica")
        assert lost.connected
        await c.kill("n0")
        await wait_dead(c, "n0")
        await c.wait_for(lambda: watcher.payloads("wills/lost") == [b"lost"], 10, "the will, from the replica")
        store = c.running(replica).store
        written = store.write_epoch
        await c.wait_for(lambda: store.local_durable_epoch >= written, 10, "the replica's mark on its disk")
        await c.kill(replica)
        await c.restart(replica)
        await c.wait_for(lambda: replica in c.alive_nodes() and "lost" in replication(c, replica).copies_held, 10,
                         "the replica back with its copy")
        await c.restart("n0")
        await c.wait_converged(timeout=60)
        await c.run_for(30.0)  # well past the 5 s the owner holds a restored will
        assert watcher.payloads("wills/lost") == [b"lost"]
        copy = replication(c, replica).copies_held.get("lost")
        assert copy is None or not copy.will_sent  # told: the mark is gone

    sim(scenario, session_replicas=2)


def test_the_owner_back_while_the_replica_that_sent_the_will_is_down_does_not_send_it_again() -> None:
    """The replica sends the will of a client that never came back and tells the other
    members; it is down when the old owner comes back with the will in its store.  A
    member it told says so to the owner instead, within the 5 s the owner holds a
    restored will, and the will goes once."""

    async def scenario(c: SimCluster) -> None:
        replica = replicas_for("gone", "n0", c.node_ids, 2)[0]
        elsewhere = next(n for n in c.node_ids if n not in ("n0", replica))
        watcher = await c.connect(elsewhere, "watcher")
        await watcher.subscribe("wills/#", 1)
        await wait_route(c, "wills/#", {elsewhere})
        gone = await c.connect("n0", "gone", clean_start=False, session_expiry=EXPIRY, will=will("wills/gone", b"gone"))
        await c.wait_for(lambda: (copy := replication(c, replica).copies_held.get("gone")) is not None
                         and copy.will is not None, 10, "the will on the replica")
        assert gone.connected
        await c.kill("n0")
        await wait_dead(c, "n0")
        await c.wait_for(lambda: watcher.payloads("wills/gone") == [b"gone"], 10, "the will, from the replica")
        await c.run_for(2.0)  # the other members told
        await c.kill(replica)
        await c.wait_for(lambda: replica not in c.gossip(elsewhere).alive_members(), 30, "the replica seen dead")
        await c.restart("n0")
        await c.wait_for(lambda: "n0" in c.gossip(elsewhere).alive_members(), 30, "n0 back")
        await c.run_for(30.0)  # well past the 5 s the owner holds a restored will
        assert watcher.payloads("wills/gone") == [b"gone"]

    sim(scenario, session_replicas=2, nodes=4)


def test_a_replica_cut_off_on_the_minority_side_of_a_netsplit_does_not_send_the_will() -> None:
    """The replica alone on one side, the owner with its connected client and the third
    node on the other: the replica sees the owner dead, but its side does not hold the
    majority (the client may well be connected on the other side, as it is here), so it
    sends no will, during the split or after the heal."""

    async def scenario(c: SimCluster) -> None:
        replica = replicas_for("split", "n0", c.node_ids, 2)[0]
        other = next(n for n in c.node_ids if n not in ("n0", replica))
        watchers = []
        for n in (replica, other):
            w = await c.connect(n, f"watcher-{n}")
            await w.subscribe("wills/#", 1)
            watchers.append(w)
        await wait_route(c, "wills/#", {replica, other})
        dev = await c.connect("n0", "split", clean_start=False, session_expiry=EXPIRY, will=will("wills/split", b"false"))
        await known_everywhere(c, "split")
        await c.wait_for(lambda: (copy := replication(c, replica).copies_held.get("split")) is not None
                         and copy.will is not None, 10, "the will on the replica")
        c.cut([replica], ["n0", other])
        view = c.running(replica).partitions
        await c.wait_for(lambda: "n0" not in c.gossip(replica).alive_members() and view.in_minority(), 60,
                         "the replica sees the owner dead, itself on the minority side")
        await c.run_for(30.0)
        assert replication(c, replica).stats.orphan_wills == 0
        c.heal()
        await c.wait_converged(timeout=120)
        await c.run_for(10.0)
        assert dev.connected
        assert [w.payloads("wills/split") for w in watchers] == [[], []]
        assert replication(c, replica).copies_held["split"].will is not None  # still there, for a real death

    sim(scenario, session_replicas=2)
