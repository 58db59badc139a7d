"""The mesh port: what the broker and the cluster share, built before both.

The broker asks the mesh where a publish must go (plain routes, shared groups,
retained replicas) and tells it what to forward and which routes and sessions changed;
the cluster answers from the route table and delivers to the broker.  Neither is built
inside the other: the node builds the route table and this port first, gives the port
to the broker and to the cluster, and gives the broker to the cluster.

- Route questions are answered here, from the table (the cluster keeps it current).
  `plain_nodes` and `retained_targets` are the table's and the members' own bound
  methods, so a publish pays no extra call for the indirection.
- Route changes wait in a queue that the cluster drains (changes made while the
  store is restored, before the cluster exists, wait there too).
- Forwards and ended sessions go to handlers the cluster registers at its
  construction (`on_forward`, `on_session_ended`); until then a forward has no target
  (the table is empty) and an ended session owns no claim.
- A CONNECT asks the registered claims (the handoff driver) whether it may go on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Protocol

import trio

from routing.table import RouteTable

if TYPE_CHECKING:
    from routing.forward import ForwardTarget
    from routing.links import AckGate
    from session_store.model import Message

# Returns how many unreachable members the message was held for (they count as matched).
Forward = Callable[["Message", "dict[str, ForwardTarget]", "AckGate | None"], int]


class Members(Protocol):
    def alive_members(self) -> list[str]: ...


class ConnectClaims(Protocol):
    """The cluster-wide claim on a client id, taken before a CONNECT opens its session."""

    def connect_is_local(self, client_id: str, clean_start: bool, persistent: bool) -> bool: ...

    async def prepare_connect(self, client_id: str, clean_start: bool, persistent: bool) -> str: ...


def _no_forward(msg: "Message", targets: "dict[str, ForwardTarget]", gate: "AckGate | None") -> int:
    """Before the cluster registers its own: the route table is empty, so no forward has a target."""
    return 0


def _no_session(client_id: str) -> None:
    """Before the cluster registers its own: no ended session can hold a claim yet."""


def _never_keep(client_id: str, left_at: float, expired_at: float, now: float) -> float | None:
    """Before the cluster registers its own: no other member, so no resume elsewhere."""
    return None


def _holds_nothing() -> bool:
    """Before the cluster registers its own: nothing is held for any member."""
    return False


class MeshPort:
    def __init__(self, table: RouteTable, members: Members) -> None:
        self.table = table
        # Bound methods on purpose: the publish path calls them once per message.
        self.plain_nodes: Callable[[str], frozenset[str]] = table.match_nodes
        self.retained_targets: Callable[[], list[str]] = members.alive_members
        self.forward: Forward = _no_forward
        self.session_ended: Callable[[str], None] = _no_session
        # Whether a session that expires here is kept a while: its client may have
        # resumed it on a member this node could not hear (routing.contact).
        self.keep_expired: Callable[[str, float, float, float], float | None] = _never_keep
        self.holding: Callable[[], bool] = _holds_nothing  # traffic held for an unreachable member?
        self._claims: ConnectClaims | None = None
        self._shared_next: dict[tuple[str, str], int] = {}
        self._route_changes: list[tuple[str, bool]] = []
        self._routes_wake = trio.Event()

    # ------------------------------------------------------------ registration

    def on_forward(self, handler: Forward) -> None:
        self.forward = handler

    def on_session_ended(self, handler: Callable[[str], None]) -> None:
        self.session_ended = handler

    def on_holding(self, handler: Callable[[], bool]) -> None:
        self.holding = handler

    def stays_here(self, retain: bool) -> bool:
        """Whether a local publish goes to no other node, whatever its topic: no remote
        route (plain or shared), nothing held for an unreachable member, and not a
        retained message (those are replicated). A single node's publish then skips
        the route lookups and the forward altogether."""
        table = self.table
        return not retain and not len(table.trie) and not len(table.shared_trie) and not self.holding()

    def on_expiry(self, handler: Callable[[str, float, float, float], float | None]) -> None:
        self.keep_expired = handler

    def serve_connects(self, claims: ConnectClaims) -> None:
        self._claims = claims

    # ------------------------------------------------------------ routes

    def shared_nodes(self, topic: str) -> dict[tuple[str, str], set[str]]:
        table = self.table
        return table.match_shared(topic) if len(table.shared_trie) else {}

    def has_shared_routes(self) -> bool:
        """Whether any node has a shared subscription (else a publish weighs no groups)."""
        return len(self.table.shared_trie) > 0

    def pick_shared_node(self, key: tuple[str, str], candidates: list[str]) -> str:
        """Round-robin over the nodes with members of a shared group (this node too)."""
        i = self._shared_next.get(key, 0)
        self._shared_next[key] = i + 1
        return candidates[i % len(candidates)]

    def route_changed(self, topic_filter: str, present: bool) -> None:
        """A filter got its first local subscriber or lost its last."""
        self._route_changes.append((topic_filter, present))
        self._routes_wake.set()

    async def wait_for_route_changes(self) -> None:
        """Until at least one change is queued."""
        while not self._route_changes:
            self._routes_wake = trio.Event()
            await self._routes_wake.wait()

    def local_filters(self) -> set[str]:
        """The filters this node has local subscribers for, including changes not yet
        flushed into the table (what the cluster's route tables must converge to)."""
        filters = set(self.table.local_filters())
        for topic_filter, present in self._route_changes:
            if present:
                filters.add(topic_filter)
            else:
                filters.discard(topic_filter)
        return filters

    def take_route_changes(self, limit: int | None = None) -> list[tuple[str, bool]]:
        """The changes queued so far (the oldest `limit` of them, when given), oldest
        first; the rest stay queued."""
        if limit is not None and len(self._route_changes) > limit:
            changes = self._route_changes[:limit]
            del self._route_changes[:limit]
            return changes
        changes, self._route_changes = self._route_changes, []
        return changes

    def has_route_changes(self) -> bool:
        return bool(self._route_changes)

    # ------------------------------------------------------------ connects

    def connect_is_local(self, client_id: str, clean_start: bool, persistent: bool) -> bool:
        claims = self._claims
        return claims is not None and claims.connect_is_local(client_id, clean_start, persistent)

    async def prepare_connect(self, client_id: str, clean_start: bool, persistent: bool) -> str:
        claims = self._claims
        if claims is None:
            return "ok"
        return await claims.prepare_connect(client_id, clean_start, persistent)
