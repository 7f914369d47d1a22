"""Writing blocks down to NVMe and the shared tier, in three steps so that the I/O can run
without the service's lock: ``plan`` (under the lock: which blocks go where, room made, NVMe
slots taken), ``write`` (the bytes and the NVMe commit records; no lock) and ``commit`` (under
the lock: the blocks enter the lower tiers' indexes). ``write_down`` runs all three at once.
``write`` is ``start`` (queue the NVMe writes, returns at once) and ``finish`` (wait for them,
sync, append the records): a staging put queues its batch under the lock and leaves the rest
to the service's committer, so the next batch's writes queue behind it meanwhile.

The bytes written are in DRAM or staging slots, which the caller keeps (leased or held) until
``commit`` returns; or the engine wrote them itself (``take_direct``; the plan's ``engine``):
then ``finish`` only syncs and logs them, in the same sync as the sidecar's own writes.
"""

from __future__ import annotations

import logging
import mmap
import time
from collections.abc import Callable, Sequence, Set
from concurrent.futures import Future
from dataclasses import dataclass, field

from strata.worker.config import KVTierConfig
from strata.worker.kvtier.index import Entry
from strata.worker.kvtier.metrics import TierMetrics
from strata.worker.kvtier.nvme import NvmeStore, Record
from strata.worker.kvtier.tiers import DramTier, NvmeTier, SharedTier

log = logging.getLogger(__name__)


@dataclass
class WritePlan:
    demoting: bool
    nvme: list[tuple[Record, memoryview]] = field(default_factory=list)
    shared: list[tuple[bytes, Entry, memoryview]] = field(default_factory=list)
    nvme_pending: list[Future[Record]] = field(default_factory=list)  # queued by ``start``
    started: float = 0.0
    nvme_written: list[Record] = field(default_factory=list)  # with their checksums
    nvme_error: OSError | None = None
    shared_written: list[bool] = field(default_factory=list)
    nvme_seconds: float = 0.0
    # Blocks the engine wrote itself into NVMe slots ``take_direct`` gave it, with their
    # checksums: nothing to write, only to sync, log and index with the sidecar's own.
    engine: list[Record] = field(default_factory=list)


