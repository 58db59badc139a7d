"""The `$delayed/<seconds>/<topic>` topic form (as EMQX and kin-mqtt-broker spell it).

Pure: a topic name in, the delay and the target topic out, or a refusal carrying the
v5 reason code to answer the publisher with.
"""

from __future__ import annotations

from dataclasses import dataclass

from mqtt.errors import TopicNameInvalid
from mqtt.reason_codes import ReasonCode
from mqtt.topics import validate_topic_name

PREFIX = "$delayed/"
DEFAULT_MAX_DELAY = 4294967  # seconds, EMQX's maximum (about 49.7 days)
# A target no client may publish to directly is no delayed target either.
_RESERVED_TARGETS = ("$SYS/", "$share/", PREFIX)


@dataclass(frozen=True, slots=True)
class DelayedTopic:
    delay: int  # seconds
    topic: str  # the topic it is published to when due


class DelayedTopicRefused(Exception):
    """A `$delayed/...` topic that is not accepted; `reason_code` is the v5 answer."""

    def __init__(self, reason_code: int, message: str) -> None:
        super().__init__(message)
        self.reason_code = reason_code


def is_delayed(topic: str) -> bool:
    return topic.startswith(PREFIX)


def parse_delayed(topic: str, max_delay: int) -> DelayedTopic:
    """`$delayed/30/plant/7` -> DelayedTopic(30, "plant/7").

    Refused with 0x90 (Topic Name invalid): a delay that is not a non-negative decimal
    integer, an empty target, a target with wildcards. With 0x83 (implementation
    specific): a delay above `max_delay`. With 0x87: a reserved target ($SYS/...).
    """
    rest = topic[len(PREFIX):]
    seconds, sep, target = rest.partition("/")
    if not sep:
        raise DelayedTopicRefused(ReasonCode.TOPIC_NAME_INVALID, f"{topic!r}: expected $delayed/<seconds>/<topic>")
    if not seconds.isascii() or not seconds.isdigit():
        raise DelayedTopicRefused(ReasonCode.TOPIC_NAME_INVALID,
                                  f"{topic!r}: the delay {seconds!r} is not a non-negative integer of seconds")
    delay = int(seconds)
    if delay > max_delay:
        raise DelayedTopicRefused(ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR,
                                  f"{topic!r}: delay {delay} s is above the maximum {max_delay} s (delayed_max_delay)")
    try:
        validate_topic_name(target)
    except TopicNameInvalid as exc:
        raise DelayedTopicRefused(ReasonCode.TOPIC_NAME_INVALID, f"{topic!r}: target {exc}") from None
    if target.startswith(_RESERVED_TARGETS):
        raise DelayedTopicRefused(ReasonCode.NOT_AUTHORIZED, f"{topic!r}: the target {target!r} is reserved")
    return DelayedTopic(delay, target)
