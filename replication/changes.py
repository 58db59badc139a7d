"""The replication stream of one session, and the copy a replica builds from it.

Pure: no Trio, no clock, no store.  The owner turns every change its store records for
a persistent session (`session_store.store.SessionTap`) into a *change*: a CBOR list
that starts with the session's replication sequence number and a kind:

    [seq, "m", expiry, protocol level, disconnected at, next delivery seq]   the session
    [seq, "s", filter, options or None]          a subscription set or removed
    [seq, "d", delivery seq, state, delivery]    a delivery queued (state 0), sent
                                                 (state code | packet id << 2, see
                                                 `session_store.store.delivery_state`)
                                                 or gone (state -1, delivery None, or
                                                 for QoS 2 [origin, message id]: a key
                                                 an older replica reads past)
    [seq, "q", packet id, present]               an inbound QoS 2 packet id
    [seq, "w", will record or None]              the will (`records.encode_will`: the
                                                 message, its delay, when it is due once
                                                 its connection is gone) set or removed
    [seq, "x"]                                   the session ended
    [seq, "n"]                                   nothing (a delivery state a later change
                                                 in the same batch replaces)
    [seq, "N", count]                            nothing, `count` sequence numbers from
                                                 seq on (only on a channel: a replica that
                                                 serves one reads it)
    [seq, "S", image, queue]                     a snapshot: the whole session

Deliveries travel as `session_store.handoff.delivery_to_wire` (what a handoff sends),
the image as `image_of` without its in-flight part, which is in the queue list here
with its state: one list of [state, delivery] in delivery order; the image's "w" is
the will record (a key an older replica skips; a "w" change it does not know makes it
ask for a snapshot, so it keeps the rest).

A replica applies changes in sequence order; a gap (or a change for a session it has
no copy of) asks the owner for a snapshot instead of guessing (`Apply.resync`).  The
copy keeps wire forms only: a replica never routes a message, it only holds it until
a takeover turns the copy into a session (`stored_session`).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from session_store import records
from session_store.handoff import (
    HandoffError, delivery_from_wire, delivery_to_wire, stored_from_image, subscriptions_to_wire,
)
from session_store.model import Delivery, Session, SubscriptionOptions
from session_store.records import QUEUED
from session_store.store import NO_RECORD, StoredSession

STATE_NAMES = {1: "publish", 2: "pubrel"}
# The queue head a takeover marks DUP: the owner may have sent these (moved them into
# its in-flight window, at most `max_inflight` of them, 32 by default) just before it
# died, without the replica hearing of it.
MAYBE_SENT = 64
# How many of the QoS 2 messages a copy's session was given lately (deliveries the
# owner removed: completed) a replica keeps, so that a takeover from it does not
# deliver them again when they arrive late by another way (a held forward replayed at
# a heal, a relayed copy): QoS 2 is exactly once, where a QoS 1 repeat goes with DUP.
# Kept on the replica's disk with the copy (`given_to_wire`), so a restarted replica
# still has them.
GIVEN_KEPT = 256

Change = list[object]


def meta_change(seq: int, expiry: int, level: int, disconnected_at: float | None, next_seq: int) -> Change:
    return [seq, "m", expiry, level, disconnected_at, next_seq]


def subscription_change(seq: int, topic_filter: str, options: SubscriptionOptions | None) -> Change:
    if options is None:
        return [seq, "s", topic_filter, None]
    return [seq, "s", topic_filter, [options.qos, options.no_local, options.retain_as_published,
                                     options.retain_handling, options.subscription_id]]


def delivery_change(seq: int, delivery: Delivery, state: int) -> Change:
    if state != NO_RECORD:
        return [seq, "d", delivery.seq, state, delivery_to_wire(delivery)]
    # Gone: a QoS 2 message's key, which the replica keeps a while (`ReplicaCopy.given`).
    msg = delivery.message
    return [seq, "d", delivery.seq, state, [msg.origin, msg.msg_id] if delivery.qos == 2 else None]


def qos2_change(seq: int, packet_id: int, present: bool) -> Change:
    return [seq, "q", packet_id, present]


def will_change(seq: int, record: bytes | None) -> Change:
    return [seq, "w", record]


def noop_change(seq: int) -> Change:
    """A change a later one in the same batch makes moot (a delivery's earlier state)."""
    return [seq, "n"]


def skip_change(seq: int, count: int) -> Change:
    """`count` changes from `seq` on that are all moot (`noop_change`s in a row)."""
    return [seq, "N", count]


def end_change(seq: int) -> Change:
    return [seq, "x"]


def snapshot_change(seq: int, session: Session, will: bytes | None = None) -> Change:
    """The whole session now: what a new or lagging replica starts from (`will`: its
    will record, which the store holds apart from the session)."""
    deliveries: list[list[object]] = [
        [(2 if entry.state == "pubrel" else 1) | pid << 2, delivery_to_wire(entry.delivery)]
        for pid, entry in session.inflight.items()
    ]
    deliveries.extend([QUEUED, delivery_to_wire(d)] for d in (session.queue if session.queued else ()))
    image: dict[str, object] = {
        "x": session.expiry_interval, "l": session.protocol_level, "d": session.disconnected_at,
        "n": session.next_seq, "s": subscriptions_to_wire(session.subscriptions),
        "q2": sorted(session.qos2_in) if session._qos2_in else [],
    }
    if will is not None:
        image["w"] = will
    return [seq, "S", image, deliveries]


def snapshot_size(session: Session) -> int:
    """About the bytes `snapshot_change` makes of `session`, without encoding it: what
    starting a new copy costs the re-replication's bandwidth."""
    size = 128 + 48 * len(session.subscriptions)
    for entry in session.inflight.values():
        size += 96 + len(entry.delivery.message.topic) + len(entry.delivery.message.payload)
    for d in (session.queue if session.queued else ()):
        size += 96 + len(d.message.topic) + len(d.message.payload)
    return size


class ChangeError(ValueError):
    """A change that cannot be read: the replica asks for a snapshot."""


@dataclass
class ReplicaCopy:
    """What a replica holds of one session: the owner's wire forms, in memory and (by
    `replication.service`) on its disk."""

    client_id: str
    owner: str
    seq: int = 0
    stamp: object = None  # the owner's ownership claim stamp (wire form) when it sent
    expiry: int = 0
    level: int = 4
    disconnected_at: float | None = None
    next_seq: int = 1
    subscriptions: dict[str, object] = field(default_factory=dict)  # filter -> options (wire)
    deliveries: dict[int, list[object]] = field(default_factory=dict)  # delivery seq -> [state, delivery]
    qos2_in: set[int] = field(default_factory=set)
    will: bytes | None = None  # the will record (`records.encode_will`)
    # This node sent the will (the owner dead, its client gone) and has not yet told the
    # owner, which must not send it again when it is back: kept on disk with the copy,
    # so a restart of this node does not forget it.
    will_sent: bool = False
    # Message keys (origin, message id) of deliveries the owner removed lately, oldest
    # first, at most GIVEN_KEPT: the session's `remembered` at a takeover.
    given: dict[tuple[str | None, int], None] = field(default_factory=dict)

    def note_gone(self, record: list[object] | None, key: object) -> bool:
        """A delivery the owner removed: keep a QoS 2 one's key in `given`, from the
        copy's `record` of it ([state, wire form]) if it had one, else from the gone
        change (`delivery_change`: [origin, message id] or None).  Read off the wire
        forms, without building the message: this runs for every delivery removed.
        Whether a key was kept."""
        if record is not None:
            wire = record[1]
            if not (isinstance(wire, list) and len(wire) == 5 and wire[1] == 2 and isinstance(wire[0], dict)):
                return False  # not QoS 2
            key = [wire[0].get("o"), wire[0].get("i")]
        if not (isinstance(key, list) and len(key) == 2 and (key[0] is None or isinstance(key[0], str))
                and isinstance(key[1], int)):
            return False
        self.given[(key[0], key[1])] = None
        if len(self.given) > GIVEN_KEPT:
            del self.given[next(iter(self.given))]
        return True

    def header(self) -> dict[str, object]:
        """Everything but the deliveries (a replica stores those one record each)."""
        header = {"o": self.owner, "s": self.seq, "h": self.stamp, "x": self.expiry, "l": self.level,
                  "d": self.disconnected_at, "n": self.next_seq,
                  "sub": [[f, o] for f, o in sorted(self.subscriptions.items())], "q2": sorted(self.qos2_in)}
        if self.will is not None:
            header["w"] = self.will
        if self.will_sent:
            header["ws"] = 1  # a key an older version reads past
        return header

    @classmethod
    def from_header(cls, client_id: str, header: object) -> "ReplicaCopy":
        if not isinstance(header, dict):
            raise ChangeError("a replica header is a map")
        try:
            return cls(client_id, str(header["o"]), int(header["s"]), header.get("h"), int(header["x"]),
                       int(header["l"]), None if header["d"] is None else float(header["d"]), int(header["n"]),
                       {str(f): o for f, o in header["sub"]}, {}, {int(p) for p in header["q2"]},
                       _will_record(header.get("w")), bool(header.get("ws")))
        except (KeyError, TypeError, ValueError) as exc:
            raise ChangeError(f"bad replica header: {exc}") from None

    def stored_session(self) -> StoredSession:
        """The session this copy describes, as a takeover installs it: in-flight
        messages (sent, unacknowledged) are sent again with DUP by the new owner."""
        stored = StoredSession(self.client_id, expiry_interval=self.expiry, protocol_level=self.level,
                               disconnected_at=self.disconnected_at, next_seq=self.next_seq,
                               qos2_in=set(self.qos2_in), remembered=set(self.given))
        try:
            image = {"x": 0, "l": 4, "n": 1, "s": list(self.subscriptions.items()), "i": [], "q2": []}
            stored.subscriptions = stored_from_image(self.client_id, image, []).subscriptions
            if self.will is not None:
                stored.will = records.decode_will(self.will)
            for dseq in sorted(self.deliveries):
                state, wire = self.deliveries[dseq]
                delivery = delivery_from_wire(wire)
                if not isinstance(state, int) or state < 0:
                    raise ChangeError(f"bad delivery state {state!r}")
                if state == QUEUED:
                    delivery.dup = len(stored.queue) < MAYBE_SENT
                    stored.queue.append(delivery)
                else:
                    name = STATE_NAMES.get(state & 3)
                    if name is None or not 1 <= state >> 2 <= 65535:
                        raise ChangeError(f"bad delivery state {state!r}")
                    stored.inflight.append((state >> 2, delivery, name))
        except (HandoffError, records.RecordError) as exc:
            raise ChangeError(str(exc)) from None
        return stored


@dataclass
class Applied:
    """What applying one session's changes did: the delivery records to write or
    delete, whether the header changed or the copy ended, and whether the replica
    needs a snapshot (a gap, or changes for a copy it lacks)."""

    copy: ReplicaCopy | None
    put: list[int] = field(default_factory=list)  # delivery seqs to (re)write
    deleted: list[int] = field(default_factory=list)  # delivery seqs whose record goes
    header: bool = False
    ended: bool = False
    resync: bool = False
    given: bool = False  # the copy's `given` changed (written apart from the header)


def apply_changes(copy: ReplicaCopy | None, client_id: str, owner: str, stamp: object,
                  changes: Iterable[object]) -> Applied:
    """Apply one session's changes from `owner` in order; stop at the first gap."""
    result = Applied(copy)
    for change in changes:
        if not isinstance(change, list) or len(change) < 2 or not isinstance(change[0], int):
            raise ChangeError("a change is [seq, kind, ...]")
        seq, kind = change[0], change[1]
        copy = result.copy
        if kind == "S":
            if len(change) != 4 or not isinstance(change[2], dict) or not isinstance(change[3], list):
                raise ChangeError("bad snapshot")
            image = change[2]
            if copy is not None:
                result.deleted.extend(d for d in copy.deliveries if d not in result.deleted)
            try:
                fresh = ReplicaCopy(client_id, owner, seq, stamp, int(image["x"]), int(image["l"]),
                                    None if image["d"] is None else float(image["d"]), int(image["n"]),
                                    {str(f): o for f, o in image["s"]}, {}, {int(p) for p in image["q2"]},
                                    _will_record(image.get("w")))
                for state, wire in change[3]:
                    if not isinstance(wire, list) or len(wire) != 5 or not isinstance(wire[4], int):
                        raise ChangeError("bad snapshot delivery")
                    fresh.deliveries[wire[4]] = [int(state), wire]
            except (KeyError, TypeError, ValueError) as exc:
                raise ChangeError(f"bad snapshot: {exc}") from None
            if copy is not None and copy.owner == owner:
                fresh.given = copy.given  # a snapshot from the same owner: the session is the same
            elif copy is not None and copy.given:
                result.given = True  # another owner's session: what the old one was given goes
            result.copy = fresh
            result.put = list(fresh.deliveries)
            result.deleted = [d for d in result.deleted if d not in fresh.deliveries]
            result.header, result.ended, result.resync = True, False, False
            continue
        if kind == "N":
            if len(change) != 3 or not isinstance(change[2], int) or change[2] < 1:
                raise ChangeError("bad skip")
            last = seq + change[2] - 1
            if copy is not None and copy.owner == owner and copy.seq + 1 >= seq and last > copy.seq:
                copy.seq = last
                copy.stamp = stamp
                result.header = True
                continue
            if copy is not None and copy.owner == owner and last <= copy.seq:
                continue  # in the snapshot it already has
            result.resync = True
            return result
        if copy is not None and copy.owner == owner and seq <= copy.seq:
            continue  # in the snapshot it already has
        if copy is None or copy.owner != owner or seq != copy.seq + 1:
            result.resync = True
            return result
        copy.seq = seq
        copy.stamp = stamp
        result.header = True
        if kind == "n":
            continue
        if kind == "d" and len(change) == 5:
            dseq, state, wire = change[2], change[3], change[4]
            if not isinstance(dseq, int) or not isinstance(state, int):
                raise ChangeError("bad delivery change")
            if state == NO_RECORD:
                gone = copy.deliveries.pop(dseq, None)
                if copy.note_gone(gone, wire):
                    result.given = True
                if gone is not None:
                    result.deleted.append(dseq)
                    if dseq in result.put:
                        result.put.remove(dseq)
            else:
                if not isinstance(wire, list):
                    raise ChangeError("bad delivery change")
                copy.deliveries[dseq] = [state, wire]
                if dseq not in result.put:
                    result.put.append(dseq)
                if dseq in result.deleted:
                    result.deleted.remove(dseq)
        elif kind == "m" and len(change) == 6:
            expiry, level, at, next_seq = change[2:]
            if not (isinstance(expiry, int) and isinstance(level, int) and isinstance(next_seq, int)
                    and (at is None or isinstance(at, (int, float)))):
                raise ChangeError("bad session change")
            copy.expiry, copy.level, copy.next_seq = expiry, level, next_seq
            copy.disconnected_at = None if at is None else float(at)
        elif kind == "s" and len(change) == 4 and isinstance(change[2], str):
            if change[3] is None:
                copy.subscriptions.pop(change[2], None)
            else:
                copy.subscriptions[change[2]] = change[3]
        elif kind == "q" and len(change) == 4 and isinstance(change[2], int):
            if change[3]:
                copy.qos2_in.add(change[2])
            else:
                copy.qos2_in.discard(change[2])
        elif kind == "w" and len(change) == 3:
            copy.will = _will_record(change[2])
        elif kind == "x":
            result.deleted = list(copy.deliveries)
            result.put = []
            result.copy = None
            result.ended = True
        else:
            raise ChangeError(f"unknown change {kind!r}")
    return result


def given_to_wire(given: Mapping[tuple[str | None, int], None]) -> list[list[object]]:
    """A copy's `given` as its replica stores it: per origin node, its first message
    id, then each next one as the difference from the one before (message ids rise
    with each origin's publishes: small numbers), in the order they were given.
    At most GIVEN_KEPT keys: a few hundred bytes."""
    runs: dict[str | None, list[object]] = {}
    last: dict[str | None, int] = {}
    for origin, msg_id in given:
        run = runs.get(origin)
        if run is None:
            runs[origin] = [origin, msg_id]
        else:
            run.append(msg_id - last[origin])
        last[origin] = msg_id
    return list(runs.values())


def given_from_wire(value: object) -> dict[tuple[str | None, int], None]:
    """`given_to_wire`'s form read back (what does not parse is left out: the keys
    only spare a late repeat; each origin's keys in order, origins one after another)."""
    given: dict[tuple[str | None, int], None] = {}
    for run in value if isinstance(value, list) else ():
        if not (isinstance(run, list) and len(run) >= 2 and (run[0] is None or isinstance(run[0], str))
                and all(isinstance(n, int) for n in run[1:])):
            continue
        msg_id = 0
        for i, n in enumerate(run[1:]):
            msg_id = n if i == 0 else msg_id + n
            given[(run[0], msg_id)] = None
    while len(given) > GIVEN_KEPT:
        del given[next(iter(given))]
    return given


def _will_record(value: object) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    raise ChangeError("a will record is bytes")


def delivery_record(state: int, wire: object) -> bytes:
    """A copy's delivery as its replica writes it: in the owner's own record format
    (`records.encode_delivery_record`, keyed as the owner keys it: `SessionStore.
    put_replica_delivery`), so a copy takes its replica the bytes the session takes its
    owner.  Encoded by the committer, off the Trio thread: a delivery that does not
    parse (as its owner sent it) is written empty, and read back as unreadable."""
    try:
        return records.encode_delivery_record(delivery_from_wire(wire), state & 3, state >> 2)
    except (HandoffError, struct.error, ValueError, TypeError, OverflowError):
        return b""


def delivery_from_record(data: bytes, seq: int) -> list[object]:
    """[state, wire form] of a copy's delivery from its record (`delivery_record`)."""
    try:
        d, state_name, packet_id = records.decode_delivery_record(data, seq)
    except records.RecordError as exc:
        raise ChangeError(str(exc)) from None
    state = QUEUED if state_name is None else records.STATE_CODES[state_name] | packet_id << 2
    return [state, delivery_to_wire(d)]