class Writer:
    def __init__(
        self,
        config: KVTierConfig,
        metrics: TierMetrics,
        tiers: tuple[DramTier, NvmeTier | None, SharedTier | None],
        nvme_admits: Callable[[bytes, Entry], bool],
    ) -> None:
        self.config = config
        self.metrics = metrics
        self.dram, self.nvme, self.shared = tiers
        self.nvme_admits = nvme_admits
        self.block_bytes = self.dram.block_bytes
        self.in_flight: set[bytes] = set()  # planned for NVMe, not committed yet

    def write_down(self, blocks: Sequence[tuple[bytes, Entry]], demoting: bool) -> None:
        """Store blocks in NVMe when admitted, and in the shared tier when it is on and the
        block did not go to NVMe (write-back) or always (write-through, so that other workers
        see it at once). Runs under the caller's lock, I/O included."""
        plan = self.plan(blocks, demoting)
        self.write(plan)
        self.commit(plan)

    # ---- plan (lock held) ----

    def plan(
        self, blocks: Sequence[tuple[bytes, Entry]], demoting: bool, refused: Set[bytes] = frozenset()
    ) -> WritePlan:
        """Which blocks go to NVMe (slots taken) and which to the shared tier. ``refused``: keys
        NVMe's admission already refused at their reserve (``take_direct``): not asked twice,
        which would count a second sighting."""
        plan = WritePlan(demoting)
        nvme = self.nvme
        wanted = [(k, e) for k, e in blocks if k not in refused]
        to_nvme = [(k, e) for k, e in wanted if nvme is not None and self._nvme_takes(k, e)]
        plan.nvme = self._take_nvme_slots(to_nvme)
        self.in_flight.update(record.key for record, _ in plan.nvme)
        if self.shared is not None and self.shared.healthy:
            nvme_keys = {record.key for record, _ in plan.nvme}
            through = self.config.write_mode == "write-through"
            for key, entry in blocks:
                if (through or key not in nvme_keys) and key not in self.shared.index:
                    plan.shared.append((key, entry, self.dram.block(entry.slot)))
        return plan

    def _nvme_takes(self, key: bytes, entry: Entry) -> bool:
        assert self.nvme is not None
        if not self.nvme.admits_writes(time.monotonic()):  # full: refused before admission counts it
            return False
        return key not in self.nvme.index and key not in self.in_flight and self.nvme_admits(key, entry)

    def _take_nvme_slots(self, blocks: Sequence[tuple[bytes, Entry]]) -> list[tuple[Record, memoryview]]:
        records = self._take_records(blocks)
        return [
            (record, self.dram.slot(entry.slot)) for record, (_, entry) in zip(records, blocks, strict=False)
        ]

    def take_direct(self, blocks: Sequence[tuple[bytes, Entry]]) -> list[Record | None]:
        """Under the lock: an NVMe slot (in a record without its checksum yet) for each block
        the tier admits, for the engine to write itself; None for the others. In flight until
        their plan (its ``engine``) commits, or ``abandon``."""
        taken = [(k, e) for k, e in blocks if self.nvme is not None and self._nvme_takes(k, e)]
        records = {record.key: record for record in self._take_records(taken)}
        self.in_flight.update(records)
        return [records.get(key) for key, _ in blocks]

    def abandon(self, records: Sequence[Record]) -> None:
        """Under the lock: slots ``take_direct`` gave an engine that will not commit them (its
        connection ended): free again. Any bytes it wrote there are in no index."""
        assert self.nvme is not None or not records
        for record in records:
            self.in_flight.discard(record.key)
            if self.nvme is not None:
                self.nvme.give_back(record.slot)

    def _take_records(self, blocks: Sequence[tuple[bytes, Entry]]) -> list[Record]:
        """Free NVMe slots for the leading ``blocks`` (the tier evicting to make room), as far
        as there are slots; records for them, with the entries' checksums where they have one."""
        nvme = self.nvme
        if nvme is None or not blocks:
            return []
        # Room for these and for the blocks still in flight (their slots are taken; they enter
        # the index at their commit), or a pipelined put would find no free slot.
        self.evict_nvme(nvme.index.make_room(len(blocks) + len(self.in_flight)))
        records: list[Record] = []
        for key, entry in blocks:
            slot = nvme.take_slot()
            if slot is None:
                break
            records.append(Record(key, _parent_bytes(entry), slot, entry.priority, entry.checksum))
        return records

    def _shared_room(self) -> bool:
        """Make room for one more block in this worker's share (victims' files deleted). Asked
        at the commit, for a block this worker did write: one another replica had written
        already costs this worker's share nothing."""
        shared = self.shared
        assert shared is not None
        for victim, _ in shared.index.make_room(1):
            self.metrics.evictions.labels("shared").inc()
            try:
                shared.store.delete(victim)  # type: ignore[arg-type]
            except OSError as err:
                shared.mark_down(err)
                return False
        return shared.index.has_room()

    def evict_nvme(self, victims: Sequence[tuple[object, Entry]]) -> None:
        """NVMe victims leave (write-back: to the shared tier, when it is on and they are
        intact); their slots are free again."""
        nvme = self.nvme
        if nvme is None or not victims:
            return
        self.metrics.evictions.labels("nvme").inc(len(victims))
        keys = [k for k, _ in victims if isinstance(k, bytes)]
        if self.shared is not None and self.config.write_mode == "write-back":
            scratch = memoryview(mmap.mmap(-1, nvme.store.slot_bytes))  # page-aligned
            for key, entry in victims:
                if isinstance(key, bytes) and key not in self.shared.index:
                    (crc,) = nvme.store.read([(entry.slot, scratch)])
                    if crc == entry.checksum:
                        plan = WritePlan(demoting=True, shared=[(key, entry, scratch[: self.block_bytes])])
                        self.write(plan)
                        self.commit(plan)
        nvme.store.forget(keys)
        for _, entry in victims:
            nvme.give_back(entry.slot)

    # ---- write (no lock) ----

    def write(self, plan: WritePlan) -> None:
        if plan.nvme and self.nvme is not None:
            plan.started = time.perf_counter()
            self._nvme_io(plan, lambda store: store.write(plan.nvme))
        plan.shared_written = [self._write_shared(key, entry, data) for key, entry, data in plan.shared]

    def start(self, plan: WritePlan) -> None:
        """``write``'s first half: queue the plan's NVMe writes on the store's I/O threads and
        return at once (the lock may be held: nothing here waits for the device)."""
        if plan.nvme and self.nvme is not None:
            plan.started = time.perf_counter()
            plan.nvme_pending = self.nvme.store.submit(plan.nvme)

    def finish(self, plan: WritePlan) -> None:
        """``write``'s second half: wait for the queued NVMe writes and make them durable, with
        the blocks the engine wrote (one sync for both); write the shared tier's blocks."""
        if plan.nvme_pending or plan.engine:
            if not plan.nvme_pending:
                plan.started = time.perf_counter()  # (the engine's writes are timed by the engine)
            self._nvme_io(plan, lambda store: store.commit([*store.written(plan.nvme_pending), *plan.engine]))
        plan.shared_written = [self._write_shared(key, entry, data) for key, entry, data in plan.shared]

    def _nvme_io(self, plan: WritePlan, io: Callable[[NvmeStore], list[Record]]) -> None:
        assert self.nvme is not None
        try:
            plan.nvme_written = io(self.nvme.store)
        except OSError as err:  # ENOSPC or a failing disk: refuse these blocks, keep serving
            plan.nvme_error = err
        plan.nvme_seconds = time.perf_counter() - plan.started

    def _write_shared(self, key: bytes, entry: Entry, data: memoryview) -> bool:
        assert self.shared is not None
        started = time.perf_counter()
        try:
            if self.shared.store.contains(key):  # another replica wrote it: a stat, not a write
                return False  # nor this worker's to evict: the janitor sees to it
            self.shared.store.write(key, _parent_bytes(entry), entry.priority, data)
        except OSError as err:
            self.metrics.errors.labels("shared").inc()
            self.shared.write_failed(err)
            return False
        self.metrics.write_seconds.labels("shared").observe(time.perf_counter() - started)
        self.metrics.written_bytes.labels("shared").inc(len(data))
        return True

    # ---- commit (lock held) ----

    def commit(self, plan: WritePlan) -> None:
        self._commit_nvme(plan)
        shared = self.shared
        for (key, entry, _), written in zip(plan.shared, plan.shared_written, strict=True):
            if written and shared is not None and key not in shared.index and self._shared_room():
                shared.index.add(key, Entry(entry.parent, entry.priority, False, time.time()))
                if plan.demoting:
                    self.metrics.demotions.labels("shared").inc()

    def _commit_nvme(self, plan: WritePlan) -> None:
        nvme = self.nvme
        records = [record for record, _ in plan.nvme] + plan.engine
        if nvme is None or not records:
            return
        self.in_flight.difference_update(record.key for record in records)
        if plan.nvme_error is not None:
            self._nvme_failed(nvme, records, plan.nvme_error)
            return
        nvme.write_succeeded()
        self.metrics.full.labels("nvme").set(0)
        self.metrics.write_seconds.labels("nvme").observe(plan.nvme_seconds)
        self.metrics.written_bytes.labels("nvme").inc(len(records) * self.block_bytes)
        self.metrics.direct_written_bytes.labels("nvme").inc(len(plan.engine) * self.block_bytes)
        if plan.demoting:
            self.metrics.demotions.labels("nvme").inc(len(records))
        now = time.time()
        for record in plan.nvme_written:
            entry = Entry(record.parent, record.priority, False, now, record.slot, record.checksum)
            nvme.index.add(record.key, entry)
        if nvme.store.needs_compaction(len(nvme.index)):
            try:
                nvme.store.compact(nvme.records(), len(nvme.index))
            except OSError as err:  # the old log still holds every record: compact later
                self._nvme_failed(nvme, [], err)

    def _nvme_failed(self, nvme: NvmeTier, records: Sequence[Record], err: OSError) -> None:
        """Blocks not stored: their slots back; a full volume stops admissions for a while."""
        if not nvme.write_failed(err, time.monotonic()):
            log.warning("nvme: write of %d blocks failed, not stored: %s", len(records), err)
        self.metrics.errors.labels("nvme").inc()
        self.metrics.full.labels("nvme").set(1 if nvme.full_reason else 0)
        for record in records:
            nvme.give_back(record.slot)


def _parent_bytes(entry: Entry) -> bytes:
    return entry.parent if isinstance(entry.parent, bytes) else b"\0" * 16
