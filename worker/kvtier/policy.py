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
    """Least recently used first, one recency list per priority class: O(1) per operation
    (O(number of priority classes) for ``victim``)."""

    def __init__(self) -> None:
        self._by_priority: dict[int, OrderedDict[Key, None]] = {}
        self._priority: dict[Key, int] = {}

    def add(self, key: Key, parent: Key | None, priority: int, tick: int, evictable: bool) -> None:
        if not evictable:
            return
        self._priority[key] = priority
        self._by_priority.setdefault(priority, OrderedDict())[key] = None

    def touch(self, key: Key, tick: int) -> None:
        priority = self._priority.get(key)
        if priority is not None:
            self._by_priority[priority].move_to_end(key)

    def remove(self, key: Key) -> None:
        priority = self._priority.pop(key, None)
        if priority is not None:
            del self._by_priority[priority][key]

    def victim(self) -> Key | None:
        for priority in sorted(self._by_priority):
            queue = self._by_priority[priority]
            if queue:
                return next(iter(queue))
        return None


class PrefixAwareOrder:
    """Least recently used leaf first. A lazy min-heap of (priority, tick) over the evictable
    leaves: stale entries (touched since, no longer a leaf, removed) are skipped when popped,
    so each operation is O(log n) amortised."""

    def __init__(self) -> None:
        self._parent: dict[Key, Key | None] = {}
        self._children: dict[Key, int] = {}
        self._priority: dict[Key, int] = {}
        self._tick: dict[Key, int] = {}
        self._evictable: dict[Key, bool] = {}
        self._heap: list[tuple[int, int, int, Key]] = []
        self._seq = 0

    def add(self, key: Key, parent: Key | None, priority: int, tick: int, evictable: bool) -> None:
        self._parent[key] = parent
        self._priority[key] = priority
        self._tick[key] = tick
        self._evictable[key] = evictable
        # Counted whether or not the parent is present, so a parent that comes back later
        # knows at once that it is not a leaf.
        if parent is not None:
            self._children[parent] = self._children.get(parent, 0) + 1
        self._push_if_candidate(key)

    def touch(self, key: Key, tick: int) -> None:
        if key in self._tick:
            self._tick[key] = tick
            self._push_if_candidate(key)

    def remove(self, key: Key) -> None:
        if key not in self._parent:
            return
        parent = self._parent.pop(key)
        for table in (self._priority, self._tick, self._evictable):
            del table[key]
        if parent is not None:
            left = self._children[parent] - 1
            if left:
                self._children[parent] = left
            else:
                del self._children[parent]
                if parent in self._parent:
                    self._push_if_candidate(parent)

    def victim(self) -> Key | None:
        while self._heap:
            _, tick, _, key = self._heap[0]
            if self._is_candidate(key) and self._tick[key] == tick:
                return key
            heapq.heappop(self._heap)
        return None

    def _is_candidate(self, key: Key) -> bool:
        return self._evictable.get(key, False) and self._children.get(key, 0) == 0

    def _push_if_candidate(self, key: Key) -> None:
        if not self._is_candidate(key):
            return
        self._seq += 1
        heapq.heappush(self._heap, (self._priority[key], self._tick[key], self._seq, key))
        if len(self._heap) > 4 * len(self._parent) + 1024:
            self._compact()

    def _compact(self) -> None:
        self._heap = [
            (self._priority[k], self._tick[k], i, k)
            for i, k in enumerate(self._parent)
            if self._is_candidate(k)
        ]
        heapq.heapify(self._heap)


def make_order(name: str) -> EvictionOrder:
    if name == "lru":
        return LruOrder()
    if name == "prefix-aware":
        return PrefixAwareOrder()
    raise ValueError(f"eviction: unknown policy {name!r}; expected one of {POLICIES}")
