"""What happened in one simulated cluster run, as the clients and the operator saw it.

The workload (`simulation.cluster_sim`) appends events as they happen, each stamped
with the virtual time; the checkers (`simulation.checkers`) read them afterwards and
never the other way round.  A message is named by its payload, `<publisher>/<conn>/<seq>`
(the publisher's client id, which of its connections sent it, its sequence number on
that connection), so a delivery names the publish it comes from without any help
from the broker.

Every event prints as one line (`str(event)`), which is what a violation shows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Union


def message_id(publisher: str, conn: int, seq: int) -> str:
    return f"{publisher}/{conn}/{seq}"


def parse_message_id(payload: bytes) -> tuple[str, int, int] | None:
    """(publisher, conn, seq) from a payload the workload made, else None."""
    try:
        publisher, conn, seq = payload.decode("ascii").split("/")
        return publisher, int(conn), int(seq)
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class Sent:
    at: float
    msg: str  # message id
    publisher: str
    conn: int  # the publisher's connection number
    seq: int
    node: str
    topic: str
    qos: int

    def __str__(self) -> str:
        return f"{self.at:9.3f} publish sent   {self.msg} qos={self.qos} topic={self.topic} via {self.node}"


@dataclass(frozen=True, slots=True)
class Acked:
    at: float
    msg: str
    reason: int  # PUBACK / PUBCOMP reason code

    def __str__(self) -> str:
        return f"{self.at:9.3f} publish acked  {self.msg} reason=0x{self.reason:02x}"


@dataclass(frozen=True, slots=True)
class Unacked:
    """A publish whose acknowledgement never came (connection lost, or too slow)."""

    at: float
    msg: str
    why: str

    def __str__(self) -> str:
        return f"{self.at:9.3f} publish failed {self.msg}: {self.why}"


@dataclass(frozen=True, slots=True)
class Connected:
    at: float
    client: str
    conn: int
    node: str
    clean_start: bool
    expiry: int
    reason: int
    session_present: bool

    def __str__(self) -> str:
        return (f"{self.at:9.3f} connect        {self.client}#{self.conn} to {self.node} clean_start={self.clean_start}"
                f" expiry={self.expiry} reason=0x{self.reason:02x} session_present={self.session_present}")


@dataclass(frozen=True, slots=True)
class ConnectFailed:
    at: float
    client: str
    node: str
    why: str

    def __str__(self) -> str:
        return f"{self.at:9.3f} connect failed {self.client} to {self.node}: {self.why}"


@dataclass(frozen=True, slots=True)
class Disconnected:
    at: float
    client: str
    conn: int
    how: str  # "disconnect" (clean), "drop" (the client vanished), "lost" (the node closed it)

    def __str__(self) -> str:
        return f"{self.at:9.3f} disconnected   {self.client}#{self.conn} ({self.how})"


@dataclass(frozen=True, slots=True)
class Subscribed:
    at: float
    client: str
    conn: int
    topic_filter: str
    qos: int
    reason: int  # the SUBACK's reason code (the granted QoS when < 0x80)

    def __str__(self) -> str:
        return f"{self.at:9.3f} suback         {self.client}#{self.conn} {self.topic_filter} qos={self.qos} reason=0x{self.reason:02x}"


@dataclass(frozen=True, slots=True)
class Delivered:
    at: float
    client: str
    conn: int
    msg: str
    topic: str
    qos: int
    dup: bool
    retain: bool
    packet_id: int | None

    def __str__(self) -> str:
        return (f"{self.at:9.3f} delivered      {self.msg} to {self.client}#{self.conn} qos={self.qos}"
                f" dup={self.dup} packet_id={self.packet_id}")


@dataclass(frozen=True, slots=True)
class QueueDrop:
    """A node's broker dropped queued messages of a session (its queue limit)."""

    at: float
    node: str
    client: str
    count: int  # this session's drops on that node since the previous sample
    metric: int  # the node's `dropped_queue_full` metric since the previous sample

    def __str__(self) -> str:
        return f"{self.at:9.3f} queue drop     {self.client} at {self.node}: {self.count} dropped (metric +{self.metric})"


@dataclass(frozen=True, slots=True)
class Fault:
    """Something the operator did to the cluster: kill, restart, cut, heal, skew, config."""

    at: float
    what: str

    def __str__(self) -> str:
        return f"{self.at:9.3f} fault          {self.what}"


Event = Union[Sent, Acked, Unacked, Connected, ConnectFailed, Disconnected, Subscribed, Delivered, QueueDrop, Fault]


@dataclass
class History:
    events: list[Event] = field(default_factory=list)
    healed_at: float = 0.0  # when the last fault was undone (the quiet period starts)
    ended_at: float = 0.0

    def add(self, event: Event) -> None:
        self.events.append(event)

    def extend(self, events: Iterable[Event]) -> None:
        self.events.extend(events)

    def ordered(self) -> list[Event]:
        """By virtual time; events at the same instant keep the order they were added in."""
        return sorted(self.events, key=lambda e: e.at)
