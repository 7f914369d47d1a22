"""How many blocks the sidecar may index within the memory it was given.

Why: the sidecar's container is limited to the DRAM tier's pages plus an overhead that the
operator sizes for blocks of 1 MiB or more (``sidecar_memory_bytes`` in operator/resolve.py).
Its indexes cost memory per block held (``INDEX_BYTES_PER_BLOCK``), and a tier's count of
blocks is its size over the model's block size, which only the engine knows, at its first
hello: 1 TiB of NVMe is 512k blocks of an 8B model (2 MiB at 16 tokens a block) but 5.6M of a
0.5B model (192 KiB), whose index would take 3.5 GB. Filled, such a tier got the sidecar
killed by the kernel, and again at every restart as it recovered the NVMe index.

So at its start the sidecar fits what it will index within its memory (``fit``, pure): the
shared tier gives way first (its index bounds only what this worker writes there; every block
on the volume stays readable), then NVMe, then DRAM; and it says so (a warning, the capacity
gauges, ``stats()["memory"]``).

Pure arithmetic, shared by the planes: the operator sizes the sidecar's container with
``needed_bytes``, the sidecar fits its tiers with ``fit``, and routers bound their look-ahead
with ``nearest_within`` and the ``MAX_EXPECTED`` limits.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Protocol

from strata.common.blocks import PAGE
from strata.common.sketchsize import footprint, sightings_table_bytes

# The KV-tier sidecar's staging slots (blocks passing between the engine and the lower tiers)
# take at most this much of the pod's /dev/shm and of the sidecar's memory, beside the DRAM tier:
# 96 slots of blocks up to 2.6 MiB, fewer of larger ones. The operator sizes both for it.
KVTIER_STAGING_BYTES = 256 << 20

# What one held block costs the sidecar: its index entry and its place in the eviction order (up
# to twice, stale heap entries included). Measured in RSS (`python -m bench kvtier`:
# `index_memory`, which checks each against this): 400 bytes an NVMe or shared block, 610 a DRAM
# one, and at the peak of a restart up to 600 an NVMe block (a tier rebuilt from its log, 20,000
# to 500,000 blocks) and 660 a DRAM one, all under the premium tier's policies; an LRU order or a
# recency list (retention) may cost more and is not measured: docs/kvtier.md, Memory and Limits.
INDEX_BYTES_PER_BLOCK = 1024
# The interpreter and its modules (24 MiB measured), threads, the connections' buffers.
BASE_BYTES = 128 << 20
TABLE_BYTES_PER_SLOT = 64  # the DRAM slot table's record per slot, beside the slots (slottable)
# The blocks of the requests an engine announces (look-ahead), together: 64 requests of 32k
# tokens. Each takes about 250 bytes (its key, its count in the DRAM and NVMe indexes): a queue
# of long prompts (64 of 128k tokens is 512k blocks) would otherwise hold hundreds of MB. A
# request past it is not announced; the nearer ones, scheduled sooner, keep theirs.
MAX_EXPECTED_BLOCKS = 1 << 17
MAX_EXPECTED = 256  # queued requests a connection may announce; the oldest are forgotten first
EXPECTED_BYTES_PER_BLOCK = 256
LOOKAHEADS = 2  # the engine's queue, and the routers' together (``announced``): each that many
# Three save batches of 32 blocks: one being committed, one on its way, one being reserved
# (the client saves in batches of a third of these); a load reads half of them per answer. Fewer
# of blocks too large for KVTIER_STAGING_BYTES (a 70B model's 5 MiB: 51), never under the least.
STAGING_SLOTS = 96
LEAST_STAGING_SLOTS = 12


class _Sized(Protocol):
    @property
    def capacity_bytes(self) -> int: ...


class _Admitting(_Sized, Protocol):
    @property
    def admission(self) -> str: ...


class _Shared(_Sized, Protocol):
    @property
    def enabled(self) -> bool: ...


class TierSizes(Protocol):
    """What of a sidecar's config (``strata.worker.config.KVTierConfig``) its memory depends on."""

    @property
    def dram(self) -> _Admitting: ...

    @property
    def nvme(self) -> _Admitting: ...

    @property
    def shared(self) -> _Shared: ...


@dataclass(frozen=True)
class Blocks:
    dram: int
    nvme: int
    shared: int


@dataclass(frozen=True)
class Fit:
    """What each tier may index (``fitted``) of what its size asked for (``asked``)."""

    asked: Blocks
    fitted: Blocks
    limit: int | None  # bytes; None: no limit was known
    fixed: int = 0  # bytes held whatever is indexed: see ``fixed_bytes``
    shm: int | None = None  # bytes of the memory-backed volume the DRAM tier's slots may take

    @property
    def clipped(self) -> bool:
        return self.fitted != self.asked

    def report(self) -> dict[str, object]:
        return {
            "limit_bytes": self.limit,
            "fixed_bytes": self.fixed,
            "shm_room_bytes": self.shm,
            "index_bytes_per_block": INDEX_BYTES_PER_BLOCK,
            "asked": asdict(self.asked),
            "fitted": asdict(self.fitted),
        }


