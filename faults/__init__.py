"""BUGGIFY (FoundationDB's idea): deliberate defects that the cluster simulator's
checkers must catch, switched on only by `meshd simulate --cluster --buggify FAULT`.

A leaf package, below everything: the real code paths read a module-level flag,
`faults.DROP_FORWARD` and so on, which is False unless a simulation switched the
fault on, so a node pays one global lookup and a not-taken branch for each (nothing
else). Which faults exist and where each one lives:

==================== ====================================================================
fault                defect
==================== ====================================================================
drop-forward         routing/cluster.py `Cluster.forward`: a QoS >= 1 forward is not sent,
                     but its publisher is acknowledged as if the peer had taken it
skip-sync            mesh/node.py `Node._commit_once`: acknowledgements are released
                     before the batch is written, which happens a second later
reorder-queue        session_store/model.py `Session.enqueue`: a new delivery jumps ahead
                     of the one queued before it
double-deliver-qos2  mesh/broker.py `Broker.deliver`: a QoS 2 delivery goes to the session
                     twice, as two messages
forget-route         routing/table.py `RouteTable._drain`: a peer's route addition is
                     counted (its version advances) but not applied
stale-owner          routing/handoff_driver.py `Handoffs._handed_over` and
                     `_push_foreign_copies`: the old owner keeps its copy of a session it
                     handed over (and never pushes it to the owner to be merged)
ack-before-replica   replication/service.py `Replication._update_floor`: in sync
                     replication, acknowledgements no longer wait for the replicas
                     (which `_send_loop` makes lag 2 s behind, so a crash falls in the gap)
==================== ====================================================================

The flags are plain module globals on purpose: `from faults import DROP_FORWARD` would
copy the value at import time, so code reads `faults.DROP_FORWARD` where it decides.
"""

from __future__ import annotations

FAULTS: tuple[str, ...] = (
    "drop-forward",
    "skip-sync",
    "reorder-queue",
    "double-deliver-qos2",
    "forget-route",
    "stale-owner",
    "ack-before-replica",
)

DROP_FORWARD = False
SKIP_SYNC = False
REORDER_QUEUE = False
DOUBLE_DELIVER_QOS2 = False
FORGET_ROUTE = False
STALE_OWNER = False
ACK_BEFORE_REPLICA = False


def _flag(name: str) -> str:
    return name.upper().replace("-", "_")


def switch_on(names: list[str] | tuple[str, ...]) -> None:
    """Turn exactly `names` on (every other fault off); ValueError for an unknown one."""
    unknown = [n for n in names if n not in FAULTS]
    if unknown:
        raise ValueError(f"unknown fault {unknown[0]!r} (faults: {', '.join(FAULTS)})")
    for name in FAULTS:
        globals()[_flag(name)] = name in names


def switch_off() -> None:
    """Every fault off (the state a node runs in)."""
    switch_on(())


def active() -> list[str]:
    """The faults that are on, in `FAULTS` order."""
    return [name for name in FAULTS if globals()[_flag(name)]]
