"""How blocks move between the tiers: promotion into DRAM on a lower-tier hit, demotion when
DRAM or NVMe evicts (write-back), write-down at once (write-through), NVMe admission after
repeated sightings, and the checksum check on every read from a lower tier.

Not thread-safe: the service calls it under its lock. The bytes of a batch move on the NVMe
store's I/O threads and the checksums on ``cpu``'s.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from strata.worker.config import KVTierConfig
from strata.worker.kvtier.arena import checksum
from strata.worker.kvtier.index import Entry
from strata.worker.kvtier.metrics import TierMetrics
from strata.worker.kvtier.nvme import Record
from strata.worker.kvtier.tiers import DramTier, NvmeTier, SharedTier

log = logging.getLogger(__name__)

_SEEN_LIMIT = 1 << 20  # sightings remembered for NVMe admission (oldest forgotten first)


class Mover:
    def __init__(
        self,
        config: KVTierConfig,
        metrics: TierMetrics,
        tiers: tuple[DramTier, NvmeTier | None, SharedTier | None],
        cpu: ThreadPoolExecutor,
        pinned: set[bytes],
    ) -> None:
        self.config = config
        self.metrics = metrics
        self.dram, self.nvme, self.shared = tiers
        self.block_bytes = self.dram.block_bytes
        self.cpu = cpu
        self.seen: OrderedDict[bytes, int] = OrderedDict()
        self.pinned = pinned  # the service's set: pins may arrive before their blocks

    def promote_run(self, keys: Sequence[bytes], parent: bytes | None, staging_ok: bool) -> list[Entry]:
        """Bring the leading blocks of ``keys`` up from a lower tier into DRAM slots (or
        unindexed staging slots when DRAM has no room): the leading run held by NVMe in one
        parallel read, else one block from the shared tier. Returns those that arrived intact."""
        dram = self.dram
        nvme = self.nvme
        run = list(itertools.takewhile(lambda k: nvme is not None and k in nvme.index, keys))
        if not run and (self.shared is None or not keys):
            return []
        now = time.time()
        for key in run:  # most recent: the demotions that make room below should not take them
            nvme.index.touch(key, now)  # type: ignore[union-attr]
        slots = self._promotion_slots(max(1, len(run)), staging_ok)
        if not slots:
            return []
        if run:
            # Making room may still have pushed some out of a full NVMe tier: read what is left.
            run = list(itertools.takewhile(lambda k: nvme is not None and k in nvme.index, run))
            entries = self._read_nvme(run[: len(slots)], slots[: len(run)]) if run else []
        else:
            entry = self._read_shared(keys[0], slots[0])
            entries = [entry] if entry else []
        for slot in slots[len(entries) :]:
            dram.give_back(slot)
        for key, entry in zip(keys, entries, strict=False):
            entry.parent = parent if parent is not None else entry.parent
            parent = key
            if not dram.is_staging(entry.slot):
                entry.pinned = key in self.pinned
                dram.index.add(key, entry)
                self.metrics.promotions.labels("dram").inc()
        self.publish_usage()
        return entries

    def _promotion_slots(self, count: int, staging_ok: bool) -> list[int]:
        dram = self.dram
        slots = self.dram_slots(count) if dram.capacity else []
        while staging_ok and len(slots) < count and (slot := dram.take_slot(staging=True)) is not None:
            slots.append(slot)
        return slots

    def _read_nvme(self, keys: Sequence[bytes], slots: Sequence[int]) -> list[Entry]:
        """Read blocks into ``slots`` in parallel and verify them; the leading intact ones."""
        assert self.nvme is not None
        dram = self.dram
        stored = [self.nvme.index.get(k) for k in keys]
        bufs = [dram.block(s) for s in slots]
        started = time.perf_counter()
        try:
            intact = self.nvme.store.read([(e.slot, b) for e, b in zip(stored, bufs, strict=True) if e])
        except OSError as err:
            log.warning("nvme: read failed: %s", err)
            self.metrics.errors.labels("nvme").inc()
            return []
        sums = list(self.cpu.map(checksum, bufs))
        self.metrics.read_seconds.labels("nvme").observe(time.perf_counter() - started)
        self.metrics.read_bytes.labels("nvme").inc(sum(len(b) for b in bufs))
        now = time.time()
        entries: list[Entry] = []
        for key, entry, ok, crc, slot in zip(keys, stored, intact, sums, slots, strict=True):
            assert entry is not None
            if not ok or crc != entry.checksum:
                self._drop_corrupt_nvme(key)
                break
            self.nvme.index.touch(key, now)
            entries.append(Entry(entry.parent, entry.priority, False, now, slot, entry.checksum))
        return entries

    def _drop_corrupt_nvme(self, key: bytes) -> None:
        assert self.nvme is not None
        log.warning("nvme: block %s failed its checksum; dropped", key.hex())
        self.metrics.corrupt_blocks.labels("nvme").inc()
        entry = self.nvme.index.remove(key)
        self.nvme.store.forget([key])
        self.nvme.give_back(entry.slot)

    def _read_shared(self, key: bytes, slot: int) -> Entry | None:
        assert self.shared is not None
        buf = self.dram.block(slot)
        started = time.perf_counter()
        result = self.shared.read_into(key, buf)
        if result is None:
            log.warning("shared: block %s failed its checksum; dropped", key.hex())
            self.metrics.corrupt_blocks.labels("shared").inc()
            return None
        if not result:
            return None
        self.metrics.read_seconds.labels("shared").observe(time.perf_counter() - started)
        self.metrics.read_bytes.labels("shared").inc(len(buf))
        return Entry(b"\0" * 16, self.config.priority, False, time.time(), slot, checksum(buf))

    def dram_slots(self, count: int) -> list[int]:
        """Up to ``count`` free DRAM slots, evicting (and, write-back, demoting) as needed."""
        dram = self.dram
        while (before := dram.free_slots()) < count:
            victims = dram.index.evict(count - before)
            if not victims:
                break
            self.metrics.evictions.labels("dram").inc(len(victims))
            self.write_down([(k, e) for k, e in victims if isinstance(k, bytes)], demoting=True)
            for _, entry in victims:
                dram.give_back(entry.slot)
            self.publish_usage()
            if dram.free_slots() == before:  # all leased (being read): their slots come back later
                break
        return [
            s
            for s in (dram.take_slot(staging=False) for _ in range(min(count, dram.free_slots())))
            if s is not None
        ]

    def _admitted(self, key: bytes) -> bool:
        return self.seen.get(key, 0) > self.config.nvme.admit_after_hits

    def saw(self, key: bytes) -> None:
        self.seen[key] = self.seen.pop(key, 0) + 1
        if len(self.seen) > _SEEN_LIMIT:
            self.seen.popitem(last=False)

    def write_down(self, blocks: Sequence[tuple[bytes, Entry]], demoting: bool) -> None:
        """Store blocks (their bytes in DRAM or staging slots) in NVMe when admitted, and in the
        shared tier when it is on and the block did not go to NVMe (write-back) or always
        (write-through, so that other workers see it at once)."""
        to_nvme = [
            (k, e)
            for k, e in blocks
            if self.nvme is not None and k not in self.nvme.index and self._admitted(k)
        ]
        self._write_nvme(to_nvme, demoting)
        if self.shared is None:
            return
        nvme_keys = {k for k, _ in to_nvme}
        through = self.config.write_mode == "write-through"
        to_shared = [
            (k, e) for k, e in blocks if (through or k not in nvme_keys) and k not in self.shared.index
        ]
        for key, entry in to_shared:
            self._write_shared(key, entry, self.dram.block(entry.slot), demoting)

    def _write_nvme(self, blocks: Sequence[tuple[bytes, Entry]], demoting: bool) -> None:
        nvme, dram = self.nvme, self.dram
        if nvme is None or not blocks:
            return
        victims = nvme.index.make_room(len(blocks))
        self._evict_nvme(victims)
        batch: list[tuple[Record, memoryview]] = []
        for key, entry in blocks:
            slot = nvme.take_slot()
            if slot is None:
                break
            record = Record(key, _parent_bytes(entry), slot, entry.priority, entry.checksum)
            batch.append((record, dram.block(entry.slot)))
        started = time.perf_counter()
        try:
            nvme.store.write(batch)
        except OSError as err:  # ENOSPC or a failing disk: refuse these blocks, keep serving
            log.warning("nvme: write of %d blocks failed, not stored: %s", len(batch), err)
            self.metrics.errors.labels("nvme").inc()
            for record, _ in batch:
                nvme.give_back(record.slot)
            return
        self.metrics.write_seconds.labels("nvme").observe(time.perf_counter() - started)
        self.metrics.written_bytes.labels("nvme").inc(len(batch) * self.block_bytes)
        if demoting:
            self.metrics.demotions.labels("nvme").inc(len(batch))
        now = time.time()
        for record, _ in batch:
            entry = Entry(record.parent, record.priority, False, now, record.slot, record.checksum)
            nvme.index.add(record.key, entry)
        nvme.store.compact_if_needed(nvme.records())
        self.publish_usage()

    def _evict_nvme(self, victims: Sequence[tuple[object, Entry]]) -> None:
        nvme = self.nvme
        if nvme is None or not victims:
            return
        self.metrics.evictions.labels("nvme").inc(len(victims))
        keys = [k for k, _ in victims if isinstance(k, bytes)]
        if self.shared is not None and self.config.write_mode == "write-back":
            scratch = memoryview(bytearray(self.block_bytes))
            for key, entry in victims:
                if isinstance(key, bytes) and key not in self.shared.index:
                    (intact,) = nvme.store.read([(entry.slot, scratch)])
                    if intact and checksum(scratch) == entry.checksum:
                        self._write_shared(key, entry, scratch, demoting=True)
        nvme.store.forget(keys)
        for _, entry in victims:
            nvme.give_back(entry.slot)

    def _write_shared(self, key: bytes, entry: Entry, data: memoryview, demoting: bool) -> None:
        shared = self.shared
        if shared is None or not shared.healthy:
            return
        for victim, _ in shared.index.make_room(1):
            self.metrics.evictions.labels("shared").inc()
            try:
                shared.store.delete(victim)  # type: ignore[arg-type]
            except OSError as err:
                shared.mark_down(err)
                return
        started = time.perf_counter()
        try:
            shared.store.write(key, _parent_bytes(entry), entry.priority, data)
        except OSError as err:
            self.metrics.errors.labels("shared").inc()
            shared.mark_down(err)
            return
        self.metrics.write_seconds.labels("shared").observe(time.perf_counter() - started)
        self.metrics.written_bytes.labels("shared").inc(len(data))
        if demoting:
            self.metrics.demotions.labels("shared").inc()
        if shared.index.has_room():
            shared.index.add(key, Entry(entry.parent, entry.priority, False, time.time()))

    def publish_usage(self) -> None:
        for name, tier in (("dram", self.dram), ("nvme", self.nvme), ("shared", self.shared)):
            held = len(tier.index) if tier else 0
            self.metrics.used_bytes.labels(name).set(held * self.block_bytes)
            self.metrics.blocks.labels(name).set(held)

    def drop_nvme(self, keys: Sequence[bytes]) -> None:
        assert self.nvme is not None
        for key in keys:
            self.nvme.give_back(self.nvme.index.remove(key).slot)
        self.nvme.store.forget(keys)


def _parent_bytes(entry: Entry) -> bytes:
    return entry.parent if isinstance(entry.parent, bytes) else b"\0" * 16
