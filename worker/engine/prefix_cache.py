"""Attaching a sequence to cached KV: the HBM prefix match first, then the lower tiers.

A sequence never takes its last token from a cache: that token's logits must be computed, so
at most ``(num_tokens - 1) // block_size`` blocks can hit.
"""

from __future__ import annotations

from strata.worker.engine.block_manager import BlockManager
from strata.worker.engine.kv_tiers import TierBridge
from strata.worker.engine.sequence import Sequence
from strata.worker.engine.stats import EngineStats
from strata.worker.kv_connector import BlockRef


class PrefixCache:
    def __init__(self, blocks: BlockManager, tiers: TierBridge, root: bytes, stats: EngineStats) -> None:
        self.blocks = blocks
        self.tiers = tiers
        self.root = root
        self.stats = stats
        self.block_size = blocks.block_size

    def _usable_hashes(self, seq: Sequence) -> list[bytes]:
        hashes = seq.full_block_hashes(self.root, self.block_size)
        return hashes[: (seq.num_tokens - 1) // self.block_size]

    def _tokens(self, seq: Sequence, start: int, stop: int) -> list[list[int]]:
        return [seq.block_tokens(i, self.block_size) for i in range(start, stop)]

    def _ref(self, seq: Sequence, index: int) -> BlockRef:
        parent = seq.block_hashes[index - 1] if index else self.root
        return BlockRef(seq.block_hashes[index], parent, index)

    def prefetch(self, seq: Sequence) -> None:
        """On arrival: ask the tiers to start moving up what HBM does not hold."""
        hashes = self._usable_hashes(seq)
        hit = len(self.blocks.match(hashes, self._tokens(seq, 0, len(hashes))))
        self.tiers.prefetch(hashes[hit:])

    def attach(self, seq: Sequence) -> None:
        """Give ``seq`` every cached leading block (HBM, then the tiers) before it is computed."""
        assert not seq.block_table
        hashes = self._usable_hashes(seq)
        hbm = self.blocks.match(hashes, self._tokens(seq, 0, len(hashes)))
        for block_id in hbm:
            self.blocks.acquire(block_id)
        start = len(hbm)
        refs = [self._ref(seq, i) for i in range(start, len(hashes))]
        loaded, tiers = self.tiers.load(
            refs, self._tokens(seq, start, len(hashes)), self.blocks.num_free_blocks
        )
        seq.block_table = hbm + loaded
        seq.num_computed_tokens = seq.num_registered_blocks = len(seq.block_table)
        seq.num_computed_tokens *= self.block_size
        if not seq.admitted:
            seq.hit_tokens = {"hbm": start * self.block_size}
            for tier in tiers:
                seq.hit_tokens[tier] = seq.hit_tokens.get(tier, 0) + self.block_size

    def detach(self, seq: Sequence) -> None:
        self.blocks.release(seq.block_table)
        seq.block_table = []
        seq.num_computed_tokens = seq.num_registered_blocks = 0

    def admitted(self, seq: Sequence) -> None:
        """Count a request's prompt and hits once, however often it is preempted."""
        if seq.admitted:
            return
        seq.admitted = True
        self.stats.prompt_tokens += seq.num_prompt_tokens
        for tier, tokens in seq.hit_tokens.items():
            self.stats.hit_tokens[tier] += tokens

    def register_computed(self, seq: Sequence) -> None:
        """Publish blocks that became full and computed in this step."""
        full = seq.num_computed_tokens // self.block_size
        if full <= seq.num_registered_blocks:
            return
        seq.full_block_hashes(self.root, self.block_size)
        refs, ids = [], []
        for i in range(seq.num_registered_blocks, full):
            ref = self._ref(seq, i)
            if self.blocks.register(seq.block_table[i], ref, seq.block_tokens(i, self.block_size)):
                refs.append(ref)
                ids.append(seq.block_table[i])
        seq.num_registered_blocks = full
        self.tiers.computed(refs, ids)
