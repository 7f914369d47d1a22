"""One tier's index: which blocks it holds, in which slot, and which one to evict next.

Pure and tensor-free: the tiers own the bytes, this owns the bookkeeping (capacity in blocks,
eviction order, pins, retention, hit counts for NVMe admission). The trace simulation drives it
directly.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterator
from dataclasses import dataclass

from strata.worker.kvtier import policy

Key = Hashable


@dataclass
class Entry:
    parent: Key | None
    priority: int
    pinned: bool
    last_used: float
    slot: int = -1
    checksum: int = 0


class TierIndex:
    """Blocks of one tier, at most ``capacity`` of them.

    ``make_room`` evicts by policy and returns the victims so that the caller can free (or
    demote) their slots; ``add`` then has room. Pinned blocks are never victims.
    """

    def __init__(self, capacity: int, eviction: str) -> None:
        if capacity < 0:
            raise ValueError(f"capacity: must be >= 0, got {capacity}")
        self.capacity = capacity
        self._order = policy.make_order(eviction)
        self._entries: dict[Key, Entry] = {}
        self._recency: OrderedDict[Key, None] = OrderedDict()  # unpinned, oldest first: retention
        self._tick = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Key) -> bool:
        return key in self._entries

    def __iter__(self) -> Iterator[Key]:
        return iter(list(self._entries))

    def get(self, key: Key) -> Entry | None:
        return self._entries.get(key)

    def touch(self, key: Key, now: float) -> None:
        entry = self._entries.get(key)
        if entry is None:
            return
        entry.last_used = now
        self._tick += 1
        self._order.touch(key, self._tick)
        if not entry.pinned:
            self._recency.move_to_end(key)

    def make_room(self, count: int = 1) -> list[tuple[Key, Entry]]:
        """Evict until ``count`` more blocks fit; fewer fit when the rest is pinned."""
        return self.evict(len(self._entries) + count - self.capacity)

    def evict(self, count: int) -> list[tuple[Key, Entry]]:
        """Remove up to ``count`` blocks by policy and return them."""
        victims: list[tuple[Key, Entry]] = []
        while len(victims) < count:
            key = self._order.victim()
            if key is None:
                break
            victims.append((key, self.remove(key)))
        return victims

    def has_room(self) -> bool:
        return len(self._entries) < self.capacity

    def add(self, key: Key, entry: Entry) -> None:
        if key in self._entries:
            raise KeyError(f"block already indexed: {key!r}")
        if not self.has_room():
            raise OverflowError("tier full: call make_room first")
        self._entries[key] = entry
        self._tick += 1
        self._order.add(key, entry.parent, entry.priority, self._tick, not entry.pinned)
        if not entry.pinned:
            self._recency[key] = None

    def remove(self, key: Key) -> Entry:
        entry = self._entries.pop(key)
        self._order.remove(key)
        self._recency.pop(key, None)
        return entry

    def pin(self, key: Key) -> None:
        """Make a present block unevictable (re-added so the order forgets it)."""
        entry = self._entries.get(key)
        if entry is None or entry.pinned:
            return
        self.remove(key)
        entry.pinned = True
        self._entries[key] = entry
        self._tick += 1
        self._order.add(key, entry.parent, entry.priority, self._tick, False)

    def expired(self, now: float, retention_s: float) -> list[Key]:
        """Unpinned blocks unused for longer than ``retention_s`` (oldest first)."""
        stale: list[Key] = []
        for key in self._recency:
            if now - self._entries[key].last_used <= retention_s:
                break
            stale.append(key)
        return stale
