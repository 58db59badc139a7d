"""Session handoff: moving a persistent session to the node its client reconnected to.

The sans-I/O half: the wire form of a session, the taker's state machine (`Takeover`,
on the node that received the CONNECT) and the giver's bookkeeping (`Giving`, on the
owner).  No Trio, no sockets, no clock reads; `routing.handoff_driver` runs it
over the mesh links.

The protocol (B takes over from A; every frame is a request on B's link to A with one
reply, so a lost link or a dead A shows up as a timeout on B):

1. ``ho_begin`` (client id, B's ownership claim): A closes the client's connection
   there (0x8E), stops delivering to it and keeps queueing what arrives for it; it
   answers with the session's image (expiry, subscriptions, inflight with packet ids,
   QoS 2 inbound ids) and the first chunk of its queue, in order.
2. ``ho_more`` (cursor): the next queue chunk, until A says there is no more.
3. B installs the image: writes it to its store (synced), takes the subscriptions into
   its trie and routes, and from now on queues what arrives for the client *after* A's
   entries (B numbers its own entries from A's plus `B_SEQ_BASE_GAP`, so the queue's
   order, which is its sequence order, is A's then B's).  B then *fences*: every other
   member takes B's routes and waits until A has taken what it already forwarded to A
   (a marker behind it on its link).  After the fences, any message for the client
   reaches B directly.
4. ``ho_commit`` (cursor, B's routes): A takes B's routes (so what is published at A
   from now on is forwarded to B) and answers with the rest of its queue up to now
   (the tail: what arrived while B was installing).  Those may also have reached B
   directly; B first has every member flush its link to B (``ho_flush``), so every
   such copy is here, then keeps A's copy (earlier in the queue) and drops its own,
   matching by message identity (origin node, message id).  Order per publisher
   holds: each publisher's messages in the tail come before its messages that only B
   has.
5. ``ho_done``: once the tail is synced on B.  A deletes its copy and withdraws its
   routes.  B announces ownership (the claim made at CONNECT time stands) and answers
   CONNACK with session present = 1; inflight is resent with DUP=1, then the queue.

If A never answers (dead, partitioned) B goes on with the newest copy it holds itself
(none: a new session, session present = 0); if A answers ``ho_commit`` but not
``ho_done`` A keeps its copy until its giver timeout and then keeps serving it as
owner of record would (a conflict the netsplit heal merges later).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from session_store import records
from session_store.model import Delivery, Message, Session, SubscriptionOptions
from session_store.store import StoredSession

# B numbers its own queue entries from A's next sequence number plus this gap: above
# anything A can still add to its queue before the handoff commits.
B_SEQ_BASE_GAP = 1 << 24
CHUNK_BYTES = 512 * 1024  # queue entries per reply frame (mesh frames are at most 8 MiB)


class HandoffError(ValueError):
    """A handoff frame that does not parse."""


# ------------------------------------------------------------------ wire form


def delivery_to_wire(d: Delivery) -> list[object]:
    return [records.message_map(d.message), d.qos, d.retain, list(d.subscription_ids), d.seq]


def delivery_from_wire(data: object) -> Delivery:
    if not isinstance(data, (list, tuple)) or len(data) != 5:
        raise HandoffError("bad delivery: not an array of 5")
    try:
        m, qos, retain, sub_ids, seq = data
        d = Delivery(records.message_from_map(m), int(qos), bool(retain), tuple(int(i) for i in sub_ids))
        d.seq = int(seq)
    except (TypeError, ValueError, records.RecordError) as exc:
        raise HandoffError(f"bad delivery: {exc}") from None
    return d


def _options_to_wire(o: SubscriptionOptions) -> list[object]:
    return [o.qos, o.no_local, o.retain_as_published, o.retain_handling, o.subscription_id]


def _options_from_wire(data: object) -> SubscriptionOptions:
    if not isinstance(data, (list, tuple)) or len(data) != 5:
        raise ValueError("bad subscription options: not an array of 5")
    qos, no_local, rap, rh, sid = data
    if qos not in (0, 1, 2) or rh not in (0, 1, 2) or not (sid is None or isinstance(sid, int)):
        raise ValueError("bad subscription options")
    return SubscriptionOptions(qos, bool(no_local), bool(rap), rh, sid)


def subscriptions_to_wire(subscriptions: dict[str, SubscriptionOptions]) -> list[object]:
    """A session image's "s": [[filter, options], ...]."""
    return [[f, _options_to_wire(o)] for f, o in subscriptions.items()]


