"""The sans-I/O handoff: the taker's state machine against a giver built from the same
pure pieces the driver uses, with chunking, and the tail merge's order and dedup."""

from __future__ import annotations

import pytest

from mqtt import EMPTY_PROPERTIES
from session_store import handoff
from session_store.handoff import (
    Ask, Finished, HandoffError, Install, MergeTail, Redirect, Refused, Takeover, image_of, merge_tail, queue_chunk,
)
from session_store.model import Delivery, InflightEntry, Message, Session, SubscriptionOptions


def msg(origin: str, i: int, payload: bytes = b"x") -> Message:
    return Message(f"t/{i}", payload, 1, False, EMPTY_PROPERTIES, None, "pub", i, origin)


def delivery(m: Message, seq: int) -> Delivery:
    d = Delivery(m, 1, False, (7,))
    d.seq = seq
    return d


def owner_session(n_queued: int) -> Session:
    s = Session(client_id="dev", persistent=True, expiry_interval=3600, protocol_level=5)
    s.subscriptions["t/#"] = SubscriptionOptions(1, subscription_id=7)
    s.subscriptions["$share/g/t/+"] = SubscriptionOptions(2)
    s.inflight[11] = InflightEntry(delivery(msg("C", 1), 1))
    s.inflight[12] = InflightEntry(delivery(msg("C", 2), 2), "pubrel")
    s.qos2_in.update({5, 6})
    for i in range(n_queued):
        s.queue.append(delivery(msg("C", 3 + i, b"p" * 100), 3 + i))
    s.next_seq = 3 + n_queued
    return s


def giver_reply(session: Session, frame_type: str, fields: dict, commit_seq: list) -> dict:
    queue = session.queue
    if frame_type == "ho_begin":
        q, cur, more = queue_chunk(queue, 0)
        return {"ok": True, "img": image_of(session), "q": q, "cur": cur, "more": more}
    if frame_type == "ho_more":
        q, cur, more = queue_chunk(queue, fields["cur"])
        return {"ok": True, "q": q, "cur": cur, "more": more}
    if frame_type == "ho_commit":
        if not commit_seq:
            commit_seq.append(session.next_seq - 1)
        q, cur, more = queue_chunk(queue, fields["cur"], commit_seq[0])
        return {"ok": True, "q": q, "cur": cur, "more": more}
    raise AssertionError(frame_type)


def test_takeover_moves_everything_in_chunks(monkeypatch):
    monkeypatch.setattr(handoff, "CHUNK_BYTES", 1000)  # ~6 entries per chunk
    a = owner_session(40)
    t = Takeover("dev", "A", [1, 0, "B"])
    step = t.start()
    asks = 0
    commit_seq: list = []
    while isinstance(step, Ask):
        asks += 1
        step = t.on_reply(giver_reply(a, step.frame_type, step.fields, commit_seq))
    assert isinstance(step, Install) and asks > 5
    stored = step.session
    assert stored.subscriptions == a.subscriptions
    assert [(pid, d.message.msg_id, st) for pid, d, st in stored.inflight] == [(11, 1, "publish"), (12, 2, "pubrel")]
    assert stored.qos2_in == {5, 6}
    assert [d.message.msg_id for d in stored.queue] == list(range(3, 43))
    assert t.base > max(d.seq for d in stored.queue)
    # Meanwhile A queued 3 more, one of which B also got directly.
    for i in range(3):
        a.queue.append(delivery(msg("C", 43 + i), 43 + i))
    a.next_seq = 46
    step = t.installed()
    while isinstance(step, Ask):
        step = t.on_reply(giver_reply(a, step.frame_type, step.fields, commit_seq))
    assert isinstance(step, MergeTail)
    assert [d.message.msg_id for d in step.tail] == [43, 44, 45]
    done, finished = t.merged()
    assert done.frame_type == "ho_done" and isinstance(finished, Finished) and finished.messages == 2 + 40 + 3


def test_refusals_and_redirects():
    t = Takeover("dev", "A", [1, 0, "B"])
    t.start()
    assert t.on_reply({"ok": False, "moved": "C"}) == Redirect("C")
    assert t.on_reply({"ok": False, "why": "superseded"}) == Refused("superseded")
    with pytest.raises(HandoffError):
        Takeover("dev", "A", []).on_reply({"ok": True, "img": {"x": 1}, "q": [], "more": False})
    t2 = Takeover("dev", "A", [])
    with pytest.raises(HandoffError):
        t2.on_reply({"ok": True, "img": image_of(owner_session(0)), "q": [["bad"]], "more": False})


def test_merge_tail_keeps_a_order_and_drops_direct_copies():
    base = 1000
    queue = [delivery(msg("C", 1), 5), delivery(msg("C", 2), 6)]  # A's earlier entries
    direct = [delivery(msg("C", 3), base), delivery(msg("B", 1), base + 1), delivery(msg("C", 4), base + 2)]
    tail = [delivery(msg("C", 3), 7)]
    add, drop = merge_tail(queue + direct, [], tail, base)
    assert [d.seq for d in add] == [7]
    assert [(d.message.origin, d.message.msg_id) for d in drop] == [("C", 3)]
    final = sorted([d for d in queue + direct if d not in drop] + add, key=lambda d: d.seq)
    assert [(d.message.origin, d.message.msg_id) for d in final] == [("C", 1), ("C", 2), ("C", 3), ("B", 1), ("C", 4)]
