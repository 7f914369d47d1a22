"""One tier's index: which blocks it holds, in which slot, and which one to evict next.

Pure and tensor-free: the tiers own the bytes, this owns the bookkeeping (capacity in blocks,
eviction order, admission, pins, blocks expected by queued requests, retention). The trace
simulation drives it directly.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from strata.worker.kvtier import policy
from strata.worker.kvtier.admission import make_admission

Key = Hashable


@dataclass(slots=True)  # one per block held: a large NVMe tier indexes millions
class Entry:
    parent: Key | None
    priority: int
    pinned: bool
    last_used: float
    slot: int = -1
    checksum: int | None = None  # of the block's bytes; None until the sidecar took it
    tick: int = 0  # logical recency, kept when the block is made (un)evictable


class IndexListener(Protocol):
    """Told of every block entering or leaving a tier (``strata.worker.block_events``), after
    the change; it reads what the tier holds from the index itself (``track``)."""

    def track(self, tier: str, holdings: Callable[[], list[Any]]) -> None: ...

    def stored(self, tier: str, keys: Iterable[Any]) -> None: ...

    def removed(self, tier: str, keys: Iterable[Any]) -> None: ...


class TierIndex:
    """Blocks of one tier, at most ``capacity`` of them.

    ``admits`` asks the admission policy whether a block it does not hold may enter;
    ``make_room`` evicts by policy and returns the victims so that the caller can free (or
    demote) their slots; ``add`` then has room. Pinned blocks and blocks a queued request
    expects (``expect``) are never victims, and expected blocks are always admitted.
    """

    def __init__(self, capacity: int, eviction: str, admission: str = "always", expires: bool = True) -> None:
        if capacity < 0:
            raise ValueError(f"capacity: must be >= 0, got {capacity}")
        self.capacity = capacity
        self._order = policy.make_order(eviction)
        self.admission = make_admission(admission, capacity, eviction)
        self._entries: dict[Key, Entry] = {}
        # Unpinned, oldest first: for ``expired`` (retention). None where blocks do not expire (a
        # tenth of a large tier's index).
        self._recency: OrderedDict[Key, None] | None = OrderedDict() if expires else None
        self._expected: Counter[Key] = Counter()
        self._tick = 0
        self.admitted = self.refused = 0  # offered blocks let in or not (metrics)
        self._listener: IndexListener | None = None
        self._tier = ""

    def watch(self, listener: IndexListener, tier: str) -> None:
        """Report additions and removals to ``listener`` as ``tier``; what is held it reads
        from here (``keys``), so that it keeps no copy of a large tier's keys."""
        self._listener, self._tier = listener, tier
        listener.track(tier, self.keys)

    def keys(self) -> list[Key]:
        """The blocks held now, taken in one step (``list`` of a dict holds the GIL throughout),
        so another thread may call it while the index changes."""
        return list(self._entries)

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
        entry.tick = self._tick
        self._order.touch(key, self._tick)
        if not entry.pinned and self._recency is not None:
            self._recency.move_to_end(key)

    def record_hit(self, key: Key, parent: Key | None) -> None:
        """A request asked for this held block (admission counts sightings)."""
        self.admission.record_hit(key, parent)

    def admits(self, key: Key, parent: Key | None) -> bool:
        """A request offered (or asked for) this block, which the tier does not hold: may it
        enter? Counts the sighting either way; blocks a queued request expects always may, and
        so may every block while the tier has room: a refusal then evicts nothing and only
        loses the block's hits (what limits NVMe writes is ``admit_after_hits``)."""
        admitted = self.admission.admits(key, parent) or key in self._expected or self.has_room()
        if admitted:
            self.admitted += 1
        else:
            self.refused += 1
        return admitted

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
        entry.tick = self._tick
        self._order.add(key, entry.parent, entry.priority, self._tick, self._evictable(key, entry))
        if not entry.pinned and self._recency is not None:
            self._recency[key] = None
        if self._listener is not None:
            self._listener.stored(self._tier, [key])

    def _evictable(self, key: Key, entry: Entry) -> bool:
        return not entry.pinned and key not in self._expected

    def _reorder(self, key: Key) -> None:
        """Tell the order that a held block's evictability changed (recency kept)."""
        entry = self._entries.get(key)
        if entry is not None:
            self._order.remove(key)
            self._order.add(key, entry.parent, entry.priority, entry.tick, self._evictable(key, entry))

    def remove(self, key: Key) -> Entry:
        entry = self._entries.pop(key)
        self._order.remove(key)
        if self._recency is not None:
            self._recency.pop(key, None)
        if self._listener is not None:
            self._listener.removed(self._tier, [key])
        return entry

    def pin(self, key: Key) -> None:
        """Make a present block unevictable for good."""
        entry = self._entries.get(key)
        if entry is None or entry.pinned:
            return
        entry.pinned = True
        if self._recency is not None:
            self._recency.pop(key, None)
        self._reorder(key)

    def expect(self, keys: Iterable[Key]) -> None:
        """A queued request will ask for these blocks: keep them (held now or arriving later)
        until ``unexpect``. Counted, so two queued requests sharing a prefix both hold it."""
        for key in keys:
            self._expected[key] += 1
            if self._expected[key] == 1:
                self._reorder(key)

    def unexpect(self, keys: Iterable[Key]) -> None:
        for key in keys:
            left = self._expected[key] - 1
            if left > 0:
                self._expected[key] = left
                continue
            self._expected.pop(key, None)
            self._reorder(key)

    def is_expected(self, key: Key) -> bool:
        return key in self._expected

    def expired(self, now: float, retention_s: float) -> list[Key]:
        """Unpinned blocks unused for longer than ``retention_s`` (oldest first)."""
        if self._recency is None:
            raise RuntimeError("expired: this index was made without expiry (expires=False)")
        stale: list[Key] = []
        for key in self._recency:
            if now - self._entries[key].last_used <= retention_s:
                break
            if key not in self._expected:
                stale.append(key)
        return stale
