"""What a SUBSCRIBE asks to replay, and why a replay subscription is refused.

Two forms ask for the same thing (README "Streams"):

- MQTT 5: the SUBSCRIBE carries the user property `replay-from` = `earliest`, a
  position, or an RFC 3339 time; it applies to every filter of the packet;
- any version: the filter `$replay/<from>/<filter>`, `<from>` as above (a position or
  a time has no `/`, so the first level after `$replay/` is always `<from>`).

Pure. A refusal carries the v5 SUBACK reason code (mapped to 0x80 for 3.1.1 at the
edge) and a reason string.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from mqtt import ReasonCode
from mqtt.errors import RemoteProtocolError
from mqtt.topics import validate_topic_filter
from streams.position import PositionError, parse_start

REPLAY_PREFIX = "$replay/"
REPLAY_FROM = "replay-from"  # the SUBSCRIBE user property


@dataclass(frozen=True, slots=True)
class ReplayRequest:
    topic_filter: str  # the real filter (what routes and the ACL see)
    after: str  # exclusive lower bound: replay positions greater than this
    asked: str  # what the client wrote (`earliest`, a position, a time)


class ReplayRefused(Exception):
    def __init__(self, code: int, reason: str) -> None:
        super().__init__(code, reason)
        self.code = code
        self.reason = reason

    def __str__(self) -> str:
        return self.reason


def replay_from(user_properties: Iterable[tuple[str, str]]) -> str | None:
    for name, value in user_properties:
        if name == REPLAY_FROM:
            return value
    return None


def real_filter(topic_filter: str) -> str:
    """The filter a `$replay/<from>/<filter>` subscription is kept under (so that an
    UNSUBSCRIBE of either spelling removes it); other filters unchanged."""
    if topic_filter.startswith(REPLAY_PREFIX):
        _, _, rest = topic_filter[len(REPLAY_PREFIX):].partition("/")
        if rest:
            return rest
    return topic_filter


def parse_request(topic_filter: str, property_from: str | None) -> ReplayRequest | None:
    """The replay a subscription asks for; None for a plain subscription. Raises
    ReplayRefused for a malformed one."""
    if topic_filter.startswith(REPLAY_PREFIX):
        asked, sep, real = topic_filter[len(REPLAY_PREFIX):].partition("/")
        if not sep or not real or not asked:
            raise ReplayRefused(ReasonCode.TOPIC_FILTER_INVALID,
                                f"{topic_filter!r}: expected $replay/<from>/<filter>")
    elif property_from is not None:
        asked, real = property_from, topic_filter
    else:
        return None
    if real.startswith("$share/"):
        raise ReplayRefused(ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR, "a shared subscription cannot replay a stream")
    try:
        validate_topic_filter(real)
    except RemoteProtocolError as exc:
        raise ReplayRefused(ReasonCode.TOPIC_FILTER_INVALID, f"{real!r}: {exc}") from None
    try:
        after = parse_start(asked)
    except PositionError as exc:
        raise ReplayRefused(ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR, f"replay-from: {exc}") from None
    return ReplayRequest(real, after, asked)