def nearest_within(sizes: Iterable[int], room: int, most: int) -> int:
    """How many of the nearest announced requests (their block counts, nearest first) a
    look-ahead takes: while their blocks fit in ``room``, ``most`` at most; the first that does
    not fit ends it (the sidecar's for its routers, and each router's for what it sends)."""
    taken = 0
    for size in sizes:
        if size > room or taken == most:
            break
        room -= size
        taken += 1
    return taken


def slot_bytes_for(block_bytes: int) -> int:
    """A slot holds one block, rounded up to a whole page."""
    if block_bytes <= 0:
        raise ValueError(f"block_bytes: must be > 0, got {block_bytes}")
    return -(-block_bytes // PAGE) * PAGE


def staging_slots_for(slot_bytes: int) -> int:
    return max(LEAST_STAGING_SLOTS, min(STAGING_SLOTS, KVTIER_STAGING_BYTES // slot_bytes))


def asked_blocks(config: TierSizes, block_bytes: int) -> Blocks:
    """The blocks each tier's size holds: DRAM and NVMe in page-rounded slots, the shared
    volume in files of the block's own size."""
    slot_bytes = slot_bytes_for(block_bytes)
    shared = config.shared.capacity_bytes // block_bytes if config.shared.enabled else 0
    return Blocks(config.dram.capacity_bytes // slot_bytes, config.nvme.capacity_bytes // slot_bytes, shared)


def needed_bytes(config: TierSizes, block_bytes: int) -> int:
    """The memory within which ``fit`` keeps every block the tiers ask for, with blocks of
    ``block_bytes``: what the operator gives a sidecar whose model's KV bytes per token it was
    told (``spec.model.kvBytesPerToken``)."""
    slot_bytes = slot_bytes_for(block_bytes)
    asked = asked_blocks(config, block_bytes)
    fixed = fixed_bytes(config, asked, slot_bytes, staging_slots_for(slot_bytes))
    index = (asked.nvme + asked.shared) * INDEX_BYTES_PER_BLOCK
    return fixed + asked.dram * (slot_bytes + INDEX_BYTES_PER_BLOCK) + index


def fit(asked: Blocks, limit: int | None, fixed: int, slot_bytes: int, shm: int | None = None) -> Fit:
    """The blocks each tier may index within ``limit`` bytes, of which ``fixed`` are taken
    anyway; a DRAM block costs its slot's pages too, and those must fit in ``shm`` bytes of the
    memory-backed volume (with the slot table's record)."""
    dram = asked.dram
    if shm is not None:
        dram = min(dram, max(0, shm) // (slot_bytes + TABLE_BYTES_PER_SLOT))
    if limit is None:
        return Fit(asked, Blocks(dram, asked.nvme, asked.shared), None, fixed, shm)
    budget = max(0, limit - fixed)
    dram = min(dram, budget // (slot_bytes + INDEX_BYTES_PER_BLOCK))
    room = (budget - dram * (slot_bytes + INDEX_BYTES_PER_BLOCK)) // INDEX_BYTES_PER_BLOCK
    nvme = min(asked.nvme, room)
    shared = min(asked.shared, room - nvme)
    return Fit(asked, Blocks(dram, nvme, shared), limit, fixed, shm)


def fixed_bytes(config: TierSizes, asked: Blocks, slot_bytes: int, staging_slots: int) -> int:
    """What the sidecar holds whatever it indexes: the interpreter, the staging slots' pages, the
    look-aheads' announced blocks at most (the engine's and the routers'), and the admission
    policies' sketches and shadow tiers at the asked sizes (at most what the fitted ones take);
    each sketch once more in its file (on the memory-backed volume, or counted as if it were),
    and room for a save's copies of the largest (exported, and its temporary file)."""
    tables = [0]
    keys = 0
    for policy, capacity in ((config.dram.admission, asked.dram), (config.nvme.admission, asked.nvme)):
        if capacity:
            table, shadow_keys = footprint(policy, capacity)
            tables.append(table)
            keys += shadow_keys
    if asked.nvme:
        tables.append(sightings_table_bytes(asked.nvme))
    sketches = 2 * sum(tables) + 2 * max(tables) + keys * INDEX_BYTES_PER_BLOCK
    lookahead = LOOKAHEADS * MAX_EXPECTED_BLOCKS * EXPECTED_BYTES_PER_BLOCK
    return BASE_BYTES + staging_slots * slot_bytes + sketches + lookahead
