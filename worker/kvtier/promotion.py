"""A promotion's bytes, read with the sidecar's lock released.

A promotion brings blocks up from a lower tier into DRAM or staging slots. The mover plans it
under the lock (which blocks, into which slots; the NVMe slots it reads are leased, so that an
eviction meanwhile does not hand them to a new block before the read ends) and commits it under
the lock (checksums checked, indexes updated). The read between, here, touches no index: only
the slots the plan owns and the stores, which are safe to read from several threads. So an
engine's lookup, put or save waits for the index, never for a disk or a shared volume.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from strata.worker.kvtier.index import Entry
from strata.worker.kvtier.shared import CorruptBlock
from strata.worker.kvtier.tiers import DramTier, NvmeTier, SharedTier


@dataclass
class Promotion:
    """What to read (planned under the lock) and what was read (filled in without it)."""

    keys: list[bytes]  # in chain order: a run NVMe holds, or one block of the shared tier
    parent: bytes | None  # of the first key
    slots: list[int]  # a DRAM or staging slot per key
    stored: list[Entry]  # NVMe: each key's entry as planned (its slot leased); empty: shared
    client_checks: bool  # the reading client checks the bytes (``Mover.client_checks``)
    sums: list[int | None] = field(default_factory=list)  # per key read: its checksum, None: short
    error: OSError | None = None  # the store failed: nothing was read
    corrupt: bool = False  # the shared block failed its checksum
    seconds: float = 0.0

    @property
    def from_nvme(self) -> bool:
        return bool(self.stored)

    @property
    def failed(self) -> bool:
        """The store failed, or the read ended early (an unexpected error): nothing arrived."""
        return self.error is not None or len(self.sums) != len(self.keys)


def read(plan: Promotion, dram: DramTier, nvme: NvmeTier | None, shared: SharedTier | None) -> None:
    """Read the plan's blocks into its slots (no lock held; the stores' own threads read NVMe
    blocks in parallel). Failures are recorded in the plan for its commit, never raised."""
    started = time.perf_counter()
    try:
        if plan.from_nvme:
            assert nvme is not None
            _read_nvme(plan, dram, nvme)
        else:
            assert shared is not None
            _read_shared(plan, dram, shared)
    except CorruptBlock:
        plan.corrupt = True
    except OSError as err:
        plan.error = err
    plan.seconds = time.perf_counter() - started


def _read_nvme(plan: Promotion, dram: DramTier, nvme: NvmeTier) -> None:
    requests = [(e.slot, dram.slot(s)) for e, s in zip(plan.stored, plan.slots, strict=True)]
    if plan.client_checks:  # a whole read passes here; the client checks the bytes
        whole = nvme.store.read_unhashed(requests)
        plan.sums = [e.checksum if ok else None for e, ok in zip(plan.stored, whole, strict=True)]
    else:
        plan.sums = nvme.store.read(requests)


def _read_shared(plan: Promotion, dram: DramTier, shared: SharedTier) -> None:
    plan.sums = [shared.store.read_checked(plan.keys[0], dram.block(plan.slots[0]))]
