"""Convergence traces: the contract between a running mesh and `meshd report`.

Every node appends one JSON object per observation to ``<dir>/<node_id>.jsonl``
(rotated by size to ``<node_id>.jsonl.1`` .. ``.N``, newest first after the live file).
The simulator writes the same schema in virtual time with ``sim: true``.

Fields (see DESIGN.md, "Traces"):

==============  =======  ===================================================
field           type     meaning
==============  =======  ===================================================
ts_us           int      when this node observed it (wall or virtual clock, µs)
node            str      the observer
kind            str      one of TRACE_KINDS
subject         str      member / filter / key / client id the event is about
origin          str      node that caused the event
origin_ts_us    int      when the origin made it
event_id        str      unique per origin event
hops            int      0 for the origin's own first observation
incarnation     int      member incarnation, where it applies (else null)
sim             bool     written by the simulator
peers           str      partition records: the other side, comma separated
majority        bool     partition_detected: our side holds the majority
took_us         int      partition records: detection / heal duration (µs)
suspicion_us    int      partition_detected: minimum suspicion timeout (µs)
==============  =======  ===================================================

The first observation of an event by its origin has ``hops`` 0 and
``ts_us == origin_ts_us``.  ``spark_analysis.schema`` declares the same fields as a
Spark ``StructType``; ``tests/spark_analysis`` proves the two agree.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Protocol, TextIO

TRACE_FIELDS: tuple[str, ...] = (
    "ts_us",
    "node",
    "kind",
    "subject",
    "origin",
    "origin_ts_us",
    "event_id",
    "hops",
    "incarnation",
    "sim",
)

# Written only by some kinds, absent (null) elsewhere: partition records carry the
# other side (``peers``, comma separated), whether ours is the ``majority`` side,
# and ``took_us`` (detection: onset to detection; heal: first contact to one view).
# ``suspicion_us`` on a detection is the minimum suspicion timeout for the view's size,
# the yardstick for its detection time.
# ``session_handoff`` records (written by the node the session moved to, or by the one
# whose copy was merged) carry ``to``, ``outcome`` (ok / fallback / merged / replica:
# taken from a replica), ``reason`` (why a fallback), ``duration_ms`` and ``messages``
# (messages that came along).
OPTIONAL_FIELDS: tuple[str, ...] = (
    "peers", "majority", "took_us", "suspicion_us", "to", "outcome", "reason", "duration_ms", "messages",
)

TRACE_KINDS: frozenset[str] = frozenset(
    {
        "node_start",
        "node_stop",
        "node_crash",
        "member_alive",
        "member_suspect",
        "member_dead",
        "member_left",
        "broadcast",
        "route_add",
        "route_del",
        "config_set",
        "partition_detected",
        "partition_healed",
        "session_handoff",
    }
)

DEFAULT_MAX_BYTES = 64 * 1024 * 1024
DEFAULT_BACKUPS = 5


def trace_record(
    *,
    ts_us: int,
    node: str,
    kind: str,
    subject: str = "",
    origin: str | None = None,
    origin_ts_us: int | None = None,
    event_id: str | None = None,
    hops: int = 0,
    incarnation: int | None = None,
    sim: bool = False,
    **extra: object,
) -> dict[str, object]:
    """Build one trace record; defaults make it the origin's own first observation."""
    if kind not in TRACE_KINDS:
        raise ValueError(f"unknown trace kind {kind!r}")
    origin = node if origin is None else origin
    origin_ts_us = ts_us if origin_ts_us is None else origin_ts_us
    if event_id is None:
        event_id = f"{origin}:{kind}:{subject}:{origin_ts_us}"
    record: dict[str, object] = {
        "ts_us": int(ts_us),
        "node": node,
        "kind": kind,
        "subject": subject,
        "origin": origin,
        "origin_ts_us": int(origin_ts_us),
        "event_id": event_id,
        "hops": int(hops),
        "incarnation": incarnation,
        "sim": sim,
    }
    record.update(extra)
    return record


class Tracer(Protocol):
    """What a component that records observations needs: ``TraceWriter``,
    ``NullTraceWriter``, or a list in a test."""

    def emit(self, **fields: object) -> None: ...


class TraceWriter:
    """Append-only JSON Lines writer for one node, rotated by size.

    Writes go to a buffered file (page cache, no fsync): traces are analysis data,
    and losing the last few lines on a crash is what a crash looks like in a report.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        node_id: str,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        backups: int = DEFAULT_BACKUPS,
    ) -> None:
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        self.directory = Path(directory)
        self.node_id = node_id
        self.max_bytes = max_bytes
        self.backups = backups
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / f"{node_id}.jsonl"
        self._file: TextIO | None = None
        self._size = 0
        self.records_written = 0

    def _open(self) -> TextIO:
        if self._file is None:
            self._file = open(self.path, "a", encoding="utf-8")
            self._size = self._file.tell()
        return self._file

    def write(self, record: dict[str, object]) -> None:
        line = json.dumps(record, separators=(",", ":"), ensure_ascii=False) + "\n"
        f = self._open()
        f.write(line)
        self._size += len(line.encode("utf-8"))
        self.records_written += 1
        if self._size >= self.max_bytes:
            self._rotate()

    def emit(self, **fields: Any) -> None:  # forwarded to trace_record's typed parameters
        """Shorthand: ``emit(ts_us=..., kind=..., ...)`` with ``node`` filled in."""
        fields.setdefault("node", self.node_id)
        self.write(trace_record(**fields))

    def _rotate(self) -> None:
        self.close()
        if self.backups <= 0:
            self.path.unlink(missing_ok=True)
            return
        for i in range(self.backups - 1, 0, -1):
            older = self.directory / f"{self.node_id}.jsonl.{i}"
            if older.exists():
                older.replace(self.directory / f"{self.node_id}.jsonl.{i + 1}")
        self.path.replace(self.directory / f"{self.node_id}.jsonl.1")

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
            self._size = 0

    def __enter__(self) -> "TraceWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class NullTraceWriter:
    """Stands in for TraceWriter when tracing is off (`--no-trace`)."""

    records_written = 0

    def write(self, record: dict[str, object]) -> None:
        return None

    def emit(self, **fields: Any) -> None:
        return None

    def flush(self) -> None:
        return None

    def close(self) -> None:
        return None
