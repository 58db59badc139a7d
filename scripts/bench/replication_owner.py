#!/usr/bin/env python3
"""The owner's CPU for session replication, in process and without I/O: what
`replication.service.Replication` adds per message to a session owner's store calls.

A `MemoryStore` with the replication tap (2 copies, the replica n1) or without it
(1 copy) takes, per message, what a subscriber that keeps up causes: the delivery
queued (a third goes straight into flight, as when the window has room), sent, and
acknowledged once `--in-flight` newer ones were sent.  Every `--per-batch` messages a
`repl` batch is built, CBOR-encoded as the channel sends it, and confirmed; the
store commits every 300.  Process time per message, best of `--reps`, each
configuration in turn, so the machine's load moves all of them alike:

    python scripts/bench/replication_owner.py
    python scripts/bench/replication_owner.py --in-flight 32 --per-batch 800

`scripts/bench/replication.py` measures the real thing (three meshd processes); this
isolates the owner's bookkeeping, which that bench cannot resolve on a shared machine.
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time
import types
from collections import deque
from pathlib import Path
from typing import Any

import cbor2

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mqtt import EMPTY_PROPERTIES  # noqa: E402
from replication.service import Replication  # noqa: E402
from session_store.model import Delivery, Message, Session  # noqa: E402
from session_store.store import MemoryStore  # noqa: E402

COMMIT_EVERY = 300
STRAIGHT_TO_FLIGHT = 0.34  # of the messages: sent without being queued first


class _Clock:
    def now(self) -> float:
        return 0.0

    def wall(self) -> float:
        return 1_700_000_000.0


class _Broker:
    def __init__(self) -> None:
        self.sessions: dict[str, Session] = {}

    def on_durable(self) -> None: ...


class _Queries:
    def handle(self, *args: object) -> None: ...

    def handle_pipelined(self, *args: object) -> None: ...


class _Members:
    def alive_members(self) -> list[str]:
        return ["n0", "n1", "n2"]


class _Claims:
    def get(self, client_id: str) -> object:
        return types.SimpleNamespace(owner="n0", stamp=types.SimpleNamespace(to_wire=lambda: [1, 0, "n0"]))


def one_run(copies: int, mode: str, messages: int, per_batch: int, in_flight: int) -> float:
    """Microseconds of process time per message."""
    store = MemoryStore()
    broker = _Broker()
    fakes: dict[str, Any] = {"store": store, "broker": broker, "queries": _Queries(), "members": _Members(),
                             "clock": _Clock()}
    r = Replication(node_id="n0", copies=copies, mode=mode, **fakes)
    claims: Any = _Claims()
    r.use_claims(claims)
    session = Session("c", True, expiry_interval=3600)
    broker.sessions["c"] = session
    tracked = r._track("c") if copies > 1 else None
    peer = r._peers[tracked.replicas[0]] if tracked is not None and tracked.replicas else None

    def batch() -> None:
        if peer is None:
            return
        number, taken, request = r._next_batch(peer, compact=True)
        cbor2.dumps({"v": 1, "t": "qc", "from": "n0", "a": {"b": request}})
        r._confirmed(peer, number, taken, {})

    batch()  # the snapshot
    msgs = [Message("bench/repl", b"x" * 64, 1, False, EMPTY_PROPERTIES, publisher="pub", msg_id=i, origin="n1")
            for i in range(messages)]
    rng = random.Random(1)
    straight = [rng.random() < STRAIGHT_TO_FLIGHT for _ in range(messages)]
    window: deque[Delivery] = deque()
    gc.collect()
    started = time.process_time()
    for i in range(messages):
        d = Delivery(msgs[i], 1, False, ())
        d.seq = session.take_seq()
        if not straight[i]:
            store.put_queued("c", d)
        store.put_inflight("c", i % 65535 + 1, d, "publish")
        window.append(d)
        if len(window) > in_flight:
            store.release_delivery("c", window.popleft())
        if i % per_batch == per_batch - 1:
            batch()
        if i % COMMIT_EVERY == COMMIT_EVERY - 1:
            store.take_batch()
            store.mark_durable(store.write_epoch)
    return (time.process_time() - started) / messages * 1e6


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, default=60_000)
    p.add_argument("--per-batch", type=int, default=800, help="messages between two batches (default 800)")
    p.add_argument("--in-flight", type=int, default=0,
                   help="messages sent and not yet acknowledged (default 0: each acknowledged before the next)")
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args()
    configs = ((1, "sync"), (2, "async"), (2, "sync"))
    best: dict[tuple[int, str], float] = {}
    for _ in range(args.reps):
        for copies, mode in configs:
            us = one_run(copies, mode, args.messages, args.per_batch, args.in_flight)
            best[(copies, mode)] = min(best.get((copies, mode), float("inf")), us)
    one = best[(1, "sync")]
    print(f"{args.messages} messages, a batch every {args.per_batch}, {args.in_flight} in flight; "
          f"process time per message, best of {args.reps}")
    for (copies, mode), us in best.items():
        name = "1 copy" if copies == 1 else f"{copies} {mode}"
        print(f"{name:<8} {us:6.2f} us   replication adds {us - one:5.2f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
