"""The cluster-wide session ownership register: client id -> (owner node, HLC stamp).

Pure (no I/O, wall time passed in).  Every CONNECT a node accepts *claims* the client id
with a fresh hybrid-logical-clock stamp; a session that ends *releases* it (a claim with
no owner, a tombstone).  Claims spread by gossip and merge last-writer-wins by
(HLC, node id), so every node converges on one owner per client id whatever order the
claims arrive in, and the newest CONNECT wins a race (DESIGN.md, principle 5).

A claim also says whether the connect started a clean session: a node that sees a newer
clean claim for a client whose persistent session it holds discards that session (clean
start means "forget what you had"), while a newer persistent claim means "the session
moves there" (the takeover itself is `session_store.handoff`).

Tombstones are kept for `TOMBSTONE_TTL_MS` so a late, older claim cannot resurrect an
owner, then pruned.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from clock.hlc import HlcTimestamp, HybridLogicalClock

TOMBSTONE_TTL_MS = 10 * 60 * 1000


@dataclass(frozen=True, slots=True)
class Claim:
    client_id: str
    owner: str | None  # None: released (the session ended)
    stamp: HlcTimestamp
    clean: bool = False  # the claiming CONNECT started a clean session

    def newer_than(self, other: "Claim | None") -> bool:
        return other is None or self.stamp > other.stamp

    def to_wire(self) -> list:
        return [self.client_id, self.owner, self.stamp.to_wire(), self.clean]

    @classmethod
    def from_wire(cls, data: object) -> "Claim":
        if not isinstance(data, list) or len(data) != 4:
            raise ValueError("an ownership claim is a 4-item list")
        client_id, owner, stamp, clean = data
        if not isinstance(client_id, str) or not (owner is None or isinstance(owner, str)) or not isinstance(clean, bool):
            raise ValueError("bad ownership claim")
        return cls(client_id, owner, HlcTimestamp.from_wire(stamp), clean)


class OwnershipRegister:
    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.clock = HybridLogicalClock(node_id)
        self.claims: dict[str, Claim] = {}

    def owner(self, client_id: str) -> str | None:
        claim = self.claims.get(client_id)
        return claim.owner if claim is not None else None

    def get(self, client_id: str) -> Claim | None:
        return self.claims.get(client_id)

    def claim(self, client_id: str, wall_ms: int, *, clean: bool = False) -> Claim:
        """This node takes the client id (a CONNECT arrived here)."""
        claim = Claim(client_id, self.node_id, self.clock.now(wall_ms), clean)
        self.claims[client_id] = claim
        return claim

    def release(self, client_id: str, wall_ms: int) -> Claim | None:
        """The session ended here; None when another node owns the id by now."""
        current = self.claims.get(client_id)
        if current is not None and current.owner != self.node_id:
            return None
        claim = Claim(client_id, None, self.clock.now(wall_ms))
        self.claims[client_id] = claim
        return claim

    def merge(self, claim: Claim, wall_ms: int) -> bool:
        """Take a claim from a peer; True when it is newer than what was known."""
        self.clock.observe(claim.stamp, wall_ms)
        if not claim.newer_than(self.claims.get(claim.client_id)):
            return False
        self.claims[claim.client_id] = claim
        return True

    def prune(self, wall_ms: int) -> int:
        """Drop tombstones older than the TTL; return how many went."""
        old = [cid for cid, c in self.claims.items() if c.owner is None and wall_ms - c.stamp.wall_ms > TOMBSTONE_TTL_MS]
        for cid in old:
            del self.claims[cid]
        return len(old)

    def to_wire(self) -> list:
        return [c.to_wire() for c in self.claims.values()]

    @staticmethod
    def claims_from_wire(data: object) -> Iterable[Claim]:
        if not isinstance(data, list):
            raise ValueError("ownership state is a list of claims")
        return [Claim.from_wire(item) for item in data]
