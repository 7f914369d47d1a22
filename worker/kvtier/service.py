"""The sidecar's block service: lookup, get, reserve/put, prefetch, pin, across the tiers.

It decides where blocks go (promotion on a lower-tier hit, demotion on DRAM eviction under
write-back, write-down at once under write-through, NVMe admission after repeated sightings)
and keeps every tier's integrity promise: a block is served only after its checksum matched,
and a block that fails is dropped from its tier and counted. One lock serialises index changes;
the bytes of a batch move on the NVMe store's I/O threads.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from strata.worker.config import KVTierConfig
from strata.worker.kvtier.arena import SlotArena, checksum, slot_bytes_for
from strata.worker.kvtier.index import Entry
from strata.worker.kvtier.metrics import TierMetrics
from strata.worker.kvtier.nvme import NvmeStore, Record
from strata.worker.kvtier.shared import FilesystemBlockStore
from strata.worker.kvtier.tiers import DramTier, NvmeTier, SharedTier

log = logging.getLogger(__name__)

_SEEN_LIMIT = 1 << 20  # sightings remembered for NVMe admission (oldest forgotten first)


@dataclass(frozen=True)
class PutBlock:
    key: bytes
    parent: bytes
    slot: int


@dataclass
class Owner:
    """What one client connection holds: leased slots (being read) and reserved slots (being
    written). Released when the connection ends, whatever state the client died in."""

    leases: list[int] = field(default_factory=list)
    reserved: set[int] = field(default_factory=set)


class KVTierService:
    def __init__(
        self, config: KVTierConfig, metrics: TierMetrics | None = None, staging_slots: int = 64
    ) -> None:
        self.config = config
        self.metrics = metrics or TierMetrics()
        self.staging_slots = staging_slots
        self.block_bytes = 0
        self.slot_bytes = 0
        self.dram: DramTier | None = None
        self.nvme: NvmeTier | None = None
        self.shared: SharedTier | None = None
        self._lock = threading.RLock()
        self._seen: OrderedDict[bytes, int] = OrderedDict()
        self._pinned: set[bytes] = set()
        self._background = ThreadPoolExecutor(1, thread_name_prefix="kvtier-prefetch")
        # Checksums of a batch in parallel (the hash releases the GIL on large buffers).
        self._cpu = ThreadPoolExecutor(config.nvme.io_threads, thread_name_prefix="kvtier-checksum")

    # ---- set-up ----

    def configure(self, block_bytes: int) -> dict[str, object]:
        """Size the tiers for the engine's block size (first client, or ``--block-bytes``)."""
        with self._lock:
            if self.dram is None:
                self._build(block_bytes)
            elif block_bytes != self.block_bytes:
                raise ValueError(
                    f"block_bytes: sidecar holds {self.block_bytes}-byte blocks, got {block_bytes}"
                )
            assert self.dram is not None
            return {
                "block_bytes": self.block_bytes,
                "slot_bytes": self.slot_bytes,
                "num_slots": self.dram.arena.num_slots,
                "shm_path": str(self.dram.arena.path),
                # A batch this size always finds slots (staging when DRAM is full or pinned).
                "max_batch": self.staging_slots,
            }

    def _build(self, block_bytes: int) -> None:
        cfg = self.config
        self.block_bytes, self.slot_bytes = block_bytes, slot_bytes_for(block_bytes)
        dram_slots = cfg.dram.capacity_bytes // self.slot_bytes
        arena = SlotArena(cfg.dram.shm_path, self.slot_bytes, dram_slots + self.staging_slots, create=True)
        self.dram = DramTier(arena, dram_slots, cfg.dram.eviction, block_bytes)
        nvme_slots = cfg.nvme.capacity_bytes // self.slot_bytes
        if nvme_slots:
            store = NvmeStore(cfg.nvme.path, self.slot_bytes, block_bytes, nvme_slots, cfg.nvme.io_threads)
            self.nvme = NvmeTier(store, cfg.nvme.eviction, cfg.nvme.persistent)
        if cfg.shared.enabled:
            self.shared = SharedTier(
                FilesystemBlockStore(cfg.shared.path), cfg.shared.capacity_bytes // block_bytes
            )
        self._publish_capacity()
        log.info("kvtier: dram %d, nvme %d slots of %d bytes", dram_slots, nvme_slots, self.slot_bytes)

    def _publish_capacity(self) -> None:
        m = self.metrics
        for name, tier_capacity in (
            ("dram", self.dram.capacity if self.dram else 0),
            ("nvme", self.nvme.index.capacity if self.nvme else 0),
            ("shared", self.shared.index.capacity if self.shared else 0),
        ):
            m.capacity_bytes.labels(name).set(tier_capacity * self.block_bytes)
        self._publish_usage()

    def _publish_usage(self) -> None:
        for name, tier in (("dram", self.dram), ("nvme", self.nvme), ("shared", self.shared)):
            self.metrics.used_bytes.labels(name).set(len(tier.index) * self.block_bytes if tier else 0)

    def _require(self) -> DramTier:
        if self.dram is None:
            raise RuntimeError("sidecar not configured: send hello with block_bytes first")
        return self.dram

    # ---- lookup ----

    def lookup(self, keys: Sequence[bytes]) -> list[str]:
        with self._lock:
            found = [tier for tier in (self._where(k) for k in keys)]
            hits = found.index(None) if None in found else len(found)
            return [t for t in found[:hits] if t is not None]

    def _where(self, key: bytes) -> str | None:
        m = self.metrics
        if self.dram is not None and key in self.dram.index:
            m.hits.labels("dram").inc()
            return "dram"
        m.misses.labels("dram").inc()
        if self.nvme is not None and key in self.nvme.index:
            m.hits.labels("nvme").inc()
            return "nvme"
        m.misses.labels("nvme").inc()
        if self.shared is not None and self.shared.contains(key):
            m.hits.labels("shared").inc()
            return "shared"
        m.misses.labels("shared").inc()
        return None

    # ---- get: into leased slots ----

    def get(self, owner: Owner, keys: Sequence[bytes]) -> list[tuple[int, int | None]]:
        """(slot, checksum) of the leading blocks now in shared memory, leased to ``owner``.
        The checksum is None for blocks verified while being read into the slot just now, so
        the client need not check them again."""
        with self._lock:
            dram = self._require()
            now = time.time()
            out: list[tuple[int, int | None]] = []
            for key in keys:
                self._saw(key)
            i = 0
            while i < len(keys):
                entry = dram.index.get(keys[i])
                fresh = entry is None
                if entry is not None:
                    dram.index.touch(keys[i], now)
                    entries = [entry]
                else:
                    entries = self._promote_run(keys[i:], keys[i - 1] if i else None, staging_ok=True)
                for entry in entries:
                    dram.lease(entry.slot)
                    owner.leases.append(entry.slot)
                    if dram.is_staging(entry.slot):
                        dram.give_back(entry.slot)  # deferred: back in the pool once released
                    out.append((entry.slot, None if fresh else entry.checksum))
                if not entries:
                    break
                i += len(entries)
            return out

    def _promote_run(self, keys: Sequence[bytes], parent: bytes | None, staging_ok: bool) -> list[Entry]:
        """Bring the leading blocks of ``keys`` up from a lower tier into DRAM slots (or
        unindexed staging slots when DRAM has no room): the leading run held by NVMe in one
        parallel read, else one block from the shared tier. Returns those that arrived intact."""
        dram = self._require()
        nvme = self.nvme
        run = list(itertools.takewhile(lambda k: nvme is not None and k in nvme.index, keys))
        if not run and (self.shared is None or not keys):
            return []
        slots = self._promotion_slots(max(1, len(run)), staging_ok)
        if not slots:
            return []
        if run:
            entries = self._read_nvme(run[: len(slots)], slots)
        else:
            entry = self._read_shared(keys[0], slots[0])
            entries = [entry] if entry else []
        for slot in slots[len(entries) :]:
            dram.give_back(slot)
        for key, entry in zip(keys, entries, strict=False):
            entry.parent = parent if parent is not None else entry.parent
            parent = key
            if not dram.is_staging(entry.slot):
                entry.pinned = key in self._pinned
                dram.index.add(key, entry)
                self.metrics.promotions.labels("dram").inc()
        self._publish_usage()
        return entries

    def _promotion_slots(self, count: int, staging_ok: bool) -> list[int]:
        dram = self._require()
        slots = self._dram_slots(count) if dram.capacity else []
        while staging_ok and len(slots) < count and (slot := dram.take_slot(staging=True)) is not None:
            slots.append(slot)
        return slots

    def _read_nvme(self, keys: Sequence[bytes], slots: Sequence[int]) -> list[Entry]:
        """Read blocks into ``slots`` in parallel and verify them; the leading intact ones."""
        assert self.nvme is not None
        dram = self._require()
        stored = [self.nvme.index.get(k) for k in keys]
        bufs = [dram.block(s) for s in slots]
        started = time.perf_counter()
        try:
            intact = self.nvme.store.read([(e.slot, b) for e, b in zip(stored, bufs, strict=True) if e])
        except OSError as err:
            log.warning("nvme: read failed: %s", err)
            self.metrics.errors.labels("nvme").inc()
            return []
        sums = list(self._cpu.map(checksum, bufs))
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
        assert self.shared is not None and self.dram is not None
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

    # ---- DRAM slots and demotion ----

    def _dram_slot(self) -> int | None:
        slots = self._dram_slots(1)
        return slots[0] if slots else None

    def _dram_slots(self, count: int) -> list[int]:
        """Up to ``count`` free DRAM slots, evicting (and, write-back, demoting) as needed."""
        dram = self._require()
        while dram.free_slots() < count:
            victims = dram.index.evict(count - dram.free_slots())
            if not victims:
                break
            self.metrics.evictions.labels("dram").inc(len(victims))
            self._write_down([(k, e) for k, e in victims if isinstance(k, bytes)], demoting=True)
            for _, entry in victims:
                dram.give_back(entry.slot)
            self._publish_usage()
        return [
            s
            for s in (dram.take_slot(staging=False) for _ in range(min(count, dram.free_slots())))
            if s is not None
        ]

    def _admitted(self, key: bytes) -> bool:
        return self._seen.get(key, 0) > self.config.nvme.admit_after_hits

    def _saw(self, key: bytes) -> None:
        self._seen[key] = self._seen.pop(key, 0) + 1
        if len(self._seen) > _SEEN_LIMIT:
            self._seen.popitem(last=False)

    def _write_down(self, blocks: Sequence[tuple[bytes, Entry]], demoting: bool) -> None:
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
            self._write_shared(key, entry, self._require().block(entry.slot), demoting)

    def _write_nvme(self, blocks: Sequence[tuple[bytes, Entry]], demoting: bool) -> None:
        nvme, dram = self.nvme, self._require()
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
        self._publish_usage()

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

    # ---- reserve / put: the engine writes blocks into slots ----

    def reserve(self, owner: Owner, keys: Sequence[bytes]) -> list[int | None]:
        """A slot per key to copy the block into, or None where the tiers already hold it
        (or cannot take it). Reserved slots belong to ``owner`` until ``put``."""
        with self._lock:
            dram = self._require()
            now = time.time()
            wanted: list[bytes] = []
            for key in keys:
                self._saw(key)
                if key in dram.index:
                    dram.index.touch(key, now)
                elif not (self.nvme is not None and key in self.nvme.index and dram.capacity == 0):
                    wanted.append(key)
            unique = list(dict.fromkeys(wanted))
            slots = self._dram_slots(len(unique)) if dram.capacity else []
            given = {k: (slots[i] if i < len(slots) else None) for i, k in enumerate(unique)}
            return [self._assign(owner, key, given) for key in keys]

    def _assign(self, owner: Owner, key: bytes, given: dict[bytes, int | None]) -> int | None:
        if key not in given:
            return None
        slot = given.pop(key)
        if slot is None:
            slot = self._require().take_slot(staging=True)
        if slot is not None:
            owner.reserved.add(slot)
        return slot

    def put(self, owner: Owner, blocks: Sequence[PutBlock]) -> int:
        """Commit blocks the engine copied into its reserved slots; returns how many were kept.
        The checksum is taken here, from the bytes actually in shared memory."""
        started = time.perf_counter()
        with self._lock:
            dram = self._require()
            now = time.time()
            stored: list[tuple[bytes, Entry]] = []
            staged: list[tuple[bytes, Entry]] = []
            mine = [b.slot for b in blocks if b.slot in owner.reserved]
            sums = dict(zip(mine, self._cpu.map(lambda s: checksum(dram.block(s)), mine), strict=True))
            for block in blocks:
                if block.slot not in owner.reserved:
                    raise ValueError(f"blocks: slot {block.slot} is not reserved by this connection")
                owner.reserved.discard(block.slot)
                entry = Entry(block.parent, self.config.priority, block.key in self._pinned, now, block.slot)
                entry.checksum = sums[block.slot]
                if dram.is_staging(block.slot) or block.key in dram.index:
                    staged.append((block.key, entry))
                    continue
                dram.index.add(block.key, entry)
                stored.append((block.key, entry))
            self.metrics.written_bytes.labels("dram").inc(len(stored) * self.block_bytes)
            self.metrics.write_seconds.labels("dram").observe(time.perf_counter() - started)
            if self.config.write_mode == "write-through":
                self._write_down(stored, demoting=False)
            self._write_down([(k, e) for k, e in staged if dram.is_staging(e.slot)], demoting=False)
            for _, entry in staged:
                dram.give_back(entry.slot)
            self._publish_usage()
            return len(stored) + len(staged)

    # ---- connection bookkeeping ----

    def release(self, owner: Owner, slots: Sequence[int]) -> None:
        with self._lock:
            dram = self._require()
            for slot in slots:
                if slot in owner.leases:
                    owner.leases.remove(slot)
                    dram.unlease(slot)

    def drop_owner(self, owner: Owner) -> None:
        """A connection ended: its leases end and its unfilled reservations go back."""
        with self._lock:
            if self.dram is None:
                return
            for slot in owner.leases:
                self.dram.unlease(slot)
            for slot in owner.reserved:
                self.dram.give_back(slot)
            owner.leases.clear()
            owner.reserved.clear()

    def report_corrupt(self, keys: Sequence[bytes]) -> None:
        """The client found these DRAM blocks failing their checksum: drop them."""
        with self._lock:
            dram = self._require()
            for key in keys:
                if key in dram.index:
                    entry = dram.index.remove(key)
                    dram.give_back(entry.slot)
                    self.metrics.corrupt_blocks.labels("dram").inc()
            self._publish_usage()

    # ---- hints ----

    def prefetch(self, keys: Sequence[bytes]) -> None:
        """Start promoting lower-tier blocks of the chain to DRAM in the background."""
        if self.dram is not None and self.dram.capacity:
            self._background.submit(self._prefetch_now, list(keys))

    def _prefetch_now(self, keys: list[bytes]) -> None:
        try:
            with self._lock:
                dram = self._require()
                parent: bytes | None = None
                for key in keys:
                    if key not in dram.index and not self._promote_run([key], parent, staging_ok=False):
                        break
                    parent = key
        except Exception:  # a hint must never take the sidecar down
            log.exception("kvtier: prefetch failed")

    def pin(self, keys: Sequence[bytes]) -> None:
        """Keep these blocks resident in DRAM from now on (also ones that arrive later)."""
        with self._lock:
            self._pinned.update(keys)
            if self.dram is not None:
                for key in keys:
                    self.dram.index.pin(key)
        self.prefetch(keys)

    # ---- housekeeping ----

    def sweep(self, now: float | None = None) -> int:
        """Drop blocks unused for longer than ``retention_s``; returns how many."""
        retention = self.config.retention_s
        if retention is None:
            return 0
        now = time.time() if now is None else now
        dropped = 0
        with self._lock:
            if self.dram is not None:
                for key in self.dram.index.expired(now, retention):
                    self.dram.give_back(self.dram.index.remove(key).slot)
                    dropped += 1
            if self.nvme is not None:
                stale = [k for k in self.nvme.index.expired(now, retention) if isinstance(k, bytes)]
                self._evict_nvme_without_demotion(stale)
                dropped += len(stale)
            self._publish_usage()
        return dropped

    def _evict_nvme_without_demotion(self, keys: Sequence[bytes]) -> None:
        assert self.nvme is not None
        for key in keys:
            self.nvme.give_back(self.nvme.index.remove(key).slot)
        self.nvme.store.forget(keys)

    def stats(self) -> dict[str, object]:
        with self._lock:
            tiers: dict[str, object] = {}
            for name, tier in (("dram", self.dram), ("nvme", self.nvme), ("shared", self.shared)):
                if tier is not None:
                    tiers[name] = {"blocks": len(tier.index), "capacity_blocks": tier.index.capacity}
            return {"block_bytes": self.block_bytes, "tiers": tiers, "pinned": len(self._pinned)}

    def close(self) -> None:
        """Stop serving: later requests get "not configured" errors, never a closed file."""
        self._background.shutdown(wait=True)
        self._cpu.shutdown(wait=True)
        with self._lock:
            if self.nvme is not None:
                self.nvme.store.close()
            if self.dram is not None:
                with contextlib.suppress(BufferError):  # a request's view still alive
                    self.dram.arena.close()
            self.dram = self.nvme = self.shared = None


def _parent_bytes(entry: Entry) -> bytes:
    return entry.parent if isinstance(entry.parent, bytes) else b"\0" * 16


def default_shm_path(config: KVTierConfig) -> Path:
    return Path(config.dram.shm_path)
