"""What a node is to do with a message forwarded to it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class ForwardTarget:
    """One remote node's share of a publish: built by the broker (plain routes, shared
    groups given to that node, retained replicas), sent by the cluster."""

    plain: bool  # deliver to its plain subscribers
    groups: list[tuple[str, str]]  # (group, filter): shared groups it serves for this message
    keep_retained: bool  # keep the message as its topic's retained one
    # Maybe sent once already (a delayed message fired again after a restart): the
    # receiver drops a copy it took (`routing.wire.ForwardedItem.replay`).
    replay: bool = False
