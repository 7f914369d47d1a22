"""The KV block pool and the HBM prefix cache, without a single tensor.

Blocks are integer ids with reference counts. A full, computed block is registered under its
chained hash; when its last user leaves it stays cached (unreferenced) so a later request with
the same prefix revives it. Fresh blocks come from the never-used/unhashed free list first and
then from the least recently released cached block; every such eviction is recorded so the
engine can hand the block's data to the KV tiers before the id is written again.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from strata.worker.kv_connector import BlockRef


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    ref: BlockRef | None = None  # set while registered in the prefix cache
    token_ids: tuple[int, ...] = field(default=())  # compared on a hit: the collision guard


@dataclass(frozen=True)
class Eviction:
    block_id: int
    ref: BlockRef


class BlockListener(Protocol):
    """Told of every block entering or leaving the HBM prefix cache (``strata.worker.block_events``)."""

    def stored(self, tier: str, keys: Iterable[bytes]) -> None: ...

    def removed(self, tier: str, keys: Iterable[bytes]) -> None: ...


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1:
            raise ValueError("num_blocks: must be at least 1")
        self.block_size = block_size
        self.blocks = [Block(i) for i in range(num_blocks)]
        self._free: deque[int] = deque(range(num_blocks))
        self._cached: OrderedDict[int, None] = OrderedDict()  # unreferenced, oldest first
        self._by_hash: dict[bytes, int] = {}
        self._evictions: list[Eviction] = []
        self.listener: BlockListener | None = None

    def attach(self, listener: BlockListener) -> None:
        """Report cache changes to ``listener`` from now on, starting with what is cached now."""
        self.listener = listener
        listener.stored("hbm", list(self._by_hash))

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation may take: never-used ones plus unreferenced cached ones."""
        return len(self._free) + len(self._cached)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._by_hash)

    @property
    def usage(self) -> float:
        """Share of blocks held by running sequences (cached-but-free blocks count as free)."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    def can_allocate(self, n: int) -> bool:
        return n <= self.num_free_blocks

    def allocate(self) -> int:
        if self._free:
            block_id = self._free.popleft()
        elif self._cached:
            block_id, _ = self._cached.popitem(last=False)
            self._evict(block_id)
        else:
            raise RuntimeError("no free KV blocks")
        self.blocks[block_id].ref_count = 1
        return block_id

    def _evict(self, block_id: int) -> None:
        block = self.blocks[block_id]
        assert block.ref is not None
        del self._by_hash[block.ref.hash]
        self._evictions.append(Eviction(block_id, block.ref))
        if self.listener is not None:
            self.listener.removed("hbm", [block.ref.hash])
        block.ref, block.token_ids = None, ()

    def take_evictions(self) -> list[Eviction]:
        """Blocks evicted since the last call; their data is intact until the engine writes."""
        evictions, self._evictions = self._evictions, []
        return evictions

    def match(self, hashes: Sequence[bytes], blocks_tokens: Sequence[Sequence[int]]) -> list[int]:
        """Ids of the longest run of leading blocks cached under ``hashes`` with equal tokens."""
        found: list[int] = []
        for h, tokens in zip(hashes, blocks_tokens, strict=False):
            block_id = self._by_hash.get(h)
            if block_id is None or self.blocks[block_id].token_ids != tuple(tokens):
                break
            found.append(block_id)
        return found

    def acquire(self, block_id: int) -> None:
        """Take a reference on a cached block (a prefix hit)."""
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self._cached[block_id]
        block.ref_count += 1

    def register(self, block_id: int, ref: BlockRef, token_ids: Sequence[int]) -> bool:
        """Publish a full, computed block in the prefix cache; False if the hash is taken."""
        if ref.hash in self._by_hash:
            return False
        block = self.blocks[block_id]
        block.ref, block.token_ids = ref, tuple(token_ids)
        self._by_hash[ref.hash] = block_id
        if self.listener is not None:
            self.listener.stored("hbm", [ref.hash])
        return True

    def release(self, block_ids: Sequence[int]) -> None:
        """Drop one reference on each block. Released in reverse so that a chain's tail is
        older in the LRU order than its head and is evicted first."""
        for block_id in reversed(block_ids):
            block = self.blocks[block_id]
            block.ref_count -= 1
            assert block.ref_count >= 0, f"block {block_id} released twice"
            if block.ref_count == 0:
                if block.ref is not None:
                    self._cached[block_id] = None
                else:
                    self._free.append(block_id)

    def evict_cached(self) -> int:
        """Evict every unreferenced cached block (to the tiers, if any); returns how many."""
        count = len(self._cached)
        while self._cached:
            block_id, _ = self._cached.popitem(last=False)
            self._evict(block_id)
            self._free.append(block_id)
        return count
