"""Loop prevention for a bridge: nothing that came in through a bridge goes out again.

Two parts. What ingress publishes here carries the publisher `$bridge/<id>`
(`INGRESS_PUBLISHER`), and egress skips such messages. And what egress sent to the
remote must not come back in through ingress when the remote's filters overlap: with
MQTT 5 and a plain subscription the remote is asked not to (No Local); otherwise (3.1.1,
shared subscriptions, another bridge on the remote sending it back) `EchoFilter`
remembers what was sent, by (topic, payload digest), and drops one arrival per send.
A v5 egress also marks each message with the user property `meshd-bridge` = node id,
and ingress drops a message that carries this node's mark.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

INGRESS_PUBLISHER_PREFIX = "$bridge/"
ORIGIN_PROPERTY = "meshd-bridge"


def ingress_publisher(bridge_id: str) -> str:
    return INGRESS_PUBLISHER_PREFIX + bridge_id


def came_through_bridge(publisher: str | None) -> bool:
    return publisher is not None and publisher.startswith(INGRESS_PUBLISHER_PREFIX)


class EchoFilter:
    """Fingerprints of recently sent messages, at most `capacity` (oldest forgotten)."""

    def __init__(self, capacity: int = 65536) -> None:
        self.capacity = capacity
        self._sent: OrderedDict[bytes, int] = OrderedDict()
        self.echoes = 0

    @staticmethod
    def _key(topic: str, payload: bytes) -> bytes:
        return hashlib.blake2b(topic.encode() + b"\x00" + payload, digest_size=16).digest()

    def sent(self, topic: str, payload: bytes) -> None:
        key = self._key(topic, payload)
        self._sent[key] = self._sent.get(key, 0) + 1
        self._sent.move_to_end(key)
        while len(self._sent) > self.capacity:
            self._sent.popitem(last=False)

    def is_echo(self, topic: str, payload: bytes) -> bool:
        """True (and one send consumed) when this is what we sent."""
        key = self._key(topic, payload)
        count = self._sent.get(key)
        if not count:
            return False
        if count == 1:
            del self._sent[key]
        else:
            self._sent[key] = count - 1
        self.echoes += 1
        return True
