"""Topic filters -> sets of values, laid out so a match reads few cache lines.

The same mapping and matching rules as `routing.trie.TopicTrie` (the MQTT rules are
in its docstring), with another layout, for the route table of a big mesh: at a
million routes the trie's walk waits on memory, each level it visits being a node
object, its children dict, that dict's table and the key it compares, each a cache
miss (RESULTS.md, "Mesh scale", the lookup sections). Here the trie's edges are one
open-addressed hash table of 64-bit integers in one packed array (`librt.vecs.vec`,
native memory under mypyc):

- a level name is a small integer (`_level_ids`; `+` is 1, `#` is 2), a node an
  integer id (the root is 0);
- an edge (parent, level) is one slot of two integers: the key `parent << 32 |
  level` and the child's `id << 4 | flags`, the flags telling whether the child
  holds values, has children, a `+` child, a `#` child. Following a level is one
  probe, usually one cache line, and the flags say which wildcard probes are
  worth making without reading anything else;
- a node's filter and child count are in lists indexed by its id, read only when
  filters change; its values are an interned set named in its edge's slot;
- a table of 4 MB or more is advised onto 2 MB pages (`routing.huge_pages`).

Exact, not probabilistic: keys are whole (parent, level) pairs, compared whole. A topic
level no filter has is not in `_level_ids`: its literal branch ends without a probe.
"""

from __future__ import annotations

from typing import Final, Generic, Iterator, TypeVar

from librt.vecs import append, vec
from mypy_extensions import i64

from routing.huge_pages import HUGE_PAGE, advise_huge_pages

__all__ = ["TopicIndex"]

V = TypeVar("V")

PLUS: Final[i64] = 1
HASH: Final[i64] = 2
_FIRST_LEVEL: Final[i64] = 3

# An edge's value: child id << _SHIFT | the child's value set id << _SET_SHIFT |
# the child's children's signature << _SIG_SHIFT | the child's flags.
HAS_VALUES: Final[i64] = 1
HAS_CHILDREN: Final[i64] = 2
HAS_PLUS: Final[i64] = 4
HAS_HASH: Final[i64] = 8
_SIG_SHIFT: Final[i64] = 4  # bit (level id & 7) set for each child level (never cleared
_SIG_MASK: Final[i64] = 255  # while the node has children: a superset), so most
# probes for a level a node has no child for are not made
_SET_SHIFT: Final[i64] = 12
_SET_MASK: Final[i64] = (1 << 24) - 1
_SHIFT: Final[i64] = 36
_NODE_BITS: Final[i64] = 27
_FLAGS: Final[i64] = (1 << _SET_SHIFT) - 1  # flags and signature

_MIN_CAPACITY: Final[i64] = 64  # slots; a power of two
_ROOT_KEY: Final[i64] = -1  # stands for the root's (absent) incoming edge


def _home(key: i64, mask: i64) -> i64:
    """The slot an edge key hashes to. Both products stay below 2**62 (ids < 2**31),
    so the sum fits a signed 64-bit integer compiled or not."""
    h = (key & 0x7FFFFFFF) * 0x7FEB352D + (key >> 32) * 0x5BD1E995
    return (h >> 17) & mask


def _zeros(n: i64) -> vec[i64]:
    out = vec[i64](capacity=n)
    if 8 * n >= 2 * HUGE_PAGE:
        # A big table on 2 MB pages (routing.huge_pages: the kernel's khugepaged moves
        # it there within a minute): its random reads stop missing the TLB.
        advise_huge_pages(out, 8 * n)
    i: i64 = 0
    while i < n:
        out = append(out, 0)
        i += 1
    return out


