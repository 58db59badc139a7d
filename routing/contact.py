"""Whether this node has heard every member all along: what decides if a session that
expires here may have been resumed on another node meanwhile (pure; time passed in).

A client that reconnects elsewhere while its session's node can be reached takes the
session over (`routing.handoff_driver`): the copy here goes.  While some member cannot
be reached, its CONNECT falls back to a new session there, and the copy here is pushed
to it once the two hear each other again and the claim has reached this node.  A copy
whose expiry falls before that would end with what it holds, acknowledged to its
publishers: so it is kept (the broker's `expired_while_down`) while a newer claim
elsewhere is known (until it is pushed), or until every member has been heard again
for `settle` seconds (time for the claims to spread: gossip pulls full state from a
member that is back at once), and at most `max_keep` seconds past its expiry (a member
that never comes back is never heard again).

A node cut off alone may not suspect anyone before the heal (Lifeguard slows its
verdicts when no helper answers either), so silence counts too: while no datagram
from any member has reached this node for `alone_after` seconds it is alone, as if
every member were unreachable, and hearing one again ends that as a member's return
does (`heard`, told every second or so).
"""

from __future__ import annotations

from gossip.events import MemberState

UNREACHABLE = (MemberState.SUSPECT, MemberState.DEAD)
PEERS_META = "contact/peers"  # meta key, present once this node has seen a member (kept across restarts)


class Contact:
    def __init__(self, now: float, settle: float, max_keep: float, alone_after: float = 4.0, *,
                 peers: bool = False) -> None:
        self.settle = settle
        self.max_keep = max_keep
        self.alone_after = alone_after
        self.alone = False  # nothing heard from any member for alone_after seconds
        self.unreachable: set[str] = set()
        # A member was ever seen (`peers`: by an earlier run of this node, as its store
        # says): alone, a node has no one to miss.  A node that restarts has heard no
        # one yet, and the claims it lacks are still to come: a copy whose expiry falls
        # just after its start, resumed elsewhere meanwhile, ended there before them
        # (simulator seed 244 of 5 nodes, 20 clients, 60 s: n0 restarted 8 ms before
        # s4's copy expired, which held p5/2/14, replayed from n4's held traffic; s4 had
        # resumed on n1 in time: the acknowledged message was lost).
        self.peers = peers
        # When the last member that could not be heard was heard again.  The start
        # counts: whatever happened before it, this node did not hear.
        self.back_at = now

    def member_changed(self, member: str, state: str, now: float) -> None:
        self.peers = True
        if state in UNREACHABLE:
            self.unreachable.add(member)
        elif member in self.unreachable:
            # Alive again, or left (a member that leaves hands its sessions over).
            self.unreachable.discard(member)
            self.back_at = now

    def heard(self, quiet_for: float | None, now: float) -> None:
        """`quiet_for`: seconds since the last datagram from any member reached this
        node (None: no member heard yet)."""
        alone = quiet_for is not None and quiet_for >= self.alone_after
        if alone:
            self.alone = True
        elif self.alone:
            self.alone = False
            self.back_at = now

    def keep_expired(self, left_at: float, expired_at: float, now: float, claimed_elsewhere: bool) -> float | None:
        """A session whose client left at `left_at` expired at `expired_at`: None when
        it may end (every member heard all along since, no claim elsewhere from before
        its expiry, or kept long enough), else until when to keep it (ask again then)."""
        last = expired_at + self.max_keep
        if now >= last or not self.peers:
            return None
        if self.unreachable or self.alone or claimed_elsewhere:
            return min(now + self.settle, last)
        if self.back_at < left_at:
            return None
        until = self.back_at + self.settle
        return min(until, last) if until > now else None
