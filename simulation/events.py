"""What the cluster simulation reports as it runs: one history of client and fault
events, in the order they happened, for checkers and for comparing two runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class SimEvent:
    """One thing that happened, at virtual time `at`.

    Kinds and their `detail` keys:
      connect (clean_start, session_expiry), connack (reason, session_present),
      publish (topic, payload, qos, retain, packet_id): a client sent a PUBLISH,
      acked (topic, payload, qos, packet_id, reason): its PUBACK / PUBCOMP came,
      resend (packet_id, packet): a PUBLISH (DUP) or PUBREL sent again after a reconnect,
      deliver (topic, payload, qos, dup, retain, packet_id): a client received one,
      subscribed (filter, qos, reason), unsubscribed (filter),
      disconnect, drop, lost (why), kicked (reason): a client's connection ended,
      kill, restart, stop, cut (a, b, one_way), heal, skew (seconds), slow_disk (seconds):
      the harness's faults.
    """

    at: float
    kind: str
    node: str | None = None
    client: str | None = None
    detail: dict[str, object] = field(default_factory=dict)


class Emit(Protocol):
    def __call__(self, kind: str, *, node: str | None = None, client: str | None = None,
                 **detail: object) -> None: ...
