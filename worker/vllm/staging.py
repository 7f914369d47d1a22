"""Blocks between vLLM's paged cache and the KV-tier client, a batch at a time.

vLLM keeps each layer's cache in a tensor of its own, so a Strata block (every layer's share of
a block of tokens) is gathered into a staging buffer before a save and scattered out of it after
a load. The buffer holds ``STAGING_BLOCKS`` blocks, where the cache is: page-aligned host memory
beside a CPU engine (so the tiers' direct NVMe I/O can reach it), device memory beside a GPU
engine (the client copies device blocks to and from the slots by DMA and hashes them there).
"""

from __future__ import annotations

from collections.abc import Sequence

from strata.worker.engine.model_runner import allocate_cache
from strata.worker.kv_connector import BlockRef, KVConnector
from strata.worker.vllm.layout import PagedCache

STAGING_BLOCKS = 64  # 128 MiB of an 8B model's 2 MiB blocks


class Staging:
    def __init__(self, cache: PagedCache, client: KVConnector, blocks: int = STAGING_BLOCKS) -> None:
        self.cache, self.client = cache, client
        self.buffer = allocate_cache((blocks, *cache.block_shape), cache.dtype, cache.device)
        self.loaded = self.saved = 0  # blocks, for the log and the tests

    @property
    def batch(self) -> int:
        return int(self.buffer.shape[0])

    def load(self, keys: Sequence[bytes], block_ids: Sequence[int]) -> int:
        """Read ``keys`` into vLLM's blocks ``block_ids``; how many leading blocks arrived."""
        done = 0
        for start in range(0, len(keys), self.batch):
            count = min(self.batch, len(keys) - start)
            out = self.buffer[:count]
            got = max(0, min(count, self.client.load(keys[start : start + count], list(out))))
            if got:
                self.cache.write(block_ids[start : start + got], out[:got])
            done += got
            if got < count:
                break
        self.loaded += done
        return done

    def save(self, refs: Sequence[BlockRef], block_ids: Sequence[int]) -> None:
        """Offer vLLM's blocks ``block_ids`` to the tiers as ``refs``."""
        for start in range(0, len(refs), self.batch):
            count = min(self.batch, len(refs) - start)
            data = self.buffer[:count]
            self.cache.read(block_ids[start : start + count], data)
            self.client.save(refs[start : start + count], list(data))
        self.saved += len(refs)
