"""routing.contact: a session that expires while some member could not be heard (or
whose client is known to have resumed it elsewhere in time) is kept, not longer than
needed."""

from __future__ import annotations

from gossip.events import MemberState
from routing.contact import Contact


def contact() -> Contact:
    c = Contact(now=0.0, settle=20.0, max_keep=3600.0)
    c.member_changed("B", MemberState.ALIVE, 1.0)
    return c


def test_every_member_heard_all_along_the_session_ends_at_its_expiry() -> None:
    assert contact().keep_expired(left_at=10.0, expired_at=18.0, now=18.0, claimed_elsewhere=False) is None


def test_a_node_alone_has_no_one_to_miss() -> None:
    c = Contact(now=0.0, settle=20.0, max_keep=3600.0)
    assert c.keep_expired(left_at=-100.0, expired_at=5.0, now=5.0, claimed_elsewhere=False) is None


def test_a_node_restarted_from_a_cluster_keeps_a_session_expiring_before_it_heard_anyone() -> None:
    # Its store says it had peers: the claims it lacks are still to come (seed 244).
    c = Contact(now=100.0, settle=20.0, max_keep=3600.0, peers=True)
    assert c.keep_expired(left_at=90.0, expired_at=100.1, now=100.1, claimed_elsewhere=False) == 120.0
    assert c.keep_expired(90.0, 100.1, 120.0, False) is None  # still no one: it ends after the settle time


def test_a_member_unheard_keeps_the_session_until_it_is_back_and_the_claims_have_spread() -> None:
    c = contact()
    c.member_changed("B", MemberState.SUSPECT, 12.0)
    assert c.keep_expired(10.0, 18.0, 18.0, False) == 38.0  # asked again then
    c.member_changed("B", MemberState.DEAD, 14.0)
    assert c.keep_expired(10.0, 18.0, 38.0, False) == 58.0
    c.member_changed("B", MemberState.ALIVE, 50.0)
    assert c.keep_expired(10.0, 18.0, 58.0, False) == 70.0
    assert c.keep_expired(10.0, 18.0, 70.0, False) is None


def test_a_member_back_before_the_client_left_keeps_nothing() -> None:
    c = contact()
    c.member_changed("B", MemberState.DEAD, 2.0)
    c.member_changed("B", MemberState.ALIVE, 5.0)
    assert c.keep_expired(10.0, 18.0, 18.0, False) is None
    # Back after the client left: the claims may not be here yet.
    assert c.keep_expired(4.0, 12.0, 12.0, False) == 25.0


def test_a_claim_elsewhere_from_before_the_expiry_keeps_it_until_it_is_merged_there() -> None:
    assert contact().keep_expired(10.0, 18.0, 18.0, claimed_elsewhere=True) == 38.0


def test_never_past_max_keep() -> None:
    c = contact()
    c.member_changed("B", MemberState.DEAD, 12.0)  # never back
    assert c.keep_expired(10.0, 18.0, 3610.0, False) == 3618.0
    assert c.keep_expired(10.0, 18.0, 3618.0, False) is None


def test_a_node_that_heard_no_member_for_a_while_keeps_the_session_as_if_all_were_unreachable() -> None:
    # Seed 956 of 3 nodes, 6 clients, 15 s: a node cut off alone suspected no one
    # (Lifeguard held its verdicts back) and dropped s0 at its expiry, though s0 had
    # resumed elsewhere meanwhile: an acknowledged message was lost.
    c = contact()
    c.heard(quiet_for=1.0, now=9.0)
    assert c.keep_expired(10.0, 18.0, 18.0, False) is None
    c.heard(quiet_for=4.5, now=16.0)  # nothing heard since 11.5: alone
    assert c.keep_expired(10.0, 18.0, 18.0, False) == 38.0
    c.heard(quiet_for=0.2, now=30.0)  # heard again: the claims spread from then on
    assert c.keep_expired(10.0, 18.0, 38.0, False) == 50.0
    assert c.keep_expired(10.0, 18.0, 50.0, False) is None
    c.heard(quiet_for=None, now=60.0)  # no member heard yet is not alone
    assert not c.alone
