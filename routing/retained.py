"""Retained messages indexed by topic level, so a new subscription finds its retained
messages by walking its filter through a tree instead of scanning every topic.

Pure code.  Values are opaque (the broker stores `Message` objects).
"""

from __future__ import annotations

from typing import Generic, Iterator, TypeVar

V = TypeVar("V")


class _Level(Generic[V]):
    __slots__ = ("children", "value", "has_value")

    value: V  # set only while `has_value` (values may themselves be None)

    def __init__(self) -> None:
        self.children: dict[str, _Level[V]] = {}
        self.has_value = False


class RetainedIndex(Generic[V]):
    def __init__(self) -> None:
        self._root: _Level[V] = _Level()
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def set(self, topic: str, value: V) -> None:
        node = self._root
        for level in topic.split("/"):
            child = node.children.get(level)
            if child is None:
                child = node.children[level] = _Level()
            node = child
        if not node.has_value:
            self._count += 1
        node.value = value
        node.has_value = True

    def count_under(self, first_level: str) -> int:
        """Retained topics whose first level is `first_level` (e.g. the broker's `$SYS`)."""
        top = self._root.children.get(first_level)
        if top is None:
            return 0
        count, stack = 0, [top]
        while stack:
            node = stack.pop()
            count += node.has_value
            stack.extend(node.children.values())
        return count

    def get(self, topic: str) -> V | None:
        node = self._root
        for level in topic.split("/"):
            child = node.children.get(level)
            if child is None:
                return None
            node = child
        return node.value if node.has_value else None

    def delete(self, topic: str) -> bool:
        path: list[tuple[_Level[V], str]] = []
        node = self._root
        for level in topic.split("/"):
            child = node.children.get(level)
            if child is None:
                return False
            path.append((node, level))
            node = child
        if not node.has_value:
            return False
        del node.value
        node.has_value = False
        self._count -= 1
        # Prune levels left empty, bottom up.
        for parent, level in reversed(path):
            emptied = parent.children[level]
            if emptied.has_value or emptied.children:
                break
            del parent.children[level]
        return True

    def match(self, topic_filter: str) -> list[tuple[str, V]]:
        """(topic, value) for every retained topic the filter matches.

        Wildcards at the first level do not match topics starting with '$'."""
        levels = topic_filter.split("/")
        out: list[tuple[str, V]] = []
        stack: list[tuple[_Level[V], int, tuple[str, ...]]] = [(self._root, 0, ())]
        n = len(levels)
        while stack:
            node, i, path = stack.pop()
            if i == n:
                if node.has_value:
                    out.append(("/".join(path), node.value))
                continue
            level = levels[i]
            if level == "#":
                # '#' matches the parent level too ('a/#' matches 'a').
                if node.has_value and i > 0:
                    out.append(("/".join(path), node.value))
                for name, child in node.children.items():
                    if i == 0 and name.startswith("$"):
                        continue
                    self._collect(child, path + (name,), out)
            elif level == "+":
                for name, child in node.children.items():
                    if i == 0 and name.startswith("$"):
                        continue
                    stack.append((child, i + 1, path + (name,)))
            else:
                literal = node.children.get(level)
                if literal is not None:
                    stack.append((literal, i + 1, path + (level,)))
        return out

    def _collect(self, node: _Level[V], path: tuple[str, ...], out: list[tuple[str, V]]) -> None:
        stack = [(node, path)]
        while stack:
            node, path = stack.pop()
            if node.has_value:
                out.append(("/".join(path), node.value))
            for name, child in node.children.items():
                stack.append((child, path + (name,)))

    def items(self) -> Iterator[tuple[str, V]]:
        stack: list[tuple[_Level[V], tuple[str, ...]]] = [(self._root, ())]
        while stack:
            node, path = stack.pop()
            if node.has_value and path:
                yield "/".join(path), node.value
            for name, child in node.children.items():
                stack.append((child, path + (name,)))
