"""The will of a session whose owner died and whose client has not come back
(issue 29): when a replica sends it.  Pure.

The owner's death lost the client's connection (a client connected then), so its will
is due its delay after the death, or when its session ends if that comes first (MQTT 5
3.1.3.2.2: a will whose delay outlives the session is sent when the session ends); a
client that had left before has the due time its owner recorded.  Which replica sends
it, once across the cluster, is `responsible`'s answer; the service
(`replication.service`) asks, sends, and clears the will from every copy.
"""

from __future__ import annotations

from typing import Iterable

from mqtt import Will
from replication.placement import ranked
from session_store import records
from session_store.model import NEVER_EXPIRES


def will_due(record: bytes, level: int, disconnected_at: float | None, expiry: int,
             owner_dead_at: float) -> tuple[Will, float]:
    """The will in `record` (`records.encode_will`) and when it is due, wall seconds,
    for a copy whose owner was seen dead at `owner_dead_at`.  Raises
    `records.RecordError` for a record that does not decode."""
    will, due = records.decode_will(record)
    if due is None:  # connected when its owner died: the connection was lost then
        delay = (will.properties.will_delay_interval or 0) if level == 5 else 0
        due = owner_dead_at + delay
    left_at = disconnected_at if disconnected_at is not None else owner_dead_at
    if expiry != NEVER_EXPIRES:
        due = min(due, left_at + expiry)
    return will, due


def ranked_before(client_id: str, node_id: str, owner: str, alive: Iterable[str]) -> list[str]:
    """The live members (the dead owner aside) that come before `node_id` in the
    session's rendezvous order: the first of them that holds a copy sends the will, and
    this node only when none does."""
    order = ranked(client_id, [m for m in alive if m != owner] + [node_id])
    return order[:order.index(node_id)]
