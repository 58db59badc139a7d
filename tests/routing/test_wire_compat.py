"""The routing records travel as exactly the CBOR the previous version sent: bytes of
the previous encoding (frozen below, as that version's code built them) decode into the
records, and the records encode to the same bytes again, so nodes of the two versions
still form one cluster."""

from __future__ import annotations

import cbor2
import pytest

from gossip import wire
from mqtt import EMPTY_PROPERTIES
from routing.table import OriginDigest, RouteDelta, RouteSnapshot, digest_from_wire, digest_to_wire
from routing.wire import ForwardedItem, PeerDigest, RouteBroadcast, forwarded_to_wire
from session_store import records
from session_store.model import Message

MSG = Message("s/1", b"hi", 1, False, EMPTY_PROPERTIES, None, "pub", 42, "A")

# [message map, plain, [[group, filter]], keep_retained], as mesh.broker + routing.cluster built it
OLD_FORWARDED = bytes.fromhex(
    "84a9617463732f3161704268696171016172f46178f66166637075626169182a616f6141627072f6f58182616763732f23f4")
# a held message replayed after a split: [message map, true, [], false, true]
OLD_REPLAYED = bytes.fromhex(
    "85a9617463732f3161704268696171016172f46178f66166637075626169182a616f6141627072f6f580f4f5")
# the `route` broadcast: [[origin, epoch, first version, [[filter, present], ...]], origin ts in us]
OLD_ROUTE_BROADCAST = bytes.fromhex(
    "828461410307828263732f23f5826c2473686172652f672f732f23f41b00060a2418202240")
# the `routes` push-pull state: {"n": node, "d": {origin: [epoch, version, hash]}}
OLD_PEER_DIGEST = bytes.fromhex("a2616e61416164a261418303081b00000b3a73ce2ff261428301021863")


def test_forwarded_item_decodes_from_and_encodes_to_the_previous_bytes() -> None:
    item = ForwardedItem.from_wire(cbor2.loads(OLD_FORWARDED))
    assert records.message_map(item.message) == records.message_map(MSG)
    assert (item.plain, item.groups, item.keep_retained, item.replay) == (True, (("g", "s/#"),), False, False)
    assert cbor2.dumps(item.to_wire()) == OLD_FORWARDED
    # The cluster's path (the message encoded once for every target) gives the same bytes.
    assert cbor2.dumps(forwarded_to_wire(records.message_map(MSG), True, [("g", "s/#")], False)) == OLD_FORWARDED


def test_replayed_item_keeps_its_fifth_element() -> None:
    item = ForwardedItem.from_wire(cbor2.loads(OLD_REPLAYED))
    assert item.replay and item.plain and item.groups == () and not item.keep_retained
    assert cbor2.dumps(item.to_wire()) == OLD_REPLAYED


def test_a_forward_to_several_nodes_names_them_where_an_older_node_ignores_it() -> None:
    item = ForwardedItem(MSG, True, (), False, also=("B", "C"))
    data = cbor2.loads(cbor2.dumps(item.to_wire()))
    assert ForwardedItem.from_wire(data).also == ("B", "C")
    # The names ride in the message map: the previous version's decoding of the item
    # (an array of 4, its message map read key by key) takes it as the same message.
    assert len(data) == 4 and data[0]["to"] == ["B", "C"]
    assert records.message_map(records.message_from_map(data[0])) == records.message_map(MSG)
    # A forward that names no one else (one target, or an older sender) is unchanged.
    assert ForwardedItem.from_wire(cbor2.loads(OLD_FORWARDED)).also == ()


def test_forwarded_items_in_a_link_frame_round_trip() -> None:
    old = wire.encode_frame_body("fwd", "A", {"e": "3.1", "s": 1, "m": [cbor2.loads(OLD_FORWARDED)]})
    new = wire.encode_frame_body("fwd", "A", {"e": "3.1", "s": 1, "m": [ForwardedItem.from_wire(cbor2.loads(OLD_FORWARDED)).to_wire()]})
    assert new == old
    (item,) = wire.decode_frame_body(old)["m"]
    assert ForwardedItem.from_wire(item).groups == (("g", "s/#"),)


def test_route_broadcast_decodes_from_and_encodes_to_the_previous_bytes() -> None:
    broadcast = RouteBroadcast.from_wire(cbor2.loads(OLD_ROUTE_BROADCAST))
    assert broadcast == RouteBroadcast(RouteDelta("A", 3, 7, (("s/#", True), ("$share/g/s/#", False))), 1_700_000_000_123_456)
    assert cbor2.dumps(broadcast.to_wire()) == OLD_ROUTE_BROADCAST


def test_peer_digest_decodes_from_and_encodes_to_the_previous_bytes() -> None:
    state = PeerDigest.from_wire(cbor2.loads(OLD_PEER_DIGEST))
    assert state == PeerDigest("A", {"A": OriginDigest(3, 8, 12345678901234), "B": OriginDigest(1, 2, 99)})
    assert cbor2.dumps(state.to_wire()) == OLD_PEER_DIGEST
    assert digest_from_wire(digest_to_wire(state.digest)) == state.digest


def test_route_snapshot_is_the_same_list() -> None:
    old = ["A", 3, 8, ["a/#", "b"]]  # filters sorted
    snap = RouteSnapshot.from_wire(cbor2.loads(cbor2.dumps(old)))
    assert snap == RouteSnapshot("A", 3, 8, frozenset({"b", "a/#"}))
    assert cbor2.dumps(snap.to_wire()) == cbor2.dumps(old)


@pytest.mark.parametrize("bad", [
    None, 5, [], [{"t": "x"}], [{}, True, [], False],  # not an item / a message map without fields
    [records.message_map(MSG), True, [["g"]], False],  # a group without its filter
    [records.message_map(MSG), True, "g", False],
    [records.message_map(MSG), True, [], False, True, 6],
])
def test_malformed_forwarded_items_raise_value_errors(bad: object) -> None:
    with pytest.raises((ValueError, TypeError)):
        ForwardedItem.from_wire(bad)


@pytest.mark.parametrize("bad", [
    None, [], {"n": 1, "d": {}}, {"n": "A", "d": []}, {"n": "A", "d": {"B": [1, 2]}}, {"n": "A", "d": {"B": [1, "2", 3]}},
])
def test_malformed_digests_raise_value_errors(bad: object) -> None:
    with pytest.raises(ValueError):
        PeerDigest.from_wire(bad)
