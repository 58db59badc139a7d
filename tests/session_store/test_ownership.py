"""The ownership register: last-writer-wins by HLC, in any order of arrival."""

from __future__ import annotations

import itertools

from hypothesis import given, strategies as st

from session_store.ownership import TOMBSTONE_TTL_MS, Claim, OwnershipRegister


def test_newest_claim_wins_whatever_the_order():
    a, b = OwnershipRegister("A"), OwnershipRegister("B")
    first = a.claim("dev", 1000)
    second = b.claim("dev", 1000)  # same wall time: the node id breaks the tie
    for order in itertools.permutations([first, second]):
        r = OwnershipRegister("C")
        for claim in order:
            r.merge(claim, 1000)
        assert r.owner("dev") == "B"


def test_a_claim_after_seeing_another_is_newer_even_with_a_slow_clock():
    a, b = OwnershipRegister("A"), OwnershipRegister("B")
    remote = a.claim("dev", 5000)
    assert b.merge(remote, 1000)  # B's wall clock is 4 s behind
    mine = b.claim("dev", 1001)
    assert mine.stamp > remote.stamp
    assert not b.merge(remote, 1002)  # an old claim changes nothing
    assert b.owner("dev") == "B"


def test_release_only_by_the_owner_and_tombstones_expire():
    a, b = OwnershipRegister("A"), OwnershipRegister("B")
    b.merge(a.claim("dev", 10), 10)
    assert b.release("dev", 20) is None  # B does not own it
    tomb = a.release("dev", 30)
    assert tomb is not None and tomb.owner is None
    assert b.merge(tomb, 31) and b.owner("dev") is None
    assert b.prune(31 + TOMBSTONE_TTL_MS + 1) == 1
    assert b.get("dev") is None


def test_wire_round_trip_and_bad_input():
    claim = OwnershipRegister("A").claim("dev", 42, clean=True)
    assert Claim.from_wire(claim.to_wire()) == claim
    for bad in (None, [], ["dev", "A", [1, 2], False], ["dev", 7, [1, 0, "A"], False], ["dev", "A", [1, 0, "A"], "yes"]):
        try:
            Claim.from_wire(bad)
        except (TypeError, ValueError):
            continue
        raise AssertionError(f"accepted {bad!r}")


claims = st.lists(
    st.tuples(st.sampled_from("ABC"), st.sampled_from(["x", "y"]), st.integers(0, 50), st.booleans()), max_size=25,
)


@given(claims, st.randoms(use_true_random=False))
def test_registers_converge_in_any_order(ops, rnd):
    """Claims made on three nodes, delivered to two observers in different orders:
    both end with the same owner for every client id."""
    nodes = {n: OwnershipRegister(n) for n in "ABC"}
    made = []
    for node, cid, wall, release in ops:
        r = nodes[node]
        claim = r.release(cid, wall) if release else r.claim(cid, wall)
        if claim is not None:
            made.append(claim)
    o1, o2 = OwnershipRegister("X"), OwnershipRegister("Y")
    shuffled = list(made)
    rnd.shuffle(shuffled)
    for c in made:
        o1.merge(c, 0)
    for c in shuffled:
        o2.merge(c, 0)
    assert {k: v.owner for k, v in o1.claims.items()} == {k: v.owner for k, v in o2.claims.items()}
    for cid in o1.claims:
        newest = max((c for c in made if c.client_id == cid), key=lambda c: c.stamp)
        assert o1.owner(cid) == newest.owner
