"""Topic names, topic filters and shared subscriptions (MQTT 5 section 4.7, 4.8.2).

`topic_matches` is the reference matcher: obviously correct and slow. The broker's trie
(`routing/`) is tested against it.
"""

from __future__ import annotations

from .errors import TopicFilterInvalid, TopicNameInvalid

__all__ = [
    "validate_topic_name",
    "validate_topic_filter",
    "parse_shared_subscription",
    "topic_matches",
    "SHARED_PREFIX",
]

SHARED_PREFIX = "$share/"


def validate_topic_name(name: str) -> None:
    """A topic name a PUBLISH may carry: non-empty, no wildcards [MQTT-3.3.2-2], no U+0000."""
    if not name:
        raise TopicNameInvalid("topic name is empty")
    if "+" in name or "#" in name:
        raise TopicNameInvalid(f"topic name {name!r} contains a wildcard")
    if "\x00" in name:
        raise TopicNameInvalid("topic name contains U+0000")
    if len(name) > 0x3FFF and len(name.encode("utf-8", "surrogatepass")) > 0xFFFF:
        raise TopicNameInvalid("topic name longer than 65535 bytes")


def _check_filter_levels(topic_filter: str, original: str) -> None:
    if not topic_filter:
        raise TopicFilterInvalid(f"topic filter {original!r} is empty")
    if "+" not in topic_filter and "#" not in topic_filter:
        return  # fast path: no wildcards to place
    levels = topic_filter.split("/")
    last = len(levels) - 1
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != last):
            # [MQTT-4.7.1-1] '#' alone, and only as the last level
            raise TopicFilterInvalid(f"topic filter {original!r}: '#' must be the whole last level")
        if "+" in level and level != "+":
            # [MQTT-4.7.1-2] '+' must occupy an entire level
            raise TopicFilterInvalid(f"topic filter {original!r}: '+' must be a whole level")


def parse_shared_subscription(topic_filter: str) -> tuple[str | None, str]:
    """Split `$share/{group}/{filter}` into (group, filter); (None, f) if not shared.

    Raises TopicFilterInvalid (0x8F) for a malformed shared subscription
    [MQTT-4.8.2-1, MQTT-4.8.2-2]: empty group, a group with a wildcard, or no filter.
    """
    if not topic_filter.startswith(SHARED_PREFIX):
        if topic_filter == "$share":
            raise TopicFilterInvalid("shared subscription '$share' has no group")
        return None, topic_filter  # includes e.g. "$shares/x", an ordinary $-filter
    group, sep, real = topic_filter[len(SHARED_PREFIX):].partition("/")
    if not group:
        raise TopicFilterInvalid(f"shared subscription {topic_filter!r} has an empty group")
    if "+" in group or "#" in group:
        raise TopicFilterInvalid(f"shared subscription group {group!r} contains a wildcard")
    if not sep or not real:
        raise TopicFilterInvalid(f"shared subscription {topic_filter!r} has no topic filter")
    return group, real


def validate_topic_filter(topic_filter: str) -> None:
    """A topic filter a SUBSCRIBE/UNSUBSCRIBE may carry; raises TopicFilterInvalid (0x8F)."""
    if "\x00" in topic_filter:
        raise TopicFilterInvalid("topic filter contains U+0000")
    if len(topic_filter) > 0x3FFF and len(topic_filter.encode("utf-8", "surrogatepass")) > 0xFFFF:
        raise TopicFilterInvalid("topic filter longer than 65535 bytes")
    _group, real = parse_shared_subscription(topic_filter)
    _check_filter_levels(real, topic_filter)


def topic_matches(topic_filter: str, topic_name: str) -> bool:
    """Does `topic_filter` (not a `$share/...` one; pass the real filter) match `topic_name`?

    '+' matches exactly one level, '#' the parent level and any number below it; a
    wildcard in the first level never matches a topic starting with '$' [MQTT-4.7.2-1].
    """
    if topic_name.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False
    f_levels = topic_filter.split("/")
    n_levels = topic_name.split("/")
    for i, level in enumerate(f_levels):
        if level == "#":
            return True
        if i >= len(n_levels):
            return False
        if level != "+" and level != n_levels[i]:
            return False
    return len(f_levels) == len(n_levels)


def dollar_blocked(a: str, b: str) -> bool:
    """[MQTT-4.7.2-1]: a wildcard first level never matches a `$` topic.

    If one filter starts with a wildcard and the other with a literal `$...` level,
    no topic can match both.
    """
    a_wild = a[:1] in ("+", "#") and (len(a) == 1 or a[1] == "/")
    b_wild = b[:1] in ("+", "#") and (len(b) == 1 or b[1] == "/")
    return (a_wild and b.startswith("$")) or (b_wild and a.startswith("$"))


def filter_covers(outer: str, inner: str) -> bool:
    """Is every topic name matched by filter `inner` also matched by filter `outer`?"""
    if dollar_blocked(outer, inner):
        return False
    o = outer.split("/")
    s = inner.split("/")
    for i, level in enumerate(o):
        if level == "#":
            return True  # covers the parent level and everything below it
        if i >= len(s):
            return False
        sub = s[i]
        if sub == "#":
            # Inner matches every suffix from here, the empty one too (the parent
            # level) unless it is the first level. Outer covers that only if it is
            # '#' here (checked above) or, at the first level, '+/#' (equal to '#').
            return i == 0 and o[i:] == ["+", "#"]
        if level == "+":
            continue
        if sub != level:
            return False  # inner '+' or a different literal
    return len(s) == len(o)
