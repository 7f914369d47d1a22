"""Every call from the engine to the KV-tier connector, in one place.

HBM evictions are saved before their device blocks are written again; blocks past the HBM prefix
hit are looked up and loaded into freshly allocated device blocks; admission prefetches. The
connector may fail or be absent: then every lookup is a miss and the engine recomputes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

import torch

from strata.worker.engine.block_manager import BlockManager
from strata.worker.engine.stats import EngineStats
from strata.worker.kv_connector import BlockRef, KVConnector, Tier

log = logging.getLogger(__name__)
T = TypeVar("T")


class BlockStore(Protocol):
    def block(self, block_id: int) -> torch.Tensor: ...


class TierBridge:
    def __init__(
        self,
        connector: KVConnector | None,
        blocks: BlockManager,
        store: BlockStore,
        write_through: bool = False,
        stats: EngineStats | None = None,
    ) -> None:
        self.connector = connector
        self.blocks = blocks
        self.store = store
        self.write_through = write_through and connector is not None
        self.stats = stats if stats is not None else EngineStats()

    def save_evictions(self) -> None:
        """Offer blocks evicted from HBM to the tiers; must run before their ids are written."""
        evictions = self.blocks.take_evictions()
        self.stats.hbm_evictions += len(evictions)
        if self.connector is None or not evictions:
            return
        refs = [e.ref for e in evictions]
        self._call("save", lambda c: c.save(refs, [self.store.block(e.block_id) for e in evictions]))

    def computed(self, refs: Sequence[BlockRef], block_ids: Sequence[int]) -> None:
        """Write-through: offer blocks as soon as they are computed."""
        if self.write_through and refs:
            self._call("save", lambda c: c.save(refs, [self.store.block(b) for b in block_ids]))

    def prefetch(self, hashes: Sequence[bytes]) -> None:
        if self.connector is not None and hashes:
            self._call("prefetch", lambda c: c.prefetch(hashes))

    def load(
        self, refs: Sequence[BlockRef], tokens: Sequence[Sequence[int]], limit: int
    ) -> tuple[list[int], list[Tier]]:
        """Load the longest run of ``refs`` the tiers hold into new device blocks, registered in
        the prefix cache; returns their ids (each with one reference) and source tiers."""
        if self.connector is None or not refs or limit <= 0:
            return [], []
        tiers = self._call("lookup", lambda c: c.lookup([r.hash for r in refs])) or []
        count = min(len(tiers), len(refs), limit)
        if count == 0:
            return [], []
        ids = [self.blocks.allocate() for _ in range(count)]
        self.save_evictions()  # the allocation may have evicted blocks we are about to overwrite
        hashes = [r.hash for r in refs[:count]]
        got = self._call("load", lambda c: c.load(hashes, [self.store.block(b) for b in ids])) or 0
        got = max(0, min(got, count))
        for i in range(got):
            self.blocks.register(ids[i], refs[i], tokens[i])
        self.blocks.release(ids[got:])
        return ids[:got], list(tiers[:got])

    def close(self) -> None:
        if self.connector is not None:
            self._call("close", lambda c: c.close())

    def _call(self, what: str, fn: Callable[[KVConnector], T]) -> T | None:
        assert self.connector is not None
        started = time.monotonic()
        try:
            return fn(self.connector)
        except Exception:  # the tiers are an optimisation: never fail a request for them
            log.warning("kv connector %s failed; treating as a miss", what, exc_info=True)
            return None
        finally:
            if what in self.stats.tier_wait_seconds:
                self.stats.tier_wait_seconds[what] += time.monotonic() - started
