"""Topic trie: MQTT topic filters -> sets of values, matched per PUBLISH.

Pure code (no Trio, no sockets). One node per filter level; `+` and `#` are
ordinary child keys, so a match walks only the branches a topic can reach
(literal level, `+`, `#`) and never scans the whole filter set.

Matching rules (MQTT 3.1.1 §4.7 / 5.0 §4.7):
- `+` matches exactly one level (which may be empty: `/+` matches `/x`);
- `#` matches the current level and everything below, including the parent
  itself: `a/#` matches `a` [MQTT-4.7.1-2];
- a topic whose first level starts with `$` is not matched by a filter whose
  first level is `+` or `#` [MQTT-4.7.2-1].

Shared subscriptions (`$share/group/filter`) are the caller's business: the
broker strips the prefix and stores `(group, ...)` values under the plain filter.
"""

from __future__ import annotations

from sys import intern
from typing import Generic, Iterator, TypeVar

__all__ = ["TopicTrie"]

V = TypeVar("V")


class _Node(Generic[V]):
    __slots__ = ("children", "values", "parent", "key", "filter")

    def __init__(self, parent: _Node[V] | None, key: str) -> None:
        self.children: dict[str, _Node[V]] = {}
        # None until the first value: most inner nodes never hold one.
        self.values: set[V] | None = None
        self.parent = parent
        self.key = key
        # The whole filter of a node that holds values, kept so a match need not
        # rebuild it from the parents.
        self.filter = ""


