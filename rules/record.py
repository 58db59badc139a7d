"""What a rule reads: one message or one event, as the SQL sees it (`RuleInput`), and
the event sources a rule can select from."""

from __future__ import annotations

import json
from typing import Any

from session_store.model import Message

# FROM "$events/<name>": the hook point each event source follows.
EVENT_SOURCES: dict[str, str] = {
    "$events/client_connected": "client.connected",
    "$events/client_disconnected": "client.disconnected",
    "$events/session_subscribed": "session.subscribed",
    "$events/session_unsubscribed": "session.unsubscribed",
    "$events/message_delivered": "message.delivered",
    "$events/message_acked": "message.acked",
    "$events/message_dropped": "message.dropped",
}

# Every field a rule may name (besides `payload.<path>` and `user_properties.<name>`).
# A message has the first group; an event has what its source gives (README "Rules").
FIELDS: frozenset[str] = frozenset({
    "id", "event", "clientid", "username", "topic", "qos", "retain", "payload", "user_properties", "node",
    "timestamp", "peer", "reason", "protocol",
})


class NotJson(ValueError):
    """A rule read a field of a payload that is not a JSON object."""


_UNSET: Any = object()


class RuleInput:
    """One message (event `message.publish`) or one event, with its payload decoded as
    JSON at most once however many rules read it. `message` is the broker's own record
    (None for client and session events): actions that forward it (a bridge) keep its
    QoS and properties."""

    __slots__ = ("event", "clientid", "username", "topic", "qos", "retain", "payload", "user_properties", "node",
                 "timestamp", "id", "peer", "reason", "protocol", "message", "_json", "_text")

    def __init__(self, event: str, *, node: str, timestamp: int, clientid: str | None = None,
                 username: str | None = None, topic: str | None = None, qos: int | None = None,
                 retain: bool | None = None, payload: bytes = b"", user_properties: dict[str, str] | None = None,
                 id: str | None = None, peer: str | None = None, reason: str | None = None,
                 protocol: int | None = None, message: Message | None = None) -> None:
        self.event = event
        self.node = node
        self.timestamp = timestamp  # milliseconds since the epoch
        self.clientid = clientid
        self.username = username
        self.topic = topic
        self.qos = qos
        self.retain = retain
        self.payload = payload
        self.user_properties = user_properties if user_properties is not None else {}
        self.id = id
        self.peer = peer
        self.reason = reason
        self.protocol = protocol
        self.message = message
        self._json: Any = _UNSET
        self._text: str | None = None

    @classmethod
    def of_message(cls, msg: Message, *, event: str, node: str, timestamp: int, username: str | None = None,
                   clientid: str | None = None, reason: str | None = None) -> "RuleInput":
        # Slots set directly: this runs once per message a rule reads (the hot path).
        self = cls.__new__(cls)
        props = msg.properties.user_properties
        self.event = event
        self.node = node
        self.timestamp = timestamp
        self.clientid = clientid if clientid is not None else msg.publisher
        self.username = username
        self.topic = msg.topic
        self.qos = msg.qos
        self.retain = msg.retain
        self.payload = msg.payload
        self.user_properties = dict(props) if props else {}
        self.id = f"{msg.origin}:{msg.msg_id}"
        self.peer = None
        self.reason = reason
        self.protocol = None
        self.message = msg
        self._json = _UNSET
        self._text = None
        return self

    def payload_text(self) -> str:
        if self._text is None:
            self._text = self.payload.decode("utf-8", "replace")
        return self._text

    def payload_json(self) -> Any:
        """The payload as JSON (decoded once); raises NotJson when it is not."""
        if self._json is _UNSET:
            try:
                self._json = json.loads(self.payload)
            except (ValueError, UnicodeDecodeError):
                self._json = NotJson("the payload is not JSON")
        if isinstance(self._json, NotJson):
            raise self._json
        return self._json

    def field(self, name: str) -> Any:
        """A field by name, as `SELECT *` and templates read it (payload as text)."""
        if name == "payload":
            return self.payload_text()
        return getattr(self, name)

    def as_dict(self) -> dict[str, Any]:
        """Every field this input has (`SELECT *`): a message's or an event's."""
        out: dict[str, Any] = {}
        for name in ("id", "event", "clientid", "username", "topic", "qos", "retain", "payload", "user_properties",
                     "node", "timestamp", "peer", "reason", "protocol"):
            value = self.field(name)
            if value is not None and (name != "payload" or self.topic is not None):
                out[name] = value
        return out
