"""A replica's lower KV tiers (DRAM, NVMe) and its service's shared tier, with the sidecar's own
index and eviction orders (``strata.worker.kvtier.index.TierIndex``), sized and configured from
the ServiceTier's cache policy.

Blocks move as the sidecar moves them (``worker/kvtier/service.py`` and ``movement.py``), minus
the bytes: a save puts a block in DRAM; DRAM victims go down (write-back) to NVMe when admitted,
else to the shared tier; NVMe victims go to the shared tier; write-through also writes every
saved block down at once; a lower-tier hit is promoted into DRAM. Each of DRAM and NVMe admits
blocks by the tier's admission policy (``TierIndex.admits``: always, doorkeeper or adaptive), a
block DRAM refuses going straight down; NVMe also needs a block seen (saved or read) more than
``admitAfterHits`` times, as the sidecar does. Retention sweeps are left out: the traces span
an hour, the shortest default retention is six.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from strata.common.tiers import LowerTier
from strata.operator.api import ServiceTierSpec
from strata.operator.api.quantity import parse_size
from strata.worker.kvtier.admission import SightingCounts
from strata.worker.kvtier.index import Entry, TierIndex

Key = bytes


@dataclass(frozen=True)
class TierSizes:
    """Capacities in blocks, from the tier's default sizes and the block's bytes."""

    dram: int
    nvme: int
    shared: int

    @classmethod
    def of(cls, spec: ServiceTierSpec, block_bytes: int) -> TierSizes:
        cache = spec.cache
        shared = parse_size(cache.shared.size_per_service) // block_bytes if cache.shared.enabled else 0
        return cls(
            dram=parse_size(cache.dram.default_size) // block_bytes,
            nvme=parse_size(cache.nvme.default_size) // block_bytes,
            shared=shared,
        )


class SharedTier:
    """The service's shared tier: one index for all its replicas."""

    def __init__(self, capacity: int, eviction: str) -> None:
        self.index = TierIndex(capacity, eviction) if capacity else None


class LowerTiers:
    """DRAM and NVMe of one replica, plus its service's shared tier."""

    def __init__(self, spec: ServiceTierSpec, sizes: TierSizes, shared: SharedTier) -> None:
        cache = spec.cache
        self.priority = spec.priority
        self.write_through = cache.write_mode == "write-through"
        self.admit_after = cache.nvme.admit_after_hits
        self.dram = TierIndex(sizes.dram, cache.dram.eviction, cache.dram.admission) if sizes.dram else None
        self.nvme = TierIndex(sizes.nvme, cache.nvme.eviction, cache.nvme.admission) if sizes.nvme else None
        self.shared = shared.index
        self.seen = SightingCounts(sizes.nvme)  # admitAfterHits' counts, as the sidecar keeps them
        self.clock = 0.0

    def lookup(self, keys: Sequence[Key]) -> list[LowerTier]:
        """The tier of each leading block held below HBM, stopping at the first miss."""
        found: list[LowerTier] = []
        for key in keys:
            tier = self._where(key)
            if tier is None:
                break
            found.append(tier)
        return found

    def _where(self, key: Key) -> LowerTier | None:
        if self.dram is not None and key in self.dram:
            return "dram"
        if self.nvme is not None and key in self.nvme:
            return "nvme"
        if self.shared is not None and key in self.shared:
            return "shared"
        return None

    def read(self, keys: Sequence[Key], parents: Sequence[Key | None]) -> None:
        """The engine loads these blocks (found by ``lookup``): count the sightings, promote
        lower-tier blocks into DRAM, and (write-through) write newly admitted ones to NVMe."""
        for key in keys:
            self._saw(key)
        for key, parent in zip(keys, parents, strict=True):
            if self.dram is not None and key in self.dram:
                self.dram.record_hit(key, parent)
                self.dram.touch(key, self._tick())
            else:
                self._touch_below(key)
                self._into_dram(key, parent)
        if self.write_through:
            self._write_down(list(zip(keys, parents, strict=True)))

    def save(self, blocks: Sequence[tuple[Key, Key | None]]) -> None:
        """Blocks offered by the engine (evicted from HBM, or just computed under write-through)."""
        stored: list[tuple[Key, Key | None]] = []
        for key, parent in blocks:
            self._saw(key)
            if self.dram is not None and key in self.dram:
                self.dram.touch(key, self._tick())
                continue
            if self._into_dram(key, parent):
                stored.append((key, parent))
            else:  # no DRAM tier: the block passes through a staging slot, straight down
                self._write_down([(key, parent)])
        if self.write_through:
            self._write_down(stored)

    def _tick(self) -> float:
        self.clock += 1.0
        return self.clock

    def _saw(self, key: Key) -> None:
        self.seen.saw(key)

    def _admitted(self, key: Key, parent: Key | None) -> bool:
        assert self.nvme is not None
        return self.nvme.admits(key, parent) and self.seen.count(key) > self.admit_after

    def _touch_below(self, key: Key) -> None:
        for index in (self.nvme, self.shared):
            if index is not None and key in index:
                index.touch(key, self._tick())

    def _into_dram(self, key: Key, parent: Key | None) -> bool:
        dram = self.dram
        if dram is None or dram.capacity == 0 or not dram.admits(key, parent):
            return False
        victims = dram.make_room(1)
        self._demote(victims)
        if not dram.has_room():
            return False
        dram.add(key, self._entry(parent))
        return True

    def _entry(self, parent: Key | None) -> Entry:
        return Entry(parent=parent, priority=self.priority, pinned=False, last_used=self._tick())

    def _demote(self, victims: Sequence[tuple[object, Entry]]) -> None:
        if not self.write_through:
            self._write_down([(k, e.parent) for k, e in victims if isinstance(k, bytes)])  # type: ignore[misc]

    def _write_down(self, blocks: Sequence[tuple[Key, Key | None]]) -> None:
        """To NVMe when admitted; to the shared tier when it did not go to NVMe (write-back) or
        always (write-through)."""
        nvme = self.nvme
        to_nvme = {k for k, p in blocks if nvme is not None and k not in nvme and self._admitted(k, p)}
        for key, parent in blocks:
            if key in to_nvme:
                self._into_nvme(key, parent)
            if self.shared is not None and (self.write_through or key not in to_nvme):
                self._into_shared(key, parent)

    def _into_nvme(self, key: Key, parent: Key | None) -> None:
        nvme = self.nvme
        assert nvme is not None
        victims = nvme.make_room(1)
        if self.shared is not None and not self.write_through:
            for victim, entry in victims:
                if isinstance(victim, bytes):
                    self._into_shared(victim, entry.parent)  # type: ignore[arg-type]
        if nvme.has_room():
            nvme.add(key, self._entry(parent))

    def _into_shared(self, key: Key, parent: Key | None) -> None:
        shared = self.shared
        if shared is None or key in shared:
            return
        shared.make_room(1)
        if shared.has_room():
            shared.add(key, self._entry(parent))