class TopicTrie(Generic[V]):
    """Maps MQTT topic filters to sets of values.

    Filters are stored as given; validating them (``#`` last, wildcards alone in
    their level) is the protocol layer's job, done once at SUBSCRIBE time.
    """

    __slots__ = ("_root", "_count", "_filter_count")

    def __init__(self) -> None:
        self._root: _Node[V] = _Node(None, "")
        self._count = 0  # (filter, value) pairs
        self._filter_count = 0  # filters holding at least one value

    # -- mutation ----------------------------------------------------------

    def add(self, topic_filter: str, value: V) -> bool:
        """Store `value` under `topic_filter`; True if the pair is new."""
        node = self._root
        for level in topic_filter.split("/"):
            child = node.children.get(level)
            if child is None:
                # Interned: the same level name ("dev", "temp", a site number) recurs in
                # thousands of filters; one string for all of them (about 50 bytes a
                # node at a million routes).
                level = intern(level)
                child = _Node(node, level)
                node.children[level] = child
            node = child
        values = node.values
        if values is None:
            node.values = {value}
            node.filter = topic_filter
            self._filter_count += 1
        elif value in values:
            return False
        else:
            values.add(value)
        self._count += 1
        return True

    def remove(self, topic_filter: str, value: V) -> bool:
        """Drop the pair; True if it was there. Empty nodes are pruned."""
        node = self._find(topic_filter)
        if node is None or node.values is None or value not in node.values:
            return False
        node.values.discard(value)
        self._count -= 1
        if not node.values:
            node.values = None
            self._filter_count -= 1
            self._prune(node)
        return True

    def discard_filter(self, topic_filter: str) -> set[V]:
        """Drop every value under `topic_filter`; returns what was there."""
        node = self._find(topic_filter)
        if node is None or node.values is None:
            return set()
        values = node.values
        node.values = None
        self._count -= len(values)
        self._filter_count -= 1
        self._prune(node)
        return values

    def clear(self) -> None:
        self._root = _Node(None, "")
        self._count = 0
        self._filter_count = 0

    # -- lookup ------------------------------------------------------------

    def match(self, topic: str) -> list[V]:
        """All values whose filter matches the topic name `topic`.

        A value appears once per matching filter it was stored under: a client
        subscribed to both `a/+` and `a/#` is returned twice for `a/b`, so the
        caller sees every subscription (MQTT 5 delivers per subscription when
        identifiers differ; 3.1.1 brokers pick the highest QoS). Callers that want
        a set make one.
        """
        out: list[V] = []
        levels = topic.split("/")
        n = len(levels)
        root = self._root
        # The $ rule: the root's wildcard children are skipped for $-topics.
        dollar = topic[:1] == "$"
        # Follow the literal child inline; only `+` branches go on the stack,
        # which is created lazily, so a wildcard-free walk allocates nothing.
        stack: list[tuple[_Node[V], int]] | None = None
        node = root
        i = 0
        while True:
            children = node.children
            if children:
                plus = None
                if not (dollar and node is root):
                    hash_node = children.get("#")
                    # `#` matches this level and all below, incl. the parent (i == n).
                    if hash_node is not None and hash_node.values:
                        out.extend(hash_node.values)
                    if i < n:
                        plus = children.get("+")
                if i < n:
                    j = i + 1
                    if plus is not None:
                        if j == n:
                            if plus.values:
                                out.extend(plus.values)
                            if plus.children:  # only a trailing `#` can still match
                                if stack is None:
                                    stack = []
                                stack.append((plus, j))
                        else:
                            if stack is None:
                                stack = []
                            stack.append((plus, j))
                    child = children.get(levels[i])
                    if child is not None:
                        if j < n:
                            node, i = child, j
                            continue
                        if child.values:
                            out.extend(child.values)
                        if child.children:  # `a/#` matches `a`
                            node, i = child, j
                            continue
            if not stack:
                return out
            node, i = stack.pop()

    def match_filters(self, topic: str) -> list[tuple[str, set[V]]]:
        """Each matching filter with its values.

        The sets are the trie's own (no copy per publish): read them before the
        trie changes again and never mutate them."""
        out: list[tuple[str, set[V]]] = []
        levels = topic.split("/")
        n = len(levels)
        root = self._root
        dollar = topic[:1] == "$"
        stack: list[tuple[_Node[V], int]] = [(root, 0)]
        while stack:
            node, i = stack.pop()
            children = node.children
            wild = not (dollar and node is root)
            if wild:
                h = children.get("#")
                if h is not None and h.values:
                    out.append((h.filter, h.values))
            if i == n:
                continue
            keys = (levels[i], "+") if wild else (levels[i],)
            for key in keys:
                child = children.get(key)
                if child is None:
                    continue
                if i + 1 == n and child.values:
                    out.append((child.filter, child.values))
                stack.append((child, i + 1))
        return out

    def values(self, topic_filter: str) -> set[V]:
        """The values stored under exactly this filter (a copy; empty if none)."""
        node = self._find(topic_filter)
        if node is None or node.values is None:
            return set()
        return set(node.values)

    def has_filter(self, topic_filter: str) -> bool:
        node = self._find(topic_filter)
        return node is not None and node.values is not None

    def filters(self) -> Iterator[str]:
        """Every filter holding at least one value (order unspecified)."""
        stack: list[tuple[_Node[V], str | None]] = [(self._root, None)]
        while stack:
            node, prefix = stack.pop()
            for key, child in node.children.items():
                path = key if prefix is None else prefix + "/" + key
                if child.values is not None:
                    yield path
                if child.children:
                    stack.append((child, path))

    def filter_count(self) -> int:
        """Number of distinct filters holding at least one value."""
        return self._filter_count

    def node_count(self) -> int:
        """Number of trie nodes below the root (for tests and metrics)."""
        count = 0
        stack = [self._root]
        while stack:
            node = stack.pop()
            count += len(node.children)
            stack.extend(node.children.values())
        return count

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0

    def __contains__(self, topic_filter: str) -> bool:
        return self.has_filter(topic_filter)

    # -- internals ---------------------------------------------------------

    def _find(self, topic_filter: str) -> _Node[V] | None:
        node = self._root
        for level in topic_filter.split("/"):
            child = node.children.get(level)
            if child is None:
                return None
            node = child
        return node

    def _prune(self, node: _Node[V]) -> None:
        # Walk up removing nodes that hold neither values nor children.
        while node is not self._root and node.values is None and not node.children:
            parent = node.parent
            assert parent is not None
            del parent.children[node.key]
            node.parent = None
            node = parent


def _path(node: _Node[V]) -> str:
    parts: list[str] = []
    while node.parent is not None:
        parts.append(node.key)
        node = node.parent
    parts.reverse()
    return "/".join(parts)
