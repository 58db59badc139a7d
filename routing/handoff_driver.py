"""The Trio driver of session handoff and of the ownership register.

Runs `session_store.handoff` over the mesh links (`MeshRequests`, which the cluster
answers) and `session_store.ownership` over gossip (`own` broadcasts, `owners`
push-pull).  The connection calls `prepare_connect` (through `routing.port.MeshPort`)
before it opens a session; the cluster hands the `ho_*` requests of peers to `answer`.
It reaches the broker only through `SessionHost` and reads the time only from its
`clock.Clock` (`now()` for takeover budgets, `wall()` for claims and traces).

Every step has a timeout (`STEP_TIMEOUT`) and the whole takeover a budget
(`TAKEOVER_BUDGET`, below the CONNECT timeout), so a client never hangs on a dead or
partitioned owner: the taker goes on with the newest copy it has (none: a new session,
CONNACK session present = 0), counts a conflict and traces it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Mapping, Protocol

import trio

import faults
from clock import Clock
from clock.hlc import HlcTimestamp
from oplog import Event, log_event
from routing.links import Fields, Frame, Reply
from session_store.handoff import (
    Ask, Finished, Giving, HandoffError, Install, MergeTail, Redirect, Refused, Step, Takeover,
    delivery_from_wire, image_of, merge_stale, merge_tail, message_key, queue_chunk, stored_from_image,
)
from session_store.model import Delivery, Session
from session_store.ownership import Claim, OwnershipRegister
from session_store.store import StoredSession

from gossip.trace import Tracer

log = logging.getLogger("meshd.handoff")

STEP_TIMEOUT = 2.0
TAKEOVER_BUDGET = 5.0
FENCE_TIMEOUT = 1.0  # a member that cannot answer in time is most likely unreachable: its copies cannot race us
GIVE_TIMEOUT = 15.0  # a giver that hears nothing more keeps serving its copy
MOVED_MEMORY = 60.0  # how long a giver remembers where a session went
MAX_REDIRECTS = 3
HOUSEKEEPING_INTERVAL = 2.0
REMEMBER_FOR = 24 * 3600.0  # how long a session started in a conflict remembers what it got
PUSH_GRACE_MS = 2000  # a copy held for another owner waits this long for a takeover first


class ClaimGossip(Protocol):
    """What the ownership register needs of gossip: its `own` broadcasts, the `owners`
    push-pull state, and who is reachable."""

    def broadcast(self, kind: str, key: str, payload: object) -> None: ...

    def on_broadcast(self, kind: str, handler: Callable[[str, object], None]) -> None: ...

    def register_push_pull(self, name: str, get_local: Callable[[], object],
                           merge_remote: Callable[[object], None]) -> None: ...

    def alive_members(self) -> list[str]: ...

    def has_peers(self) -> bool: ...


class SessionHost(Protocol):
    """What the handoff driver reads and changes in this node's broker."""

    @property
    def sessions(self) -> dict[str, Session]: ...

    @property
    def connections(self) -> Mapping[str, object]: ...

    @property
    def remembered(self) -> dict[str, set[tuple[str | None, int]]]: ...

    def detach_for_handoff(self, client_id: str, now: float) -> Session | None: ...

    def discard_session(self, client_id: str, now: float) -> None: ...

    def install_session(self, stored: StoredSession, now: float) -> Session: ...

    def merge_handed_tail(self, session: Session, add: list[Delivery], drop: list[Delivery]) -> None: ...

    def merge_session(self, stored: StoredSession, now: float) -> int: ...


class MeshRequests(Protocol):
    """What the handoff driver asks of the cluster: requests over the mesh links, route
    snapshots for the fences, and the store's durability."""

    async def ask(self, peer: str, frame_type: str, fields: Fields, timeout: float) -> Frame: ...

    def tell(self, peer: str, frame_type: str, fields: Fields) -> None: ...

    async def drain_link(self, peer: str, timeout: float) -> None: ...

    async def wait_durable(self) -> None: ...

    def flush_routes_now(self) -> None: ...

    def own_route_snapshot(self) -> list[object]: ...

    def take_route_snapshot(self, wire: object) -> None: ...


