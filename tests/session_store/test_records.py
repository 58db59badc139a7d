"""Format-2 delivery records: every field round-trips, and a damaged record is a
RecordError (which the store logs and skips), never another exception."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqtt import EMPTY_PROPERTIES, Properties
from session_store import records
from session_store.model import Delivery, Message


def fields(d: Delivery) -> tuple:
    m = d.message
    return (m.topic, m.payload, m.qos, m.retain, m.properties, m.expires_at, m.publisher, m.msg_id, m.origin,
            d.qos, d.retain, d.subscription_ids, d.seq)


texts = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=20)

deliveries = st.builds(
    lambda topic, payload, mq, mret, props, exp, pub, mid, origin, dq, dret, sids, seq: _delivery(
        Message(topic, payload, mq, mret, props, exp, pub, mid, origin), dq, dret, tuple(sids), seq),
    texts, st.binary(max_size=64), st.integers(0, 2), st.booleans(),
    st.one_of(st.just(EMPTY_PROPERTIES), st.builds(
        Properties, content_type=st.one_of(st.none(), texts),
        user_properties=st.lists(st.tuples(texts, texts), max_size=2).map(tuple))),
    st.one_of(st.none(), st.floats(0, 4e9)), st.one_of(st.none(), texts), st.integers(0, 2**63 - 1),
    st.one_of(st.none(), texts), st.integers(0, 2), st.booleans(),
    st.lists(st.integers(1, 268435455), max_size=3), st.integers(1, 2**64 - 1),
)


def _delivery(msg: Message, qos: int, retain: bool, sids: tuple[int, ...], seq: int) -> Delivery:
    d = Delivery(msg, qos, retain, sids)
    d.seq = seq
    return d


@given(d=deliveries, state=st.sampled_from([(records.QUEUED, 0, None), (records.PUBLISH_SENT, 1, "publish"),
                                             (records.PUBREL_SENT, 65535, "pubrel")]))
def test_delivery_record_round_trips(d, state):
    code, pid, name = state
    data = records.encode_delivery_record(d, code, pid)
    assert records.is_delivery_record(data)
    back, back_state, back_pid = records.decode_delivery_record(data, d.seq)
    assert fields(back) == fields(d)
    assert (back_state, back_pid) == (name, pid)


def test_empty_properties_stay_the_shared_instance():
    d = _delivery(Message("t", b"p", 1, False, EMPTY_PROPERTIES), 1, False, (), 1)
    back, _, _ = records.decode_delivery_record(records.encode_delivery_record(d), 1)
    assert back.message.properties is EMPTY_PROPERTIES  # the encoder's fast path relies on it


def test_format_1_records_are_not_taken_for_format_2():
    d = _delivery(Message("t", b"p", 1, False, EMPTY_PROPERTIES), 1, False, (), 1)
    assert not records.is_delivery_record(records.encode_delivery(d))
    assert not records.is_delivery_record(b"")


GOOD = records.encode_delivery_record(
    _delivery(Message("a/b", b"payload", 1, False, Properties(content_type="x"), 5.0, "pub", 9, "n1"), 1, False, (4,), 3),
    records.PUBLISH_SENT, 17)


@pytest.mark.parametrize("data", [
    b"\x02",  # header cut short
    GOOD[:30],
    GOOD[:45],  # strings cut short
    b"\x03" + GOOD[1:],  # unknown version
    GOOD[:2] + b"\x07" + GOOD[3:],  # unknown state
    GOOD[:3] + b"\x00\x00" + GOOD[5:],  # inflight with packet id 0
    GOOD[:1] + b"\x03" + GOOD[2:],  # QoS 3
    GOOD.replace(b"a/b", b"\xff\xfe/"),  # topic not UTF-8
])
def test_damaged_records_raise_record_error(data):
    with pytest.raises(records.RecordError):
        records.decode_delivery_record(data, 1)


@given(data=st.binary(max_size=80))
def test_garbage_raises_only_record_error(data):
    try:
        records.decode_delivery_record(b"\x02" + data, 1)
    except records.RecordError:
        pass
