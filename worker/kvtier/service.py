"""The sidecar's block service: lookup, get, reserve/put, prefetch, pin, across the tiers.

One object the protocol server calls, made of parts with one job each, which share the tiers,
the lock and the workers (``state.ServiceState``): ``assembly`` builds the tiers at the first
hello; ``lookup`` says where blocks are and prefetches them; ``loads`` serves them out and
``saves`` takes them in (the block transfers); ``leases`` keeps each connection's leases,
reservations, pins and look-ahead; ``direct`` lets an engine read and write its NVMe blocks
itself; ``housekeeping`` sweeps, reports and stops. How blocks move between tiers is
``movement``'s job.

A block is served only after its checksum matched (here, or by the reading client along its
copy out), and a block that fails is dropped from its tier and counted. One lock serialises
index changes; the disks are read and written without it (a load's and a prefetch's reads:
``Loads.promote``; saves: the commit thread), the bytes of a batch moving on the NVMe store's
I/O threads.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future

from strata.common.kvbudget import Fit
from strata.worker.block_events import BlockEvents
from strata.worker.config import KVTierConfig
from strata.worker.kvtier.assembly import Assembly
from strata.worker.kvtier.direct import DirectIO
from strata.worker.kvtier.housekeeping import Housekeeping
from strata.worker.kvtier.leases import Leases
from strata.worker.kvtier.leases import Owner as Owner
from strata.worker.kvtier.loads import Loads
from strata.worker.kvtier.loads import staging_budget as staging_budget
from strata.worker.kvtier.lookup import Lookup
from strata.worker.kvtier.metrics import TierMetrics
from strata.worker.kvtier.saves import PutBlock as PutBlock
from strata.worker.kvtier.saves import Saves
from strata.worker.kvtier.state import ServiceState
from strata.worker.kvtier.tiers import DramTier, NvmeTier, SharedTier


class KVTierService:
    def __init__(
        self,
        config: KVTierConfig,
        metrics: TierMetrics | None = None,
        staging_slots: int | None = None,
        background_demotion: bool = True,
        tenant: str = "",
    ) -> None:
        self.state = ServiceState(config, metrics or TierMetrics(), background_demotion, staging_slots)
        self.state.tenant = tenant
        if staging_slots:
            self.state.staging_slots = staging_slots
        self.assembly = Assembly(self.state)
        self.loads = Loads(self.state)
        self.lookups = Lookup(self.state, self.loads)
        self.leases = Leases(self.state, self.lookups.prefetch)
        self.direct = DirectIO(self.state, self.loads)
        self.saves = Saves(self.state, self.direct)
        self.housekeeping = Housekeeping(self.state)

    # ---- what the tiers are ----

    @property
    def config(self) -> KVTierConfig:
        return self.state.config

    @property
    def metrics(self) -> TierMetrics:
        return self.state.metrics

    @property
    def events(self) -> BlockEvents:
        """What each tier holds, for routers (GET /kv/events)."""
        return self.state.events

    @property
    def dram(self) -> DramTier | None:
        return self.state.dram

    @property
    def nvme(self) -> NvmeTier | None:
        return self.state.nvme

    @property
    def shared(self) -> SharedTier | None:
        return self.state.shared

    @property
    def memory(self) -> Fit | None:
        """What each tier may index within the sidecar's memory."""
        return self.state.memory

    @property
    def block_bytes(self) -> int:
        return self.state.block_bytes

    @property
    def slot_bytes(self) -> int:
        return self.state.slot_bytes

    @property
    def staging_slots(self) -> int:
        return self.state.staging_slots

    @property
    def answer_blocks(self) -> int:
        return self.state.answer_blocks

    # ---- set-up ----

    def configure(self, block_bytes: int) -> dict[str, object]:
        """Size the tiers for the engine's block size (first client, or ``--block-bytes``)."""
        state = self.state
        with state.lock:
            if state.dram is None:
                self.assembly.build(block_bytes)
                self.direct.say()
            elif block_bytes != state.block_bytes:
                raise ValueError(
                    f"block_bytes: sidecar holds {state.block_bytes}-byte blocks, got {block_bytes}"
                )
            assert state.dram is not None
            return {
                "block_bytes": state.block_bytes,
                "slot_bytes": state.slot_bytes,
                "num_slots": state.dram.arena.num_slots,
                "shm_path": str(state.dram.arena.path),
                # A batch this size always finds slots (staging when DRAM is full or pinned).
                "max_batch": state.staging_slots,
                "direct_io": self.direct.offered(),
            }

    def direct_io(self, owner: Owner) -> tuple[int, int]:
        return self.direct.grant(owner)

    # ---- blocks ----

    def lookup(self, keys: Sequence[bytes]) -> list[str]:
        return self.lookups.lookup(keys)

    def get(self, owner: Owner, keys: Sequence[bytes]) -> list[tuple[int, int | None]]:
        return self.loads.get(owner, keys)

    def get_direct(self, owner: Owner, keys: Sequence[bytes]) -> list[tuple[int, int | None]] | None:
        return self.direct.get_direct(owner, keys)

    def read_ahead(self, owner: Owner) -> None:
        self.loads.read_ahead(owner)

    def drop_ahead(self, owner: Owner) -> None:
        self.loads.drop_ahead(owner)

    def reserve(
        self, owner: Owner, keys: Sequence[bytes], parents: Sequence[bytes | None] | None = None
    ) -> list[int | None]:
        return self.saves.reserve(owner, keys, parents)

    def reserve_direct(
        self, owner: Owner, keys: Sequence[bytes], parents: Sequence[bytes | None] | None, direct: bool
    ) -> tuple[list[int | None], list[int | None]]:
        return self.saves.reserve_direct(owner, keys, parents, direct)

    def is_staging(self, slot: int) -> bool:
        return self.saves.is_staging(slot)

    def put(self, owner: Owner, blocks: Sequence[PutBlock], written: Sequence[tuple[int, int]] = ()) -> int:
        return self.saves.put(owner, blocks, written)

    def put_async(
        self, owner: Owner, blocks: Sequence[PutBlock], written: Sequence[tuple[int, int]] = ()
    ) -> Future[int]:
        return self.saves.put_async(owner, blocks, written)

    # ---- connections, pins and hints ----

    def release(self, owner: Owner, slots: Sequence[int], nvme_slots: Sequence[int] = ()) -> None:
        self.leases.release(owner, slots, nvme_slots)

    def drop_owner(self, owner: Owner) -> None:
        self.leases.drop_owner(owner)

    def expect(self, owner: Owner, request: str, keys: Sequence[bytes]) -> None:
        self.leases.expect(owner, request, keys)

    def unexpect(self, owner: Owner, requests: Sequence[str]) -> None:
        self.leases.unexpect(owner, requests)

    def pin(self, keys: Sequence[bytes]) -> None:
        self.leases.pin(keys)

    def prefetch(self, keys: Sequence[bytes]) -> None:
        self.lookups.prefetch(keys)

    def wait_for_hints(self) -> None:
        self.lookups.wait_for_hints()

    # ---- housekeeping ----

    def report_corrupt(self, keys: Sequence[bytes]) -> None:
        self.housekeeping.report_corrupt(keys)

    def sweep(self, now: float | None = None) -> int:
        return self.housekeeping.sweep(now)

    def save_admission_state(self) -> None:
        self.housekeeping.save_admission_state()

    def wait_sealed(self, timeout: float) -> bool:
        return self.housekeeping.wait_sealed(timeout)

    def wait_recovered(self, timeout: float) -> bool:
        return self.housekeeping.wait_recovered(timeout)

    def stats(self) -> dict[str, object]:
        return self.housekeeping.stats()

    def close(self) -> None:
        self.housekeeping.close()