class _Superseded(Exception):
    """A newer CONNECT for the same client id won while this takeover ran."""


@dataclass
class _Taking:
    claim: Claim
    scope: trio.CancelScope
    superseded: bool = False
    session: Session | None = None  # installed here, not yet complete


@dataclass
class HandoffStats:
    taken: int = 0  # sessions handed over to this node
    given: int = 0  # sessions this node handed over
    failed: int = 0  # takeovers that fell back to a local copy (owner unreachable, errors)
    superseded: int = 0  # CONNECTs closed with 0x8E because a newer one won elsewhere
    kicked: int = 0  # local connections closed because a newer CONNECT claimed the id
    merged_out: int = 0  # copies pushed to their owner and merged there (conflicts resolved)
    merged_in: int = 0  # copies from other nodes merged into sessions owned here
    durations_ms: list[float] = field(default_factory=list)  # the last takeovers, for /metrics


class Handoffs:
    def __init__(self, *, node_id: str, broker: SessionHost, gossip: ClaimGossip, cluster: MeshRequests,
                 trace: Tracer, clock: Clock) -> None:
        self.node_id = node_id
        self.broker = broker
        self.gossip = gossip
        self.cluster = cluster
        self.trace = trace
        self.clock = clock
        self.register = OwnershipRegister(node_id)
        self.giving: dict[str, Giving] = {}
        self.taking: dict[str, _Taking] = {}
        self.moved: dict[str, tuple[str, float]] = {}
        self._locks: dict[str, trio.Lock] = {}
        self._pushing: set[str] = set()
        self._remembered_since: dict[str, float] = {}
        self._incoming: dict[tuple[str, str], tuple[object, list[Delivery]]] = {}
        self._nursery: trio.Nursery | None = None
        self.stats = HandoffStats()
        self.malformed = 0
        gossip.on_broadcast("own", self._on_claim_broadcast)
        gossip.register_push_pull("owners", self._owners_state, self._merge_owners)

    async def run(self) -> None:
        """Housekeeping: givers that timed out, old tombstones, old `moved` notes, and
        copies of sessions another node owns, pushed there to be merged."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            while True:
                await trio.sleep(HOUSEKEEPING_INTERVAL)
                self.housekeeping(self.clock.wall())
                self._push_foreign_copies()

    def housekeeping(self, now: float) -> None:
        for cid, giving in list(self.giving.items()):
            if now - giving.started > GIVE_TIMEOUT:
                del self.giving[cid]
                log.warning("handoff of %s to %s timed out; keeping the session here", cid, giving.taker)
        for cid, (_, at) in list(self.moved.items()):
            if now - at > MOVED_MEMORY:
                del self.moved[cid]
        self.register.prune(int(now * 1000))
        alive = set(self.gossip.alive_members())
        for key in [k for k in self._incoming if k[0] not in alive]:
            del self._incoming[key]  # a push cut off midway: it starts over when the peer is back
        for cid, since in list(self._remembered_since.items()):
            if now - since > REMEMBER_FOR or cid not in self.broker.sessions:
                del self._remembered_since[cid]
                self.broker.remembered.pop(cid, None)

    def _wall_ms(self) -> int:
        return int(self.clock.wall() * 1000)

    def _wall_us(self) -> int:
        return int(self.clock.wall() * 1_000_000)

    # ------------------------------------------------------------ ownership

    def _peers(self) -> bool:
        return self.gossip.has_peers()

    def connect_is_local(self, client_id: str, clean_start: bool, persistent: bool) -> bool:
        """Whether `prepare_connect` would return 'ok' at once, changing nothing: a
        clean session on a node with no live peer and no CONNECT of that id under way.
        The connection answers such a CONNECT without awaiting anything."""
        return clean_start and not persistent and client_id not in self._locks and not self._peers()

    def _announce(self, claim: Claim) -> None:
        if self._peers():
            # Keyed by client id *and* this node: gossip lets a broadcast replace an older
            # one of the same key, judged by when it was sent, not by the claims' HLC.
            # One key for every node let a claim that loses by HLC, sent a little later
            # (a slower wall clock), stop the winning claim from spreading.
            self.gossip.broadcast("own", f"{claim.client_id}/{self.node_id}", claim.to_wire())

    def session_ended(self, client_id: str) -> None:
        if client_id in self.register.claims:
            claim = self.register.release(client_id, self._wall_ms())
            if claim is not None:
                self._announce(claim)

    def _on_claim_broadcast(self, origin: str, payload: object) -> None:
        try:
            claim = Claim.from_wire(payload)
        except (TypeError, ValueError) as exc:
            self.malformed += 1
            log.warning("dropping a malformed ownership claim from %s: %s", origin, exc)
            return
        self._take_claim(claim)

    def _owners_state(self) -> object:
        return self.register.to_wire()

    def _merge_owners(self, state: object) -> None:
        try:
            claims = OwnershipRegister.claims_from_wire(state)
        except (TypeError, ValueError) as exc:
            self.malformed += 1
            log.warning("dropping malformed ownership state: %s", exc)
            return
        for claim in claims:
            self._take_claim(claim)

    def _take_claim(self, claim: Claim) -> None:
        if not self.register.merge(claim, self._wall_ms()) or claim.owner in (None, self.node_id):
            return
        cid = claim.client_id
        taking = self.taking.get(cid)
        if taking is not None and claim.stamp > taking.claim.stamp:
            taking.superseded = True
            taking.scope.cancel()
        if cid in self.broker.connections:
            # A newer CONNECT elsewhere: this connection is taken over (0x8E).
            self.stats.kicked += 1
            log.info("%s connected at %s: closing its connection here (session taken over)", cid, claim.owner)
            self.broker.detach_for_handoff(cid, self.clock.wall())
        if claim.clean and cid not in self.giving:
            # Clean start elsewhere: whatever this node kept for the client is void.
            self.broker.discard_session(cid, self.clock.wall())

    # ------------------------------------------------------------ the taker

    async def prepare_connect(self, client_id: str, clean_start: bool, persistent: bool) -> str:
        """Before a CONNECT opens its session here: claim the client id, and when the
        session lives on another node, take it over.  'ok' to go on; 'superseded' when
        a newer CONNECT elsewhere won (close this one with 0x8E)."""
        if self.connect_is_local(client_id, clean_start, persistent):
            return "ok"  # a lone node keeps no claims for clean sessions: the fast path
        lock = self._locks.get(client_id)
        if lock is None:
            lock = self._locks[client_id] = trio.Lock()
        try:
            async with lock:
                return await self._prepare(client_id, clean_start, persistent)
        finally:
            if not lock.locked() and lock.statistics().tasks_waiting == 0:
                self._locks.pop(client_id, None)

    async def _prepare(self, client_id: str, clean_start: bool, persistent: bool) -> str:
        previous = self.register.get(client_id)
        claim = self.register.claim(client_id, self._wall_ms(), clean=clean_start)
        self._announce(claim)
        giving = self.giving.pop(client_id, None)
        if giving is not None and giving.commit_seq is not None:
            # Committed: the taker holds everything and its `ho_done` is on its way;
            # the copy here is stale, and the session is fetched from whoever owns it now.
            self._handed_over(client_id, giving.taker, self.clock.wall())
        elif giving is not None:
            log.info("%s came back here: handoff to %s abandoned", client_id, giving.taker)
        owner = previous.owner if previous is not None else None
        if clean_start or owner is None or owner == self.node_id:
            return "ok"
        if owner not in self.gossip.alive_members():
            self._fallback(client_id, owner, "owner unreachable")
            return "ok"
        return await self._take_over(client_id, owner, claim)

    def _fallback(self, client_id: str, owner: str, why: str) -> None:
        self.stats.failed += 1
        # The owner's copy will be merged into this session later: remember what this
        # one is given meanwhile, so the merge does not deliver it twice.
        keys = self.broker.remembered.setdefault(client_id, set())
        session = self.broker.sessions.get(client_id)
        if session is not None:  # what it holds now is what it may deliver
            keys.update(message_key(e.delivery.message) for e in session.inflight.values())
            keys.update(message_key(d.message) for d in (session.queue if session.queued else ()))
        self._remembered_since[client_id] = self.clock.wall()
        have = client_id in self.broker.sessions
        log.warning("session %s: cannot take it over from %s (%s); going on with %s", client_id, owner, why,
                    "the copy held here" if have else "a new session")
        self.trace.emit(ts_us=self._wall_us(), kind="session_handoff", subject=client_id, origin=owner,
                        to=self.node_id, outcome="fallback", reason=why, duration_ms=0.0, messages=0)

    async def _take_over(self, client_id: str, owner: str, claim: Claim) -> str:
        started = self.clock.now()
        taking = _Taking(claim, trio.CancelScope(deadline=started + TAKEOVER_BUDGET))
        self.taking[client_id] = taking
        machine = Takeover(client_id, owner, claim.stamp.to_wire())
        try:
            with taking.scope:
                # Copies forwarded here (over routes older than this takeover) before the
                # client left its old node must land before the session does: the old
                # node may have delivered them already.  Flushed alongside the pull.
                flushed = trio.Event()
                assert self._nursery is not None
                self._nursery.start_soon(self._fence_back, flushed)
                return await self._drive(machine, taking, started, flushed)
            if taking.superseded:
                return self._superseded(client_id, taking)
            self._fallback(client_id, machine.owner, "timed out")
            return "ok"
        except _Superseded:
            return self._superseded(client_id, taking)
        except (trio.TooSlowError, HandoffError, OSError, trio.BrokenResourceError) as exc:
            self._fallback(client_id, machine.owner, str(exc) or type(exc).__name__)
            return "ok"
        finally:
            if self.taking.get(client_id) is taking:
                del self.taking[client_id]

    def _superseded(self, client_id: str, taking: _Taking) -> str:
        self.stats.superseded += 1
        if taking.session is not None:
            self.broker.discard_session(client_id, self.clock.wall())
        log.info("%s: a newer CONNECT elsewhere won; closing this one (0x8E)", client_id)
        return "superseded"

    async def _drive(self, machine: Takeover, taking: _Taking, started: float, flushed: trio.Event) -> str:
        client_id = machine.client_id
        step: Step = machine.start()
        redirects = 0
        phases: list[tuple[str, float]] = []  # for the debug log: where the time goes
        while True:
            phases.append((type(step).__name__ + ":" + getattr(step, "frame_type", ""), self.clock.now() - started))
            if isinstance(step, Ask):
                reply = await self.cluster.ask(machine.owner, step.frame_type, step.fields, STEP_TIMEOUT)
                if "own" in reply:
                    # Refused for a newer claim: learn it now, so the client's next
                    # CONNECT here asks the right owner with a newer stamp (and does not
                    # take this node's losing claim for ownership).
                    try:
                        self._take_claim(Claim.from_wire(reply["own"]))
                    except (TypeError, ValueError) as exc:
                        self.malformed += 1
                        log.warning("dropping a malformed claim from %s: %s", machine.owner, exc)
                step = machine.on_reply(reply)
            elif isinstance(step, Install):
                await flushed.wait()
                stale = self.broker.sessions.get(client_id)
                stored = merge_stale(step.session, stale) if stale is not None and stale.persistent else step.session
                taking.session = self.broker.install_session(stored, self.clock.wall())
                # Synced here and fenced everywhere, at the same time.
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self.cluster.wait_durable)
                    nursery.start_soon(self._fence, machine.owner)
                step = machine.installed()
                # The owner takes this node's routes before it lets go, so what is
                # published there after it deleted its copy is forwarded here.
                step.fields["snap"] = self.cluster.own_route_snapshot()
            elif isinstance(step, MergeTail):
                # Copies of tail messages that were forwarded here too must be here
                # before the merge, or they would escape its deduplication.
                await self._fence_back()
                session = taking.session
                if session is None:
                    raise HandoffError("tail before the session was installed")
                add, drop = merge_tail(session.queue if session.queued else (),
                                       (e.delivery for e in session.inflight.values()), step.tail, machine.base)
                self.broker.merge_handed_tail(session, add, drop)
                await self.cluster.wait_durable()
                done, finished = machine.merged()
                # The owner may delete its copy now; its answer is not needed.
                self.cluster.tell(machine.owner, done.frame_type, done.fields)
                log.debug("takeover of %s: %s", client_id, " ".join(f"{n}@{t * 1000:.1f}ms" for n, t in phases))
                self._finished(machine, finished, started)
                return "ok"
            elif isinstance(step, Redirect):
                redirects += 1
                if redirects > MAX_REDIRECTS or step.node == self.node_id or step.node not in self.gossip.alive_members():
                    raise HandoffError(f"redirected to {step.node}")
                machine = Takeover(client_id, step.node, machine.claim_wire)
                step = machine.start()
            elif isinstance(step, Refused):
                if step.why == "none":
                    log.info("%s: %s holds no session for it; starting afresh", client_id, machine.owner)
                    return "ok"
                if step.why in ("superseded", "aborted"):
                    raise _Superseded()
                raise HandoffError(f"refused: {step.why}")
            else:
                raise HandoffError(f"unexpected step {step!r}")

    def _finished(self, machine: Takeover, finished: Finished, started: float) -> None:
        duration_ms = (self.clock.now() - started) * 1000
        self.stats.taken += 1
        self.stats.durations_ms.append(duration_ms)
        del self.stats.durations_ms[:-1000]
        log_event(log, Event.CLIENT_TAKEN_OVER, client_id=machine.client_id, from_node=machine.owner,
                  duration_ms=round(duration_ms, 1), messages=finished.messages)
        self.trace.emit(ts_us=self._wall_us(), kind="session_handoff", subject=machine.client_id,
                        origin=machine.owner, to=self.node_id, outcome="ok", duration_ms=round(duration_ms, 3),
                        messages=finished.messages)

    async def _fence(self, owner: str) -> None:
        """After this node's routes for the session exist: every member takes them and
        waits until what it sent to the owner before is acknowledged there, so the
        owner's tail holds everything that did not reach this node directly."""
        self.cluster.flush_routes_now()
        snapshot = self.cluster.own_route_snapshot()
        members = [m for m in self.gossip.alive_members() if m != owner]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.cluster.drain_link, owner, FENCE_TIMEOUT)
            for member in members:
                nursery.start_soon(self._fence_one, member, owner, snapshot)

    async def _fence_back(self, done: trio.Event | None = None) -> None:
        """Every member (the old owner too) flushes its link to this node."""
        async with trio.open_nursery() as nursery:
            for member in self.gossip.alive_members():
                nursery.start_soon(self._flush_one, member)
        if done is not None:
            done.set()

    async def _flush_one(self, member: str) -> None:
        try:
            await self.cluster.ask(member, "ho_flush", {}, FENCE_TIMEOUT + 0.5)
        except (trio.TooSlowError, OSError, trio.BrokenResourceError) as exc:
            log.warning("flush at %s failed (%s): a message may be delivered twice", member, exc)

    async def _fence_one(self, member: str, owner: str, snapshot: list[object]) -> None:
        try:
            await self.cluster.ask(member, "ho_fence", {"o": owner, "snap": snapshot}, FENCE_TIMEOUT + 0.5)
        except (trio.TooSlowError, OSError, trio.BrokenResourceError) as exc:
            log.warning("fence at %s failed (%s): messages it sent to %s may arrive out of order", member, exc, owner)

    # ------------------------------------------------------------ the giver

    def answer(self, peer: str, frame: Frame) -> Reply | Awaitable[Reply]:
        kind = frame["t"]
        cid = frame.get("c")
        if kind == "ho_fence":
            return self._answer_fence(frame)
        if kind == "ho_flush":
            return self._answer_flush(peer)
        if not isinstance(cid, str):
            raise ValueError("handoff frame without a client id")
        now = self.clock.wall()
        if kind == "ho_begin":
            return "ho_state", self._answer_begin(peer, cid, Claim(cid, peer, _stamp(frame["h"])), now)
        if kind == "ho_push":
            return self._answer_push(peer, cid, frame)
        giving = self.giving.get(cid)
        session = self.broker.sessions.get(cid)
        if giving is None or giving.taker != peer or session is None or cid in self.broker.connections:
            return "ho_state", {"ok": False, "why": "aborted"}
        cursor = int(frame.get("cur", 0))
        if kind == "ho_more":
            q, cur, more = queue_chunk(session.queue if session.queued else (), cursor)
            return "ho_state", {"ok": True, "q": q, "cur": cur, "more": more}
        if kind == "ho_commit":
            if "snap" in frame:
                self.cluster.take_route_snapshot(frame["snap"])
            if giving.commit_seq is None:
                giving.commit_seq = session.next_seq - 1
            q, cur, more = queue_chunk(session.queue if session.queued else (), cursor, giving.commit_seq)
            return "ho_state", {"ok": True, "q": q, "cur": cur, "more": more}
        if kind == "ho_done":
            del self.giving[cid]
            self._handed_over(cid, peer, now)
            return "ho_state", {"ok": True}
        raise ValueError(f"unknown handoff frame {kind!r}")

    def _handed_over(self, cid: str, taker: str, now: float) -> None:
        self.moved[cid] = (taker, now)
        self.stats.given += 1
        if faults.STALE_OWNER:
            return  # BUGGIFY: the old owner keeps serving its copy
        self.broker.discard_session(cid, now)
        log.info("session %s handed over to %s", cid, taker)

    def _answer_begin(self, peer: str, cid: str, claim: Claim, now: float) -> Fields:
        self.register.merge(claim, self._wall_ms())
        current = self.register.get(cid)
        if current is not None and current.stamp > claim.stamp:
            return {"ok": False, "why": "superseded", "own": current.to_wire()}
        session = self.broker.sessions.get(cid)
        if session is None or not session.persistent:
            moved = self.moved.get(cid)
            if moved is not None and moved[0] != peer:
                return {"ok": False, "moved": moved[0]}
            return {"ok": False, "why": "none"}
        previous = self.giving.get(cid)
        if previous is not None and previous.taker != peer and previous.commit_seq is not None:
            # Committed: the session is the other taker's now; ask there.
            return {"ok": False, "moved": previous.taker}
        if previous is not None and previous.taker != peer:
            log.info("handoff of %s to %s superseded by a newer one to %s", cid, previous.taker, peer)
        self.broker.detach_for_handoff(cid, now)
        self.giving[cid] = Giving(cid, peer, now)
        q, cur, more = queue_chunk(session.queue if session.queued else (), 0)
        return {"ok": True, "img": image_of(session), "q": q, "cur": cur, "more": more}

    async def _answer_flush(self, peer: str) -> tuple[str, Fields]:
        await self.cluster.drain_link(peer, FENCE_TIMEOUT)
        return "ho_flushed", {"ok": True}

    async def _answer_fence(self, frame: Frame) -> tuple[str, Fields]:
        owner = frame["o"]
        if not isinstance(owner, str):
            raise ValueError("bad fence")
        self.cluster.take_route_snapshot(frame["snap"])
        await self.cluster.drain_link(owner, FENCE_TIMEOUT)
        return "ho_fenced", {"ok": True}

    # ------------------------------------------------------------ conflicts

    def _push_foreign_copies(self) -> None:
        """A session held here that a newer CONNECT claimed for another live node, and
        that no takeover came for (it fell back, or a netsplit kept the nodes apart):
        push it there to be merged, then forget it here."""
        if self._nursery is None:
            return
        alive = set(self.gossip.alive_members())
        now_ms = self._wall_ms()
        for cid, session in list(self.broker.sessions.items()):
            claim = self.register.get(cid)
            if (claim is None or claim.owner in (None, self.node_id) or claim.owner not in alive or claim.clean
                    or not session.persistent or cid in self.broker.connections or cid in self.giving
                    or cid in self._pushing or now_ms - claim.stamp.wall_ms < PUSH_GRACE_MS):
                continue
            self._pushing.add(cid)
            self._nursery.start_soon(self._push, cid, claim.owner)

    async def _push(self, cid: str, owner: str) -> None:
        started = self.clock.now()
        try:
            cursor, first, sent = 0, True, 0
            while True:
                session = self.broker.sessions.get(cid)
                if session is None or cid in self.broker.connections or cid in self.giving:
                    return
                queue = session.queue if session.queued else ()
                q, cursor, more = queue_chunk(queue, cursor)
                if not first and not q:
                    break  # nothing arrived since the last chunk: the copy is all there
                fields: dict[str, object] = {"c": cid, "q": q, "more": more}
                if first:
                    fields["img"] = image_of(session)
                    sent += len(session.inflight)
                reply = await self.cluster.ask(owner, "ho_push", fields, STEP_TIMEOUT)
                if not reply.get("ok"):
                    log.info("%s would not merge session %s: %s", owner, cid, reply.get("why"))
                    return
                first = False
                sent += len(q)
            self.broker.discard_session(cid, self.clock.wall())
            self.stats.merged_out += 1
            duration_ms = (self.clock.now() - started) * 1000
            log.warning("session %s: the copy held here was merged into %s's (%d messages)", cid, owner, sent)
            self.trace.emit(ts_us=self._wall_us(), kind="session_handoff", subject=cid,
                            origin=self.node_id, to=owner, outcome="merged", duration_ms=round(duration_ms, 3), messages=sent)
        except (trio.TooSlowError, OSError, trio.BrokenResourceError) as exc:
            log.info("pushing session %s to %s failed (%s); will retry", cid, owner, exc)
        finally:
            self._pushing.discard(cid)

    async def _answer_push(self, peer: str, cid: str, frame: Frame) -> tuple[str, Fields]:
        key = (peer, cid)
        if self.register.owner(cid) != self.node_id:
            self._incoming.pop(key, None)
            return "ho_state", {"ok": False, "why": "not the owner"}
        img, queue = self._incoming.pop(key, (frame.get("img"), []))
        if img is None:
            img = {"x": 0, "l": 5, "n": 1, "s": [], "i": [], "q2": []}  # a late chunk: queue only
        entries = frame.get("q", [])
        if not isinstance(entries, list):
            raise HandoffError("queue chunk is not a list")
        queue.extend(delivery_from_wire(item) for item in entries)
        if frame.get("more"):
            self._incoming[key] = (img, queue)
            return "ho_state", {"ok": True}
        stored = stored_from_image(cid, img, queue)
        added = self.broker.merge_session(stored, self.clock.wall())
        await self.cluster.wait_durable()
        self.stats.merged_in += 1
        log.warning("session %s: merged %d messages from the copy %s held", cid, added, peer)
        return "ho_state", {"ok": True}

def _stamp(data: object) -> HlcTimestamp:
    try:
        return HlcTimestamp.from_wire(data)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"bad claim stamp: {exc}") from None
