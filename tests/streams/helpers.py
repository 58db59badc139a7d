"""Stream test helpers: a paho client that subscribes with `replay-from` and keeps the
SUBACK's properties; positions of received messages."""

from __future__ import annotations

import queue
from typing import Any

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties
from paho.mqtt.subscribeoptions import SubscribeOptions

from tests.support import TIMEOUT, Client


class StreamClient(Client):
    def __init__(self, client_id: str = "", **kwargs: Any) -> None:
        super().__init__(client_id, **kwargs)
        self.suback_props: queue.Queue[dict[str, str]] = queue.Queue()

        def on_subscribe(c: Any, u: Any, mid: Any, rcs: Any, props: Any) -> None:
            self.suback_props.put(user_properties(props))
            self.subacks.put(rcs)

        self.c.on_subscribe = on_subscribe

    def replay(self, topic_filter: str, replay_from: str, qos: int = 1) -> tuple[list[int], dict[str, str]]:
        """SUBSCRIBE with the user property replay-from; (reason codes, SUBACK user properties)."""
        props = PahoProperties(PacketTypes.SUBSCRIBE)
        props.UserProperty = [("replay-from", replay_from)]
        self.c.subscribe(topic_filter, options=SubscribeOptions(qos=qos), properties=props)
        codes = self.subacks.get(timeout=TIMEOUT)
        return [int(getattr(c, "value", c)) for c in codes], self.suback_props.get(timeout=TIMEOUT)

    def subscribe_codes(self, topic_filter: str, qos: int = 1) -> list[int]:
        if self.version == 5:
            self.c.subscribe(topic_filter, options=SubscribeOptions(qos=qos))
        else:
            self.c.subscribe(topic_filter, qos)
        codes = self.subacks.get(timeout=TIMEOUT)
        if self.version == 5:
            self.suback_props.get(timeout=TIMEOUT)
        return [int(getattr(c, "value", c)) for c in codes]


def user_properties(props: Any) -> dict[str, str]:
    return dict(getattr(props, "UserProperty", None) or []) if props is not None else {}


def position(msg: Any) -> str:
    return user_properties(msg.properties)["position"]