class TopicIndex(Generic[V]):
    """Maps MQTT topic filters to sets of values (the API of `TopicTrie`).

    The value sets are interned: every filter holding the same values shares one
    frozenset, named by a small id in the edge's slot, so a match reads no per-filter
    object. Meant for values drawn from a small population (the route table's node
    ids); a filter's add or remove costs O(its values)."""

    def __init__(self) -> None:
        self._slots: vec[i64] = _zeros(2 * _MIN_CAPACITY)  # key, value, key, value, ...
        self._mask: i64 = _MIN_CAPACITY - 1
        self._edges: i64 = 0
        self._root_flags: i64 = 0
        self._level_ids: dict[str, i64] = {"+": PLUS, "#": HASH}
        self._level_names: list[str] = ["", "+", "#"]
        self._level_refs: list[int] = [0, 0, 0]  # edges per level (+ and # are never freed)
        self._free_levels: list[i64] = []
        self._sets: list[frozenset[V]] = [frozenset()]  # value set id -> values (0: none)
        self._set_ids: dict[frozenset[V], i64] = {}
        self._set_refs: list[int] = [0]  # filters holding each set
        self._free_sets: list[i64] = []
        self._filters: list[str | None] = [None]  # node id -> its filter if it holds values
        self._children: vec[i64] = _zeros(1)  # node id -> number of children
        self._free_nodes: list[i64] = []
        self._count = 0  # (filter, value) pairs
        self._filter_count = 0

    # -- mutation ----------------------------------------------------------

    def add(self, topic_filter: str, value: V) -> bool:
        """Store `value` under `topic_filter`; True if the pair is new."""
        node: i64 = 0
        key: i64 = _ROOT_KEY
        v: i64 = 0
        for level in topic_filter.split("/"):
            lid = self._level_ids.get(level)
            if lid is None:
                lid = self._new_level(level)
            child_key = node << 32 | lid
            v = self._get(child_key)
            if v == 0:
                child = self._new_node()
                v = child << _SHIFT
                self._put(child_key, v)
                self._level_refs[lid] += 1
                self._children[node] += 1
                self._set_flags(key, HAS_CHILDREN | (HAS_PLUS if lid == PLUS else HAS_HASH if lid == HASH else 0)
                                | 1 << (_SIG_SHIFT + (lid & 7)))
            node = v >> _SHIFT
            key = child_key
        sid = (v >> _SET_SHIFT) & _SET_MASK
        values = self._sets[sid]
        if value in values:
            return False
        if sid == 0:
            self._filters[node] = topic_filter
            self._filter_count += 1
        self._set_values(key, sid, values | {value})
        self._count += 1
        return True

    def remove(self, topic_filter: str, value: V) -> bool:
        """Drop the pair; True if it was there. Empty nodes are pruned."""
        path = self._path(topic_filter)
        if path is None:
            return False
        key = self._key_at(path, topic_filter.split("/"), len(path) - 1)
        sid = (self._get(key) >> _SET_SHIFT) & _SET_MASK
        values = self._sets[sid]
        if value not in values:
            return False
        self._count -= 1
        rest = values - {value}
        if rest:
            self._set_values(key, sid, rest)
        else:
            self._drop_values(topic_filter, path)
        return True

    def discard_filter(self, topic_filter: str) -> set[V]:
        """Drop every value under `topic_filter`; returns what was there."""
        path = self._path(topic_filter)
        if path is None:
            return set()
        key = self._key_at(path, topic_filter.split("/"), len(path) - 1)
        values = self._sets[(self._get(key) >> _SET_SHIFT) & _SET_MASK]
        if values:
            self._count -= len(values)
            self._drop_values(topic_filter, path)
        return set(values)

    def clear(self) -> None:
        self._slots = _zeros(2 * _MIN_CAPACITY)
        self._mask = _MIN_CAPACITY - 1
        self._edges = 0
        self._root_flags = 0
        self._level_ids = {"+": PLUS, "#": HASH}
        self._level_names = ["", "+", "#"]
        self._level_refs = [0, 0, 0]
        self._free_levels = []
        self._sets = [frozenset()]
        self._set_ids = {}
        self._set_refs = [0]
        self._free_sets = []
        self._filters = [None]
        self._children = _zeros(1)
        self._free_nodes = []
        self._count = 0
        self._filter_count = 0

    # -- lookup ------------------------------------------------------------

    def match(self, topic: str) -> list[V]:
        """All values whose filter matches `topic`, once per matching filter (as
        `TopicTrie.match`)."""
        out: list[V] = []
        levels = topic.split("/")
        n: i64 = len(levels)
        dollar = topic.startswith("$")
        ids = self._level_ids
        slots = self._slots
        mask = self._mask
        sets = self._sets
        # Only `+` branches wait on the stack (child value, level index), made lazily.
        stack: list[i64] | None = None
        node: i64 = 0
        flags = self._root_flags
        i: i64 = 0
        while True:
            if flags & HAS_CHILDREN:
                wild = not (dollar and node == 0)
                if wild and flags & HAS_HASH:
                    # `#` matches this level and all below, incl. the parent (i == n).
                    v = _probe(slots, mask, node << 32 | HASH)
                    if v & HAS_VALUES:
                        out.extend(sets[(v >> _SET_SHIFT) & _SET_MASK])
                if i < n:
                    j = i + 1
                    if wild and flags & HAS_PLUS:
                        v = _probe(slots, mask, node << 32 | PLUS)
                        if j == n and v & HAS_VALUES:
                            out.extend(sets[(v >> _SET_SHIFT) & _SET_MASK])
                        if v & HAS_CHILDREN:
                            if stack is None:
                                stack = []
                            stack.append(v)
                            stack.append(j)
                    lid = ids.get(levels[i])
                    if lid is not None and flags >> (_SIG_SHIFT + (lid & 7)) & 1:
                        v = _probe(slots, mask, node << 32 | lid)
                        if j == n and v & HAS_VALUES:
                            out.extend(sets[(v >> _SET_SHIFT) & _SET_MASK])
                        if v & HAS_CHILDREN:  # below the last level: `a/#` matches `a`
                            node = v >> _SHIFT
                            flags = v & _FLAGS
                            i = j
                            continue
            if not stack:
                return out
            i = stack.pop()
            v = stack.pop()
            node = v >> _SHIFT
            flags = v & _FLAGS

    def match_filters(self, topic: str) -> list[tuple[str, frozenset[V]]]:
        """Each matching filter with its values."""
        out: list[tuple[str, frozenset[V]]] = []
        for v in self._match_edges(topic):
            topic_filter = self._filters[v >> _SHIFT]
            assert topic_filter is not None
            out.append((topic_filter, self._sets[(v >> _SET_SHIFT) & _SET_MASK]))
        return out

    def values(self, topic_filter: str) -> set[V]:
        """The values stored under exactly this filter (a copy; empty if none)."""
        path = self._path(topic_filter)
        if path is None:
            return set()
        key = self._key_at(path, topic_filter.split("/"), len(path) - 1)
        return set(self._sets[(self._get(key) >> _SET_SHIFT) & _SET_MASK])

    def has_filter(self, topic_filter: str) -> bool:
        return bool(self.values(topic_filter))

    def filters(self) -> Iterator[str]:
        """Every filter holding at least one value (order unspecified)."""
        return iter([f for f in self._filters if f is not None])

    def filter_count(self) -> int:
        return self._filter_count

    def node_count(self) -> int:
        """Number of nodes below the root (one edge each)."""
        return int(self._edges)

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0

    def __contains__(self, topic_filter: str) -> bool:
        return self.has_filter(topic_filter)

    # -- internals ---------------------------------------------------------

    def _match_edges(self, topic: str) -> list[i64]:
        """The edge values of the nodes holding values whose filter matches `topic`."""
        out: list[i64] = []
        levels = topic.split("/")
        n: i64 = len(levels)
        dollar = topic.startswith("$")
        slots = self._slots
        mask = self._mask
        stack: list[i64] = [self._root_flags, 0]  # (edge value, level index)
        while stack:
            i = stack.pop()
            v = stack.pop()
            if not v & HAS_CHILDREN:
                continue
            node = v >> _SHIFT
            wild = not (dollar and node == 0)
            if wild and v & HAS_HASH:
                h = _probe(slots, mask, node << 32 | HASH)
                if h & HAS_VALUES:
                    out.append(h)
            if i == n:
                continue
            j = i + 1
            if wild and v & HAS_PLUS:
                c = _probe(slots, mask, node << 32 | PLUS)
                if j == n and c & HAS_VALUES:
                    out.append(c)
                stack.append(c)
                stack.append(j)
            lid = self._level_ids.get(levels[i])
            if lid is not None:
                c = _probe(slots, mask, node << 32 | lid)
                if j == n and c & HAS_VALUES:
                    out.append(c)
                if c != 0:
                    stack.append(c)
                    stack.append(j)
        return out

    def _path(self, topic_filter: str) -> list[i64] | None:
        """Node ids from the root to `topic_filter`'s node, or None if it has none."""
        node: i64 = 0
        path: list[i64] = [0]
        for level in topic_filter.split("/"):
            lid = self._level_ids.get(level)
            if lid is None:
                return None
            v = self._get(node << 32 | lid)
            if v == 0:
                return None
            node = v >> _SHIFT
            path.append(node)
        return path

    def _set_values(self, key: i64, sid: i64, values: frozenset[V]) -> None:
        """The node behind edge `key` now holds `values` (not empty) instead of set `sid`."""
        new = self._set_ids.get(values)
        if new is None:
            if self._free_sets:
                new = self._free_sets.pop()
                self._sets[new] = values
            else:
                new = len(self._sets)
                assert new <= _SET_MASK, "more than 2**24 distinct value sets"
                self._sets.append(values)
                self._set_refs.append(0)
            self._set_ids[values] = new
        self._set_refs[new] += 1
        self._release_set(sid)
        i = self._find_slot(key)
        self._slots[2 * i + 1] = (self._slots[2 * i + 1] & ~(_SET_MASK << _SET_SHIFT)) | new << _SET_SHIFT | HAS_VALUES

    def _release_set(self, sid: i64) -> None:
        if sid == 0:
            return
        self._set_refs[sid] -= 1
        if self._set_refs[sid] == 0:
            del self._set_ids[self._sets[sid]]
            self._sets[sid] = frozenset()
            self._free_sets.append(sid)

    def _drop_values(self, topic_filter: str, path: list[i64]) -> None:
        """The node at the end of `path` holds no values any more: say so, and prune
        the nodes left with neither values nor children."""
        node = path[-1]
        self._filters[node] = None
        self._filter_count -= 1
        levels = topic_filter.split("/")
        depth = len(levels)
        key = self._key_at(path, levels, depth)
        i = self._find_slot(key)
        self._release_set((self._slots[2 * i + 1] >> _SET_SHIFT) & _SET_MASK)
        self._slots[2 * i + 1] &= ~(_SET_MASK << _SET_SHIFT | HAS_VALUES)
        while depth > 0:
            node = path[depth]
            if self._filters[node] is not None or self._children[node] > 0:
                return
            parent = path[depth - 1]
            lid = self._level_ids[levels[depth - 1]]
            self._delete(parent << 32 | lid)
            self._free_nodes.append(node)
            self._release_level(lid)
            self._children[parent] -= 1
            gone = HAS_PLUS if lid == PLUS else HAS_HASH if lid == HASH else 0
            if self._children[parent] == 0:
                gone |= HAS_CHILDREN | _SIG_MASK << _SIG_SHIFT
            if gone:
                self._clear_flags(self._key_at(path, levels, depth - 1), gone)
            depth -= 1

    def _key_at(self, path: list[i64], levels: list[str], depth: int) -> i64:
        """The key of the edge into the node at `depth` of a path (the root: none)."""
        if depth == 0:
            return _ROOT_KEY
        return path[depth - 1] << 32 | self._level_ids[levels[depth - 1]]

    def _new_level(self, level: str) -> i64:
        if self._free_levels:
            lid = self._free_levels.pop()
            self._level_names[lid] = level
        else:
            lid = len(self._level_names)
            assert lid < 1 << 31, "more than 2**31 level names"
            self._level_names.append(level)
            self._level_refs.append(0)
        self._level_ids[level] = lid
        return lid

    def _release_level(self, lid: i64) -> None:
        self._level_refs[lid] -= 1
        if self._level_refs[lid] == 0 and lid >= _FIRST_LEVEL:
            del self._level_ids[self._level_names[lid]]
            self._level_names[lid] = ""
            self._free_levels.append(lid)

    def _new_node(self) -> i64:
        if self._free_nodes:
            return self._free_nodes.pop()
        node: i64 = len(self._filters)
        assert node < 1 << _NODE_BITS, "more than 2**27 nodes"
        self._filters.append(None)
        self._children = append(self._children, 0)
        return node

    def _set_flags(self, key: i64, flags: i64) -> None:
        if key == _ROOT_KEY:
            self._root_flags |= flags
            return
        i = self._find_slot(key)
        self._slots[2 * i + 1] |= flags

    def _clear_flags(self, key: i64, flags: i64) -> None:
        if key == _ROOT_KEY:
            self._root_flags &= ~flags
            return
        i = self._find_slot(key)
        self._slots[2 * i + 1] &= ~flags

    def _get(self, key: i64) -> i64:
        return _probe(self._slots, self._mask, key)

    def _find_slot(self, key: i64) -> i64:
        """The slot holding `key`, which must be there."""
        slots = self._slots
        mask = self._mask
        i = _home(key, mask)
        while slots[2 * i] != key:
            assert slots[2 * i] != 0, "edge missing"
            i = (i + 1) & mask
        return i

    def _put(self, key: i64, value: i64) -> None:
        """Insert a new edge (the key must not be there)."""
        if 2 * (self._edges + 1) > self._mask + 1:
            self._grow()
        slots = self._slots
        mask = self._mask
        i = _home(key, mask)
        while slots[2 * i] != 0:
            i = (i + 1) & mask
        slots[2 * i] = key
        slots[2 * i + 1] = value
        self._edges += 1

    def _delete(self, key: i64) -> None:
        """Remove an edge, shifting later entries of its run back (no tombstones)."""
        slots = self._slots
        mask = self._mask
        i = self._find_slot(key)
        j = i
        while True:
            j = (j + 1) & mask
            k = slots[2 * j]
            if k == 0:
                break
            home = _home(k, mask)
            # The entry at j may move to the hole at i unless its home lies
            # cyclically in (i, j].
            if (i <= j and (home <= i or home > j)) or (i > j and home <= i and home > j):
                slots[2 * i] = k
                slots[2 * i + 1] = slots[2 * j + 1]
                i = j
        slots[2 * i] = 0
        slots[2 * i + 1] = 0
        self._edges -= 1

    def _grow(self) -> None:
        old = self._slots
        capacity = 2 * (self._mask + 1)
        self._slots = _zeros(2 * capacity)
        self._mask = capacity - 1
        self._edges = 0
        i: i64 = 0
        n: i64 = len(old)
        while i < n:
            if old[i] != 0:
                self._put(old[i], old[i + 1])
            i += 2


def _probe(slots: vec[i64], mask: i64, key: i64) -> i64:
    """The value of edge `key`, 0 if there is none (a value is never 0: ids start at 1)."""
    i = _home(key, mask)
    while True:
        k = slots[2 * i]
        if k == key:
            return slots[2 * i + 1]
        if k == 0:
            return 0
        i = (i + 1) & mask
