"""What a node is to do with a message forwarded to it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ForwardTarget:
    """One remote node's share of a publish: built by the broker (plain routes, shared
    groups given to that node, retained replicas), sent by the cluster.  Immutable, so
    one instance (`PLAIN_ONLY`) serves every node of every publish that only has plain
    subscribers there (the common case: no object per node per message); a share that
    gains a group or a retained copy is replaced (`with_group`, `keeping_retained`)."""

    plain: bool  # deliver to its plain subscribers
    groups: tuple[tuple[str, str], ...]  # (group, filter): shared groups it serves for this message
    keep_retained: bool  # keep the message as its topic's retained one
    # Maybe sent once already (a delayed message fired again after a restart): the
    # receiver drops a copy it took (`routing.wire.ForwardedItem.replay`).
    replay: bool = False

    def with_group(self, key: tuple[str, str]) -> "ForwardTarget":
        return ForwardTarget(self.plain, (*self.groups, key), self.keep_retained, self.replay)

    def keeping_retained(self) -> "ForwardTarget":
        return ForwardTarget(self.plain, self.groups, True, self.replay)

    def replayed(self) -> "ForwardTarget":
        return ForwardTarget(self.plain, self.groups, self.keep_retained, True)


PLAIN_ONLY = ForwardTarget(True, (), False)  # plain subscribers there, nothing else
GROUPS_ONLY = ForwardTarget(False, (), False)  # the start of a share of shared groups only
RETAINED_ONLY = ForwardTarget(False, (), True)  # no subscriber there: a replica of the retained message
PLAIN_REPLAY = ForwardTarget(True, (), False, True)  # a held message replayed to its member's plain subscribers
