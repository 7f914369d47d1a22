"""One replica's KV cache: the engine's own HBM block manager
(``strata.worker.engine.block_manager.BlockManager``: reference counts, a prefix cache keyed by
block hash, least recently released blocks evicted first, chains released tail-first) above the
lower tiers of ``tiers.py``.

Blocks are the trace's blocks (512 tokens for the Mooncake traces), keyed by their trace id. A
request may be served at most ``(prompt - 1) // block`` leading blocks from the caches (its last
token's logits must be computed), as the worker's prefix cache allows. Blocks a request fills
with its answer hold HBM while it runs but are never published: the trace does not say which
later prompt would contain them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from strata.common.tiers import LowerTier
from strata.sim.profile import Profile
from strata.sim.tiers import Key, LowerTiers
from strata.worker.engine.block_manager import BlockManager
from strata.worker.kv_connector import BlockRef

ROOT = b"\0" * 8  # the parent of every chain's first block


def key_of(block_id: int) -> Key:
    return block_id.to_bytes(8, "little")


@dataclass
class Attached:
    """What admitting a request found: blocks from HBM and from each lower tier, and the time
    loading the latter takes."""

    block_ids: list[int]
    hbm_blocks: int
    tier_blocks: dict[LowerTier, int] = field(default_factory=dict)
    load_s: float = 0.0


class ReplicaCache:
    def __init__(self, num_blocks: int, block_tokens: int, block_bytes: int, tiers: LowerTiers) -> None:
        self.hbm = BlockManager(max(1, num_blocks), block_tokens)
        self.block_tokens = block_tokens
        self.block_bytes = block_bytes
        self.tiers = tiers

    @property
    def usage(self) -> float:
        """The engine's ``kv_cache_usage_ratio``: share of blocks held by running sequences."""
        return self.hbm.usage

    def attach(self, keys: Sequence[Key], prompt_tokens: int, profile: Profile) -> Attached:
        """Take every cached leading block of the prompt (HBM, then as many from the tiers as
        HBM has free blocks for)."""
        usable = list(keys[: (prompt_tokens - 1) // self.block_tokens])
        hbm = self.hbm.match(usable, [()] * len(usable))
        for block_id in hbm:
            self.hbm.acquire(block_id)
        # Acquired hits leave the free pool: what the tiers bring must fit in what is left.
        below = self.tiers.lookup(usable[len(hbm) :])[: self.hbm.num_free_blocks]
        loaded = [self._load(usable, len(hbm) + i) for i in range(len(below))]
        if below:
            start = len(hbm)
            self.tiers.read(usable[start : start + len(below)], self._parents(usable, start, len(below)))
        found = Attached(hbm + loaded, len(hbm))
        for tier in below:
            found.tier_blocks[tier] = found.tier_blocks.get(tier, 0) + 1
        found.load_s = sum(profile.read_s(t, n * self.block_bytes) for t, n in found.tier_blocks.items())
        self.flush_evictions()
        return found

    def _load(self, usable: Sequence[Key], position: int) -> int:
        block_id = self.hbm.allocate()
        self._register(block_id, usable, position)
        return block_id

    def _parents(self, keys: Sequence[Key], start: int, count: int) -> list[Key | None]:
        return [keys[i - 1] if i else None for i in range(start, start + count)]

    def _register(self, block_id: int, keys: Sequence[Key], position: int) -> bool:
        parent = keys[position - 1] if position else ROOT
        return self.hbm.register(block_id, BlockRef(keys[position], parent, position), ())

    def allocate(self, count: int) -> list[int] | None:
        """``count`` fresh blocks, or None (nothing taken) when HBM has no room."""
        if not self.hbm.can_allocate(count):
            return None
        ids = [self.hbm.allocate() for _ in range(count)]
        self.flush_evictions()
        return ids

    def publish(self, block_ids: Sequence[int], keys: Sequence[Key], start: int, stop: int) -> None:
        """Blocks ``start..stop`` of a prompt became full and computed: into the prefix cache
        (and, write-through, down to the tiers at once)."""
        fresh = [i for i in range(start, stop) if self._register(block_ids[i], keys, i)]
        if fresh and self.tiers.write_through:
            self.tiers.save([(keys[i], keys[i - 1] if i else None) for i in fresh])

    def release(self, block_ids: Sequence[int]) -> None:
        self.hbm.release(block_ids)

    def flush_evictions(self) -> None:
        """Blocks HBM evicted since the last call go to the tiers, as the engine's connector
        ``save`` sends them."""
        evicted = self.hbm.take_evictions()
        if evicted and not self.tiers.write_through:
            self.tiers.save([(e.ref.hash, e.ref.parent if e.ref.position else None) for e in evicted])
