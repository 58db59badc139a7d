"""The hook points and what a callback at each is given.

Every callback is called as `callback(value, *context)` (message.publish:
`callback(message)`) and answers:

- None: pass (the chain goes on with `value` unchanged);
- another value: the chain goes on with that one (a changed message, a verdict);
- `Stop(value)`: the chain ends here, with `value` (or the current one if None);
- `DROP` (message.publish only): the message goes nowhere.

Only message.publish may be async. client.connect and client.authenticate may run in
a worker thread (when the password file's hash check runs there): they must not call
into Trio.

The value and the context per point:

    client.connect        0, ConnectInfo                  answer a v5 reason code >= 0x80 to refuse the CONNECT
    client.authenticate   AuthVerdict, ConnectInfo        the password file is the built-in first callback
    client.authorize      True, ClientInfo, action, topic action: "publish" | "subscribe"; the ACL is the built-in first callback
    client.connected      None, ClientInfo                notification
    client.disconnected   None, ClientInfo, reason        notification
    session.created       None, client_id                 notification
    session.subscribed    None, client_id, filter, qos    notification
    session.unsubscribed  None, client_id, filter         notification
    session.terminated    None, client_id                 notification
    message.publish       Message, -                      may change or DROP the message; may be async
    message.delivered     None, client_id, Message        notification (a PUBLISH written to a subscriber)
    message.acked         None, client_id, Message        notification (PUBACK / PUBCOMP from a subscriber)
    message.dropped       None, Message, reason           notification (queue full, slow consumer, expired, too large, no subscriber)
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol


class HookPoint(enum.Enum):
    CLIENT_CONNECT = "client.connect"
    CLIENT_AUTHENTICATE = "client.authenticate"
    CLIENT_AUTHORIZE = "client.authorize"
    CLIENT_CONNECTED = "client.connected"
    CLIENT_DISCONNECTED = "client.disconnected"
    SESSION_CREATED = "session.created"
    SESSION_SUBSCRIBED = "session.subscribed"
    SESSION_UNSUBSCRIBED = "session.unsubscribed"
    SESSION_TERMINATED = "session.terminated"
    MESSAGE_PUBLISH = "message.publish"
    MESSAGE_DELIVERED = "message.delivered"
    MESSAGE_ACKED = "message.acked"
    MESSAGE_DROPPED = "message.dropped"

    @property
    def attr(self) -> str:
        """The registry's attribute holding this point's chain (`message_publish`)."""
        return self._value_.replace(".", "_")  # not `.value`: a descriptor call, asked per hook call


class TopicCheck(Protocol):
    """A client's compiled ACL, as client.authorize's built-in callback reads it."""

    def can_publish(self, topic: str) -> bool: ...

    def can_subscribe(self, topic_filter: str) -> bool: ...


@dataclass(frozen=True, slots=True)
class ClientInfo:
    """Who a client is, as the hooks see it (`acl`: its ACL, None when none applies)."""

    client_id: str
    username: str | None
    peer: str
    transport: str
    protocol_level: int
    node: str
    acl: TopicCheck | None = None


@dataclass(frozen=True, slots=True)
class ConnectInfo:
    """A CONNECT being decided (before the session exists)."""

    client: ClientInfo
    password: bytes | None
    clean_start: bool
    cert_cn: str | None
    peer_ip: str = ""


@dataclass(frozen=True, slots=True)
class AuthVerdict:
    """client.authenticate's value: `ok` None means no callback decided yet (the node
    then accepts, as with no password file); `reason_code` is the v5 code of a refusal;
    `username` may be replaced (a certificate's CN)."""

    ok: bool | None = None
    reason_code: int = 0
    detail: str = ""
    username: str | None = None
