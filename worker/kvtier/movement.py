"""How blocks move between the tiers: promotion into DRAM on a lower-tier hit (where DRAM
admission lets them in), DRAM eviction (write-back: demotion, synchronous here when a request
needs room at once, else by the background demoter), NVMe admission, and the checksum check on
every read from a lower tier: here, or, for NVMe blocks read only into staging slots for a
client that checks its reads (``dram.verify_reads``), by that client along its copy out (see
``client_checks``). Writing blocks down is ``writedown``'s job.

Not thread-safe: the service calls it under its lock. A promotion is planned and committed
here under the lock, and read between without it (``promotion``): the bytes of a batch move on
the NVMe store's I/O threads, each block hashed right after its read where it is checked here.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Sequence

from strata.worker.config import KVTierConfig
from strata.worker.kvtier.admission import SightingCounts
from strata.worker.kvtier.index import Entry, TierIndex
from strata.worker.kvtier.metrics import TierMetrics
from strata.worker.kvtier.promotion import Promotion
from strata.worker.kvtier.tiers import DramTier, NvmeTier, SharedTier
from strata.worker.kvtier.writedown import Writer

log = logging.getLogger(__name__)


class Mover:
    def __init__(
        self,
        config: KVTierConfig,
        metrics: TierMetrics,
        tiers: tuple[DramTier, NvmeTier | None, SharedTier | None],
        pinned: set[bytes],
    ) -> None:
        self.config = config
        self.metrics = metrics
        self.dram, self.nvme, self.shared = tiers
        self.block_bytes = self.dram.block_bytes
        # nvme.admit_after_hits' counts (kept across restarts: ``sightings``)
        self.seen = SightingCounts(self.nvme.index.capacity if self.nvme else 0)
        self.pinned = pinned  # the service's set: pins may arrive before their blocks
        self.writer = Writer(config, metrics, tiers, self._nvme_admits)
        self.demoting: dict[bytes, Entry] = {}  # evicted from DRAM, being written down
        self.promoting: dict[bytes, str] = {}  # being read up (lock released), from this tier
        self._admissions_published: dict[str, tuple[int, int]] = {}  # per tier: admitted, refused

    def plan_promotion(
        self, keys: Sequence[bytes], parent: bytes | None, staging_ok: bool
    ) -> Promotion | None:
        """Plan bringing the leading blocks of ``keys`` up from a lower tier: the leading run
        NVMe holds (read in one parallel read), else one block from the shared tier; None when
        there is nothing to read or no slot to read into. For a read (``staging_ok``) DRAM
        admission decides which land in DRAM slots and which only pass through staging slots;
        a prefetch takes DRAM slots only, unasked. The keys are marked ``promoting`` and their
        NVMe slots leased until ``commit_promotion``; blocks another promotion is bringing up
        end the run (wait for that one instead of reading them twice)."""
        run = list(itertools.takewhile(self._on_nvme, keys))
        if not run and not self._shared_may_hold(keys):
            return None
        now = time.time()
        for key in run:  # most recent: the demotions that make room below should not take them
            self._nvme_tier().index.touch(key, now)
        wanted = run or list(keys[:1])
        admitted = [self._dram_admits(k, p) if staging_ok else True for k, p in _with_parents(wanted, parent)]
        slots = self._promotion_slots(admitted, staging_ok)
        if run:
            # Making room may still have pushed some out of a full NVMe tier: read what is left.
            wanted = list(itertools.takewhile(self._on_nvme, run))[: len(slots)]
        if not wanted or not slots:
            self._give_back_slots(slots)
            return None
        self._give_back_slots(slots[len(wanted) :])
        slots = slots[: len(wanted)]
        stored = [self._nvme_entry(k) for k in wanted] if run else []
        for entry in stored:
            self._nvme_tier().lease(entry.slot)
        self.promoting.update(dict.fromkeys(wanted, "nvme" if run else "shared"))
        return Promotion(wanted, parent, slots, stored, self.client_checks(slots))

    def _nvme_tier(self) -> NvmeTier:
        assert self.nvme is not None
        return self.nvme

    def _nvme_entry(self, key: bytes) -> Entry:
        """A block the NVMe index holds (the caller just found it there, under the lock)."""
        entry = self._nvme_tier().index.get(key)
        assert entry is not None
        return entry

    def _shared_may_hold(self, keys: Sequence[bytes]) -> bool:
        """Whether to try the shared tier for the first key (not being promoted already)."""
        shared = self.shared
        return shared is not None and bool(keys) and shared.healthy and keys[0] not in self.promoting

    def _on_nvme(self, key: bytes) -> bool:
        return self.nvme is not None and key in self.nvme.index and key not in self.promoting

    def _give_back_slots(self, slots: Sequence[int]) -> None:
        for slot in slots:
            self.dram.give_back(slot)

    def commit_promotion(self, plan: Promotion) -> list[Entry]:
        """Under the lock again, after ``promotion.read``: the blocks that arrived intact, in
        order, each entered in DRAM's index unless it passed through a staging slot; slots
        left unfilled are given back, a block that failed its checksum is dropped from its tier."""
        dram = self.dram
        for key in plan.keys:
            self.promoting.pop(key, None)
        entries = self._nvme_arrived(plan) if plan.from_nvme else self._shared_arrived(plan)
        self._give_back_slots(plan.slots[len(entries) :])
        parent = plan.parent
        for i, (key, entry) in enumerate(zip(plan.keys, entries, strict=False)):
            entry.parent = parent if parent is not None else entry.parent
            parent = key
            if dram.is_staging(entry.slot):
                continue
            held = dram.index.get(key)
            if held is not None:  # a put stored it meanwhile: serve that copy, keep one
                dram.give_back(entry.slot)
                entries[i] = held
                continue
            entry.pinned = key in self.pinned
            dram.index.add(key, entry)
            dram.record(key, entry)  # read and checked: a restart may find it
            self.metrics.promotions.labels("dram").inc()
        self.publish_usage()
        return entries

    def _dram_admits(self, key: bytes, parent: bytes | None) -> bool:
        return bool(self.dram.capacity) and self.dram.index.admits(key, parent)

    def _promotion_slots(self, admitted: Sequence[bool], staging_ok: bool) -> list[int]:
        """A slot per block in order: a DRAM slot for an admitted one while DRAM gives any,
        else a staging slot (when allowed); stops at the first block without one."""
        dram = self.dram
        pool = self.dram_slots(sum(admitted)) if any(admitted) else []
        slots: list[int] = []
        for ok in admitted:
            slot = pool.pop(0) if ok and pool else None
            if slot is None and staging_ok:
                slot = dram.take_slot(staging=True)
            if slot is None:
                break
            slots.append(slot)
        for slot in pool:
            dram.give_back(slot)
        return slots

    def client_checks(self, slots: Sequence[int]) -> bool:
        """Whether blocks read into ``slots`` are left for the reading client to check: only
        staging slots (nothing but that client reads them; a DRAM slot's block must be sound
        before anyone else is served it) and only when clients check (``dram.verify_reads``).
        It checks along the copy it makes anyway, so the block is not read a second time here."""
        return self.config.dram.verify_reads and all(self.dram.is_staging(s) for s in slots)

    def _nvme_arrived(self, plan: Promotion) -> list[Entry]:
        """The leading blocks of an NVMe read that match their checksums. A block evicted (or
        evicted and written again) while it was read is still served, from the bytes read
        while its slot was leased, but only the entry as planned is touched or dropped."""
        nvme = self.nvme
        assert nvme is not None
        for entry in plan.stored:
            nvme.unlease(entry.slot)
        if plan.failed:
            log.warning("nvme: read failed: %s", plan.error)
            self.metrics.errors.labels("nvme").inc()
            return []
        self.metrics.read_seconds.labels("nvme").observe(plan.seconds)
        self.metrics.read_bytes.labels("nvme").inc(len(plan.stored) * self.block_bytes)
        now = time.time()
        entries: list[Entry] = []
        for key, stored, crc, slot in zip(plan.keys, plan.stored, plan.sums, plan.slots, strict=True):
            current = nvme.index.get(key)
            if crc != stored.checksum:
                if current is stored:
                    self.drop_corrupt_nvme(key)
                break
            if current is stored:
                nvme.index.record_hit(key, stored.parent)
                nvme.index.touch(key, now)
            entries.append(Entry(stored.parent, stored.priority, False, now, slot, stored.checksum))
        return entries

    def drop_corrupt_nvme(self, key: bytes) -> None:
        assert self.nvme is not None
        log.warning("nvme: block %s failed its checksum; dropped", key.hex())
        self.metrics.corrupt_blocks.labels("nvme").inc()
        entry = self.nvme.index.remove(key)
        self.nvme.store.forget([key])
        self.nvme.give_back(entry.slot)

    def _shared_arrived(self, plan: Promotion) -> list[Entry]:
        """The shared tier's block, when it was read intact."""
        shared = self.shared
        assert shared is not None
        if plan.error is not None:
            shared.mark_down(plan.error)
            return []
        if plan.corrupt:
            log.warning("shared: block %s failed its checksum; dropped", plan.keys[0].hex())
            self.metrics.corrupt_blocks.labels("shared").inc()
            shared.forget(plan.keys[0])
            return []
        if plan.failed or plan.sums[0] is None:
            return []
        self.metrics.read_seconds.labels("shared").observe(plan.seconds)
        self.metrics.read_bytes.labels("shared").inc(self.block_bytes)
        return [Entry(b"\0" * 16, self.config.priority, False, time.time(), plan.slots[0], plan.sums[0])]

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

    def detach_victims(self, count: int) -> list[tuple[bytes, Entry]]:
        """Evict up to ``count`` DRAM blocks for a background demotion: they leave the index
        but keep their slots, and stay readable, until ``finish_demotion``."""
        victims = [(k, e) for k, e in self.dram.index.evict(count) if isinstance(k, bytes)]
        self.metrics.evictions.labels("dram").inc(len(victims))
        self.demoting.update(victims)
        return victims

    def finish_demotion(self, victims: Sequence[tuple[bytes, Entry]]) -> None:
        for key, entry in victims:
            self.demoting.pop(key, None)
            self.dram.give_back(entry.slot)
        self.publish_usage()

    def _nvme_admits(self, key: bytes, entry: Entry) -> bool:
        """The NVMe tier's admission policy (which counts the sighting) and, for SSD wear,
        at least ``admit_after_hits`` earlier sightings."""
        assert self.nvme is not None
        admitted = self.nvme.index.admits(key, entry.parent)
        return admitted and self.seen.count(key) > self.config.nvme.admit_after_hits

    def saw(self, key: bytes) -> None:
        self.seen.saw(key)

    def write_down(self, blocks: Sequence[tuple[bytes, Entry]], demoting: bool) -> None:
        self.writer.write_down(blocks, demoting)

    def publish_usage(self) -> None:
        for name, tier in (("dram", self.dram), ("nvme", self.nvme), ("shared", self.shared)):
            held = len(tier.index) if tier else 0
            self.metrics.used_bytes.labels(name).set(held * self.block_bytes)
            self.metrics.blocks.labels(name).set(held)
        for name, index in (("dram", self.dram.index), ("nvme", self.nvme.index if self.nvme else None)):
            if index is not None:
                self._publish_admission(name, index)

    def _publish_admission(self, name: str, index: TierIndex) -> None:
        """The index counts what its admission decided; the counters take what is new."""
        m, (admitted, refused) = self.metrics, self._admissions_published.get(name, (0, 0))
        m.admitted.labels(name).inc(index.admitted - admitted)
        m.refused.labels(name).inc(index.refused - refused)
        self._admissions_published[name] = (index.admitted, index.refused)
        m.doorkeeper.labels(name).set(1 if index.admission.rule == "doorkeeper" else 0)

    def drop_nvme(self, keys: Sequence[bytes]) -> None:
        assert self.nvme is not None
        for key in keys:
            self.nvme.give_back(self.nvme.index.remove(key).slot)
        self.nvme.store.forget(keys)


def _with_parents(keys: Sequence[bytes], parent: bytes | None) -> list[tuple[bytes, bytes | None]]:
    return list(zip(keys, [parent, *keys[:-1]], strict=True))
