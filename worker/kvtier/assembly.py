"""The tiers, built at the first hello for the engine's block size: DRAM's slots in shared
memory (fitted to the sidecar's memory and its /dev/shm: ``strata.common.kvbudget``), NVMe's
store, the shared volume with its janitor, the mover and the background workers, and the
admission policies' saved state."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from strata.common.kvbudget import (
    Blocks,
    Fit,
    asked_blocks,
    fit,
    fixed_bytes,
    slot_bytes_for,
    staging_slots_for,
)
from strata.worker.cgroup import memory_limit
from strata.worker.kvtier.arena import SlotArena
from strata.worker.kvtier.demoter import Demoter
from strata.worker.kvtier.janitor import Janitor
from strata.worker.kvtier.movement import Mover
from strata.worker.kvtier.nvme import NvmeStore
from strata.worker.kvtier.recovery import Recovery, open_table
from strata.worker.kvtier.sealer import Sealer
from strata.worker.kvtier.shared import FilesystemBlockStore
from strata.worker.kvtier.shm import shm_room
from strata.worker.kvtier.sightings import (
    NVME_SAVE_EVERY_S,
    SHM_LEAVE_FREE,
    SIGHTINGS,
    Place,
    dram_sightings_path,
    open_places,
)
from strata.worker.kvtier.state import ServiceState
from strata.worker.kvtier.tiers import DramTier, NvmeTier, SharedTier
from strata.worker.kvtier.walls import make_private_dir, tenant_root

log = logging.getLogger(__name__)


class Assembly:
    def __init__(self, state: ServiceState) -> None:
        self.state = state

    def build(self, block_bytes: int) -> None:
        state = self.state
        cfg = state.config
        state.block_bytes, state.slot_bytes = block_bytes, slot_bytes_for(block_bytes)
        state.staging_slots = state.staging_asked or staging_slots_for(state.slot_bytes)
        state.memory = self.fit_memory()
        dram_slots = state.memory.fitted.dram
        arena = SlotArena(cfg.dram.shm_path, state.slot_bytes, dram_slots + state.staging_slots, create=True)
        threading.Thread(target=arena.preallocate, name="kvtier-preallocate", daemon=True).start()
        table, state.found = open_table(cfg, arena, dram_slots, block_bytes)
        held = [record.slot for record in state.found.records]
        eviction, admission = cfg.dram.eviction, cfg.dram.admission
        state.dram = DramTier(arena, dram_slots, block_bytes, eviction, admission, table, held)
        nvme_slots = state.memory.fitted.nvme
        if nvme_slots:
            store = NvmeStore(cfg.nvme.path, state.slot_bytes, block_bytes, nvme_slots, cfg.nvme.io_threads)
            expires = cfg.retention_s is not None
            state.nvme = NvmeTier(store, cfg.nvme.persistent, cfg.nvme.eviction, cfg.nvme.admission, expires)
        if cfg.shared.enabled:
            root = self.tenant_directory(tenant_root(cfg.shared.path, state.tenant))
            legacy = Path(cfg.shared.path)
            state.janitor = Janitor(root, cfg.shared.capacity_bytes, state.metrics.swept, legacy=legacy)
            volume = FilesystemBlockStore(root)
            state.shared = SharedTier(volume, state.memory.fitted.shared, on_full=state.janitor.full)
            state.janitor.start()
        state.mover = Mover(cfg, state.metrics, (state.dram, state.nvme, state.shared), state.pinned)
        if dram_slots:
            state.sealer = Sealer(state.lock, state.dram)
        lower = state.nvme is not None or state.shared is not None
        if state.background_demotion and cfg.write_mode == "write-back" and dram_slots and lower:
            state.demoter = Demoter(state.lock, state.mover, state.staging_slots)
        for name, tier in (("dram", state.dram), ("nvme", state.nvme), ("shared", state.shared)):
            if tier is not None:
                tier.index.watch(state.events, name)
        if state.found.records:
            state.recovery = Recovery(state.lock, state.mover, state.found)
        state.keeper, state.admission_state = open_places(self._admission_places())
        self._publish_capacity()
        log.info("kvtier: dram %d, nvme %d slots of %d bytes", dram_slots, nvme_slots, state.slot_bytes)

    @staticmethod
    def tenant_directory(root: Path) -> Path:
        """The tenant's directory on the shared volume, private; a volume that cannot hold it
        now is one the shared tier skips while it fails (``SharedTier``), not a failed start."""
        try:
            return make_private_dir(root)
        except OSError as err:
            log.warning("shared tier: cannot make the tenant's directory %s: %s", root, err)
            return root

    def fit_memory(self) -> Fit:
        """The blocks each tier may index within the sidecar's memory (``strata.common.kvbudget``)."""
        state = self.state
        cfg, slot_bytes = state.config, state.slot_bytes
        asked = asked_blocks(cfg, state.block_bytes)
        fixed = fixed_bytes(cfg, asked, slot_bytes, state.staging_slots)
        shm = shm_room(Path(cfg.dram.shm_path), state.staging_slots * slot_bytes)
        fitted = fit(asked, memory_limit(cfg.memory_bytes), fixed, slot_bytes, shm)
        if fitted.clipped:
            log.warning(
                "kvtier: %d-byte blocks: fitted within %s bytes of memory and %s of /dev/shm: %s of %s; "
                "give the service spec.model.kvBytesPerToken (the engine logs its model's at its start) "
                "and the operator sizes the sidecar for them",
                state.block_bytes,
                fitted.limit,
                fitted.shm,
                fitted.fitted,
                fitted.asked,
                extra={"event": "memory_fit", **fitted.report()},
            )
        return fitted

    def _admission_places(self) -> list[Place]:
        """Each tier whose admission policy may keep what it learnt (``sightings``)."""
        state = self.state
        cfg, places = state.config, []
        if state.dram is not None and state.dram.capacity:
            path = Path(f"{state.dram.arena.path}.admission")
            admission = state.dram.index.admission
            place = Place("dram", cfg.dram.admission, admission, path, cfg.dram.persistent)
            places.append(self._in_shm(place))
        if state.nvme is not None:
            path = Path(cfg.nvme.path) / "admission.bin"
            admission = state.nvme.index.admission
            places.append(
                Place("nvme", cfg.nvme.admission, admission, path, cfg.nvme.persistent, NVME_SAVE_EVERY_S)
            )
            places.append(self._sightings_place())
        return places

    def _sightings_place(self) -> Place:
        """``nvme.admit_after_hits``' counts: kept with the NVMe tier when it survives a
        restart, else with DRAM when that does (a DRAM block a restart recovered is still
        written down at its eviction, as it would have been)."""
        cfg, mover = self.state.config, self.state.require()
        counts, dram = mover.seen, mover.dram
        on_nvme, in_dram = Path(cfg.nvme.path) / "sightings.bin", dram_sightings_path(dram.arena.path)
        if cfg.nvme.persistent:
            in_dram.unlink(missing_ok=True)
            return Place("sightings", SIGHTINGS, counts, on_nvme, every_s=NVME_SAVE_EVERY_S)
        on_nvme.unlink(missing_ok=True)
        return self._in_shm(
            Place("sightings", SIGHTINGS, counts, in_dram, cfg.dram.persistent and dram.capacity > 0)
        )

    def _in_shm(self, place: Place) -> Place:
        """A place beside the DRAM tier, on the memory-backed volume: saved once the tier's pages
        are all allocated, and only with room to spare."""
        assert self.state.dram is not None
        place.ready, place.leave_free = self.state.dram.arena.preallocated.is_set, SHM_LEAVE_FREE
        return place

    def _publish_capacity(self) -> None:
        state = self.state
        m = state.metrics
        asked = state.memory.asked if state.memory else Blocks(0, 0, 0)
        for name, tier_capacity, configured in (
            ("dram", state.dram.capacity if state.dram else 0, asked.dram),
            ("nvme", state.nvme.index.capacity if state.nvme else 0, asked.nvme),
            ("shared", state.shared.index.capacity if state.shared else 0, asked.shared),
        ):
            m.capacity_bytes.labels(name).set(tier_capacity * state.block_bytes)
            m.configured_bytes.labels(name).set(configured * state.block_bytes)
        state.require().publish_usage()
