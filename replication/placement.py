"""Where a session's copies live: rendezvous (highest-random-weight) hashing.

Pure.  Every member scores every (client id, member) pair with the same hash and the
session's replicas are the best-scoring members, so any node that sees the same live
members computes the same set without asking anyone (no coordinator, no ring to keep).
A member that joins takes over only the sessions for which it now scores in the top
`count`; one that leaves gives up only its own (Thaler and Ravishankar, 1998).

The hash is BLAKE2b, not Python's `hash()`: the string hash is seeded per process, and
every node must agree.
"""

from __future__ import annotations

import hashlib
from typing import Iterable


def weight(client_id: str, member: str) -> int:
    """The member's score for a client id: the same on every node and in every process."""
    digest = hashlib.blake2b(f"{client_id}\0{member}".encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def ranked(client_id: str, members: Iterable[str]) -> list[str]:
    """Members best first for this client id (ties, which need a 64-bit collision,
    broken by the member id)."""
    return sorted(set(members), key=lambda m: (-weight(client_id, m), m))


def replicas_for(client_id: str, owner: str, members: Iterable[str], copies: int) -> list[str]:
    """The members that keep a copy of `owner`'s session besides the owner itself: the
    `copies - 1` best-scoring live members other than the owner (fewer when fewer are
    alive: the session is then under-replicated)."""
    if copies <= 1:
        return []
    return [m for m in ranked(client_id, members) if m != owner][:copies - 1]