def image_of(session: Session) -> dict[str, object]:
    """Everything of a session except its queue (which goes in chunks)."""
    return {
        "x": session.expiry_interval,
        "l": session.protocol_level,
        "n": session.next_seq,
        "s": subscriptions_to_wire(session.subscriptions),
        "i": [[pid, e.state, delivery_to_wire(e.delivery)] for pid, e in session.inflight.items()],
        "q2": sorted(session.qos2_in) if session._qos2_in else [],
    }


def stored_from_image(client_id: str, image: object, queue: list[Delivery]) -> StoredSession:
    if not isinstance(image, dict):
        raise HandoffError("bad session image: not a map")
    try:
        stored = StoredSession(
            client_id=client_id, expiry_interval=int(image["x"]), protocol_level=int(image["l"]),
            next_seq=int(image["n"]),
            subscriptions={str(f): _options_from_wire(o) for f, o in image["s"]},
            inflight=[(int(pid), delivery_from_wire(d), str(st)) for pid, st, d in image["i"]],
            queue=queue,
            qos2_in={int(p) for p in image["q2"]},
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise HandoffError(f"bad session image: {exc}") from None
    for pid, _, state in stored.inflight:
        if not 1 <= pid <= 65535 or state not in ("publish", "pubrel"):
            raise HandoffError(f"bad inflight entry {pid} {state!r}")
    remembered = image.get(REMEMBERED)
    if isinstance(remembered, list):
        try:
            stored.remembered = {(None if o is None else str(o), int(i)) for o, i in remembered}
        except (TypeError, ValueError) as exc:
            raise HandoffError(f"bad remembered messages: {exc}") from None
    return stored


REMEMBERED = "rk"  # an image's optional key: [[origin, message id], ...] the session was given lately
REMEMBERED_SENT = 50_000  # at most this many go with an image


def remembered_to_wire(keys: Iterable[tuple[str | None, int]]) -> list[list[object]]:
    out: list[list[object]] = []
    for origin, msg_id in keys:
        if len(out) >= REMEMBERED_SENT:
            break
        out.append([origin, msg_id])
    return out


def queue_chunk(queue: Iterable[Delivery], after_seq: int, upto_seq: int | None = None) -> tuple[list[list], int, bool]:
    """Queue entries with after_seq < seq (<= upto_seq), at most ~CHUNK_BYTES of them:
    (entries on the wire, the new cursor, whether more remain)."""
    out: list[list] = []
    size = 0
    cursor = after_seq
    for d in queue:
        if d.seq <= after_seq or (upto_seq is not None and d.seq > upto_seq):
            continue
        if out and size + len(d.message.payload) + 64 > CHUNK_BYTES:
            return out, cursor, True
        out.append(delivery_to_wire(d))
        size += len(d.message.payload) + len(d.message.topic) + 64
        cursor = d.seq
    return out, cursor, False


def message_key(msg: Message) -> tuple[str | None, int]:
    """A message's identity across the cluster."""
    return (msg.origin, msg.msg_id)


# ------------------------------------------------------------------ the taker (B)


@dataclass(slots=True)
class Ask:
    """Send this request to the owner and feed its reply to `Takeover.on_reply`."""
    frame_type: str
    fields: dict[str, object]


@dataclass(slots=True)
class Install:
    """Write this session here (synced), route it, fence, then call `installed()`."""
    session: StoredSession


@dataclass(slots=True)
class MergeTail:
    """Put A's tail into the installed session, sync, then call `merged()`."""
    tail: list[Delivery]


@dataclass(slots=True)
class Finished:
    """The session is here: CONNACK with session present = 1."""
    messages: int


@dataclass(slots=True)
class Redirect:
    """The owner gave the session to `node` meanwhile: ask it instead."""
    node: str


@dataclass(slots=True)
class Refused:
    """The owner would not hand over: `why` is 'superseded' (a newer CONNECT elsewhere
    wins; close this client with 0x8E), 'none' (it holds no such session),
    'aborted' (the client came back to the owner meanwhile) or 'forgot' (the owner
    knows of no handoff to this taker any more: it restarted, or gave up on it, since
    its `ho_begin`; the taker goes on with what it installed, as when the owner dies)."""
    why: str


Step = Ask | Install | MergeTail | Finished | Redirect | Refused


@dataclass
class Takeover:
    client_id: str
    owner: str
    claim_wire: list  # the HLC stamp of the claim made at CONNECT
    phase: str = "begin"
    cursor: int = 0
    image: object = None  # the session image from `ho_state`, until the queue is pulled
    queue: list[Delivery] = field(default_factory=list)
    messages: int = 0
    base: int = 0  # B's own queue entries are numbered from here

    def start(self) -> Ask:
        return Ask("ho_begin", {"c": self.client_id, "h": self.claim_wire})

    def on_reply(self, frame: dict[str, Any]) -> Step:
        if not frame.get("ok"):
            moved = frame.get("moved")
            if isinstance(moved, str):
                return Redirect(moved)
            return Refused(str(frame.get("why", "refused")))
        if self.phase == "begin":
            self.image = frame["img"]
            self.phase = "pull"
        if self.phase == "pull":
            self._take_chunk(frame)
            if frame.get("more"):
                return Ask("ho_more", self._fields())
            self.phase = "install"
            stored = stored_from_image(self.client_id, self.image, self.queue)
            self.base = stored.next_seq = max([stored.next_seq] + [d.seq + 1 for d in stored.queue]) + B_SEQ_BASE_GAP
            self.messages = len(stored.inflight) + len(stored.queue)
            self.queue = []
            return Install(stored)
        if self.phase == "commit":
            self._take_chunk(frame)
            if frame.get("more"):
                return Ask("ho_commit", self._fields())
            self.phase = "merge"
            tail, self.queue = self.queue, []
            self.messages += len(tail)
            return MergeTail(tail)
        raise HandoffError(f"unexpected reply in phase {self.phase}")

    def installed(self) -> Ask:
        self.phase = "commit"
        return Ask("ho_commit", self._fields())

    def _fields(self) -> dict[str, Any]:
        # "h" (optional; an older owner skips it): the claim again, so that an owner
        # that forgot this handoff (restarted since `ho_begin`) can tell a newer CONNECT
        # elsewhere from this one.
        return {"c": self.client_id, "cur": self.cursor, "h": self.claim_wire}

    def merged(self) -> tuple[Ask, Finished]:
        self.phase = "done"
        return Ask("ho_done", {"c": self.client_id}), Finished(self.messages)

    def _take_chunk(self, frame: dict[str, Any]) -> None:
        entries = frame.get("q", [])
        if not isinstance(entries, list):
            raise HandoffError("queue chunk is not a list")
        for item in entries:
            d = delivery_from_wire(item)
            if d.seq <= self.cursor:
                raise HandoffError("queue chunk out of order")
            self.queue.append(d)
            self.cursor = d.seq
        cur = frame.get("cur", self.cursor)
        if isinstance(cur, int) and cur > self.cursor:
            self.cursor = cur


def merge_tail(queue: Iterable[Delivery], inflight: Iterable[Delivery], tail: list[Delivery], base: int) -> tuple[list[Delivery], list[Delivery]]:
    """B's queue after A's tail arrives: (the tail entries to add, B's own entries to drop
    as copies of A's).  B's queue holds A's earlier entries (seq below `base`)
    and what reached B directly (above); a message can reach both nodes while the
    routes change, and A's copy is the one that keeps its place in the order."""
    queue = list(queue)
    from_a = {message_key(d.message) for d in queue if d.seq < base}
    from_a.update(message_key(d.message) for d in inflight)
    add = [d for d in tail if message_key(d.message) not in from_a]
    from_a.update(message_key(d.message) for d in add)
    drop = [d for d in queue if d.seq >= base and message_key(d.message) in from_a]
    return add, drop


# ------------------------------------------------------------------ the giver (A)


@dataclass
class Giving:
    """The owner's record of a handoff in progress."""
    client_id: str
    taker: str
    started: float
    commit_seq: int | None = None  # the tail ends here (set at ho_commit)
    # Members the taker fenced (they took its routes and drained their links here),
    # each with the last message id it forwarded before: what it forwards after that
    # goes to the taker too.  ho_commit's optional "fenced".
    fenced: dict[str, int] = field(default_factory=dict)


def merge_stale(image: StoredSession, stale: Session, *, dup: bool = False) -> StoredSession:
    """A copy of the session was already here (an older owner's, say after a netsplit):
    keep the handed-over image and add what only the stale copy has (subscriptions it
    lacks; its inflight and queued messages, as queued, unless the image has them or
    says the session was given them where it was: simulator seed 5627 of 3 nodes, 6
    clients, 15 s).  `dup`: they may have reached the client another way (DUP=1)."""
    for topic_filter, options in stale.subscriptions.items():
        image.subscriptions.setdefault(topic_filter, options)
    known = {message_key(d.message) for _, d, _ in image.inflight} | {message_key(d.message) for d in image.queue}
    known |= image.remembered
    extra = [e.delivery for e in stale.inflight.values()] + list(stale.queue if stale.queued else ())
    seq = max([image.next_seq] + [d.seq + 1 for d in image.queue] + [d.seq + 1 for _, d, _ in image.inflight])
    for d in extra:
        if message_key(d.message) in known:
            continue
        copy = Delivery(d.message, d.qos, d.retain, d.subscription_ids)
        copy.dup = dup or d.dup
        copy.seq = seq
        seq += 1
        image.queue.append(copy)
        known.add(message_key(d.message))
    image.next_seq = seq
    return image
