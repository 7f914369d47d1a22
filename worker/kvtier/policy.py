"""Eviction orders: which unpinned block of a tier goes first.

Pure and tensor-free, so the trace simulation in the benchmark drives the same code as the
sidecar. Every order evicts the lowest priority class first (a higher service tier's blocks are
protected), then:

- ``lru``: the least recently used block.
- ``prefix-aware``: the least recently used *leaf*, i.e. a block none of whose children is in
  the tier. A block is useless without its prefix, so chains are eaten from the end and a
  shared head (a system prompt) goes only once nothing cached hangs off it.

Recency is a logical tick supplied by the caller, so equal wall-clock times never tie.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Hashable
from typing import Protocol

Key = Hashable
POLICIES = ("lru", "prefix-aware")


class EvictionOrder(Protocol):
    def add(self, key: Key, parent: Key | None, priority: int, tick: int, evictable: bool) -> None: ...

    def touch(self, key: Key, tick: int) -> None: ...

    def remove(self, key: Key) -> None: ...

    def victim(self) -> Key | None:
        """The block to evict next (not removed), or None when nothing is evictable."""
        ...


class LruOrder:
    """Least recently used first, one recency list per priority class: O(number of priority
    classes) per operation, a handful. A block is found by asking each class's list rather
    than through a map of its own (one dict entry a block less, in a tier of millions)."""

    def __init__(self) -> None:
        self._by_priority: dict[int, OrderedDict[Key, None]] = {}

    def add(self, key: Key, parent: Key | None, priority: int, tick: int, evictable: bool) -> None:
        if not evictable:
            return
        self._by_priority.setdefault(priority, OrderedDict())[key] = None

    def _queue_of(self, key: Key) -> OrderedDict[Key, None] | None:
        for queue in self._by_priority.values():
            if key in queue:
                return queue
        return None

    def touch(self, key: Key, tick: int) -> None:
        queue = self._queue_of(key)
        if queue is not None:
            queue.move_to_end(key)

    def remove(self, key: Key) -> None:
        queue = self._queue_of(key)
        if queue is not None:
            del queue[key]

    def victim(self) -> Key | None:
        for priority in sorted(self._by_priority):
            queue = self._by_priority[priority]
            if queue:
                return next(iter(queue))
        return None


class _Node:
    """A held block's place in :class:`PrefixAwareOrder`: one slotted record, not an entry in
    each of five dicts (a large NVMe tier indexes millions of blocks)."""

    __slots__ = ("children", "evictable", "parent", "priority", "tick")

    def __init__(self, parent: Key | None, priority: int, tick: int, evictable: bool, children: int) -> None:
        self.parent, self.priority, self.tick, self.evictable = parent, priority, tick, evictable
        self.children = children


class PrefixAwareOrder:
    """Least recently used leaf first. A lazy min-heap of (priority, tick, key) over the
    evictable leaves: stale entries (touched since, no longer a leaf, removed) are skipped when
    popped, so each operation is O(log n) amortised. The caller's ticks are unique to a block
    (the tier index's are), so two entries tie only when both are the same block's."""

    def __init__(self) -> None:
        self._nodes: dict[Key, _Node] = {}
        # Children of blocks not held (counted all the same, so a parent that comes back later
        # knows at once that it is not a leaf).
        self._absent_children: dict[Key, int] = {}
        self._heap: list[tuple[int, int, Key]] = []

    def add(self, key: Key, parent: Key | None, priority: int, tick: int, evictable: bool) -> None:
        children = self._absent_children.pop(key, 0)
        self._nodes[key] = _Node(parent, priority, tick, evictable, children)
        if parent is not None:
            self._count_child(parent, 1)
        self._push_if_candidate(key)

    def touch(self, key: Key, tick: int) -> None:
        node = self._nodes.get(key)
        if node is not None:
            node.tick = tick
            self._push_if_candidate(key)

    def remove(self, key: Key) -> None:
        node = self._nodes.pop(key, None)
        if node is None:
            return
        if node.children:
            self._absent_children[key] = node.children
        if node.parent is not None:
            self._count_child(node.parent, -1)

    def _count_child(self, parent: Key, change: int) -> None:
        node = self._nodes.get(parent)
        if node is not None:
            node.children += change
            if not node.children:
                self._push_if_candidate(parent)  # its last child went: a leaf now
            return
        left = self._absent_children.get(parent, 0) + change
        if left:
            self._absent_children[parent] = left
        else:
            del self._absent_children[parent]

    def victim(self) -> Key | None:
        while self._heap:
            _, tick, key = self._heap[0]
            node = self._nodes.get(key)
            if node is not None and self._is_candidate(node) and node.tick == tick:
                return key
            heapq.heappop(self._heap)
        return None

    @staticmethod
    def _is_candidate(node: _Node) -> bool:
        return node.evictable and node.children == 0

    def _push_if_candidate(self, key: Key) -> None:
        node = self._nodes[key]
        if not self._is_candidate(node):
            return
        heapq.heappush(self._heap, (node.priority, node.tick, key))
        # Stale entries at most as many as live blocks: compacting costs O(n) per n pushes.
        if len(self._heap) > 2 * len(self._nodes) + 1024:
            self._compact()

    def _compact(self) -> None:
        nodes = self._nodes.items()
        self._heap = [(node.priority, node.tick, k) for k, node in nodes if self._is_candidate(node)]
        heapq.heapify(self._heap)


def make_order(name: str) -> EvictionOrder:
    if name == "lru":
        return LruOrder()
    if name == "prefix-aware":
        return PrefixAwareOrder()
    raise ValueError(f"eviction: unknown policy {name!r}; expected one of {POLICIES}")
