"""What an operator sees of one bridge besides its queue: the connection's state and
the last error, with when it happened (API `GET /api/v1/bridges/<id>`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class BridgeStatus:
    state: str = "starting"  # starting | connecting | connected | backoff | stopped
    last_error: str | None = None
    last_error_at: float | None = None  # wall seconds
    connected_since: float | None = None  # wall seconds
    retry_in_s: float | None = None  # the backoff wait, while in backoff
    connects_total: int = 0
    errors_total: int = 0
    echoes_dropped: int = 0  # ingress messages dropped as our own egress coming back
    received_total: int = 0  # ingress messages published here

    def failed(self, error: str, wall: float) -> None:
        self.state = "backoff"
        self.connected_since = None
        self.last_error = error
        self.last_error_at = wall
        self.errors_total += 1

    def as_dict(self) -> dict[str, object]:
        return {
            "state": self.state, "last_error": self.last_error, "last_error_at": self.last_error_at,
            "connected_since": self.connected_since, "retry_in_s": self.retry_in_s,
            "connects_total": self.connects_total, "errors_total": self.errors_total,
            "echoes_dropped": self.echoes_dropped, "received_total": self.received_total,
        }
