"""What the broker calls on a connected client: the one seam between `mesh.broker` and
`mesh.connection` (the broker never imports the connection class)."""

from __future__ import annotations

from typing import Protocol

from mqtt import Will
from session_store.model import Delivery, Session



class ClientPort(Protocol):
    @property
    def session(self) -> Session | None:
        """The session this client is attached to (None before its CONNECT is accepted)."""

    @property
    def protocol_level(self) -> int: ...

    # What the operator's view of a client shows (`mesh.inventory`).
    @property
    def peer(self) -> str:
        """The client's address, `host:port`."""

    @property
    def username(self) -> str | None: ...

    @property
    def transport(self) -> str:
        """The listener it came through: tcp, mqtts, ws or wss."""

    @property
    def keep_alive(self) -> int:
        """The keep alive granted, in seconds (0: none)."""

    def deliver(self, delivery: Delivery, now: float) -> None:
        """Send now, or queue behind the client's inflight window."""

    def close(self, reason: int | None = None) -> None:
        """End the connection from the server side (DISCONNECT `reason` on v5)."""

    def take_will(self) -> Will | None:
        """The will, which the client then no longer has."""

    def release_acks(self, durable_epoch: int) -> bool:
        """Send the acknowledgements that no longer wait; True when none are left."""
