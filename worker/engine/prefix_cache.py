"""Attaching a sequence to cached KV: the HBM prefix match first, then the lower tiers.

Decisions only, no I/O and no tensors: the engine asks the tiers which blocks they hold
(``lookups``) before it schedules, ``attach`` plans the loads (device blocks allocated, a
:class:`TierLoad` per sequence), the engine carries them out in the step, and ``loaded``
publishes what arrived. A sequence never takes its last token from a cache: that token's logits
must be computed, so at most ``(num_tokens - 1) // block_size`` blocks can hit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from strata.worker.engine.block_manager import BlockManager
from strata.worker.engine.sequence import Sequence
from strata.worker.engine.stats import EngineStats
from strata.worker.kv_connector import BlockRef, Tier


@dataclass(frozen=True)
class TierLookup:
    """What the tiers held when asked: the tier of each leading block from block ``start``."""

    start: int
    tiers: tuple[Tier, ...]


@dataclass
class TierLoad:
    """Blocks to copy from the tiers into freshly allocated device blocks, in chain order."""

    seq: Sequence
    refs: list[BlockRef]
    block_ids: list[int]
    tiers: list[Tier]
    tokens: list[list[int]] = field(default_factory=list)


class PrefixCache:
    def __init__(self, blocks: BlockManager, root: bytes, stats: EngineStats) -> None:
        self.blocks = blocks
        self.root = root
        self.stats = stats
        self.block_size = blocks.block_size
        self.lookups: dict[int, TierLookup] = {}  # by seq_id; the engine fills it

    def usable_hashes(self, seq: Sequence) -> list[bytes]:
        hashes = seq.full_block_hashes(self.root, self.block_size)
        return hashes[: (seq.num_tokens - 1) // self.block_size]

    def _tokens(self, seq: Sequence, start: int, stop: int) -> list[list[int]]:
        return [seq.block_tokens(i, self.block_size) for i in range(start, stop)]

    def _ref(self, seq: Sequence, index: int) -> BlockRef:
        parent = seq.block_hashes[index - 1] if index else self.root
        return BlockRef(seq.block_hashes[index], parent, index)

    def _hbm_match(self, seq: Sequence) -> list[int]:
        hashes = self.usable_hashes(seq)
        return self.blocks.match(hashes, self._tokens(seq, 0, len(hashes)))

    def past_hbm(self, seq: Sequence) -> tuple[int, list[bytes]]:
        """Where the HBM hit ends and the usable hashes after it: what to ask the tiers."""
        start = len(self._hbm_match(seq))
        return start, self.usable_hashes(seq)[start:]

    def attach(self, seq: Sequence) -> TierLoad | None:
        """Give ``seq`` every cached leading block before it is computed: HBM blocks at once,
        tier blocks (as last looked up) in new device blocks, to be loaded by the engine."""
        assert not seq.block_table
        hbm = self._hbm_match(seq)
        for block_id in hbm:
            self.blocks.acquire(block_id)
        load = self._plan_load(seq, len(hbm))
        seq.block_table = hbm + (load.block_ids if load else [])
        seq.num_computed_tokens = len(seq.block_table) * self.block_size
        seq.num_registered_blocks = len(hbm)
        if not seq.admitted:
            seq.hit_tokens = {"hbm": len(hbm) * self.block_size}
        return load

    def _plan_load(self, seq: Sequence, start: int) -> TierLoad | None:
        lookup = self.lookups.get(seq.seq_id)
        if lookup is None or not lookup.start <= start < lookup.start + len(lookup.tiers):
            return None  # nothing looked up from here (HBM changed since): compute instead
        stop = min(lookup.start + len(lookup.tiers), len(self.usable_hashes(seq)))
        count = min(stop - start, self.blocks.num_free_blocks)
        if count <= 0:
            return None
        ids = [self.blocks.allocate() for _ in range(count)]
        refs = [self._ref(seq, i) for i in range(start, start + count)]
        tiers = list(lookup.tiers[start - lookup.start : start - lookup.start + count])
        return TierLoad(seq, refs, ids, tiers, self._tokens(seq, start, start + count))

    def loaded(self, load: TierLoad, count: int) -> bool:
        """``count`` leading blocks of ``load`` arrived intact: publish them. False when some
        did not: the sequence then computes the rest (its blocks stay allocated for that)."""
        seq = load.seq
        for ref, block_id, tokens in zip(load.refs[:count], load.block_ids, load.tokens, strict=False):
            self.blocks.register(block_id, ref, tokens)
        seq.num_registered_blocks += count
        if not seq.admitted:
            for tier in load.tiers[:count]:
                seq.hit_tokens[tier] = seq.hit_tokens.get(tier, 0) + self.block_size
        if count == len(load.block_ids):
            return True
        seq.num_computed_tokens = seq.num_registered_blocks * self.block_size
        return False

    def detach(self, seq: Sequence) -> None:
        self.blocks.release(seq.block_table)
        seq.block_table = []
        seq.num_computed_tokens = seq.num_registered_blocks = 0

    def admitted(self, seq: Sequence) -> None:
        """Count a request's prompt and hits once, however often it is preempted."""
        self.lookups.pop(seq.seq_id, None)
        if seq.admitted:
            return
        seq.admitted = True
        self.stats.prompt_tokens += seq.num_prompt_tokens
        for tier, tokens in seq.hit_tokens.items():
            self.stats.hit_tokens[tier] += tokens

    def forget(self, seq: Sequence) -> None:
        self.lookups.pop(seq.seq_id, None)

    def register_computed(self, seq: Sequence) -> list[tuple[BlockRef, int]]:
        """Publish blocks that became full and computed in this step; returns them."""
        full = seq.num_computed_tokens // self.block_size
        if full <= seq.num_registered_blocks:
            return []
        seq.full_block_hashes(self.root, self.block_size)
        published: list[tuple[BlockRef, int]] = []
        for i in range(seq.num_registered_blocks, full):
            ref = self._ref(seq, i)
            if self.blocks.register(seq.block_table[i], ref, seq.block_tokens(i, self.block_size)):
                published.append((ref, seq.block_table[i]))
        seq.num_registered_blocks = full
        return published
