"""Every call from the engine to the KV-tier connector, in one place: the effects of the
decisions the prefix cache and scheduler make.

Per step, in this order: ``lookup`` asks the tiers about the sequences the scheduler may admit
next (before it schedules); after scheduling, ``save_evictions`` hands the blocks HBM evicted to
the tiers (the one place that saves them, before their device blocks are written again),
``load`` carries out the planned loads, and ``sync_queue`` tells the tiers which requests wait
(look-ahead: their blocks are kept and moved up). Write-through also saves blocks as they are
computed. The connector may fail or be absent: then every lookup is a miss and the engine
recomputes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

import torch

from strata.worker.engine.block_manager import BlockManager
from strata.worker.engine.prefix_cache import PrefixCache, TierLoad, TierLookup
from strata.worker.engine.sequence import Sequence as Seq
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
        prefix: PrefixCache,
        write_through: bool = False,
        lookahead: int = 0,
        stats: EngineStats | None = None,
    ) -> None:
        self.connector = connector
        self.blocks = blocks
        self.store = store
        self.prefix = prefix
        self.write_through = write_through and connector is not None
        self.stats = stats if stats is not None else EngineStats()
        self.lookahead = lookahead if connector is not None else 0
        self._expected: set[int] = set()  # seq_ids announced to the tiers as queued

    def lookup(self, seqs: Sequence[Seq]) -> None:
        """Ask the tiers what they hold past each sequence's HBM hit, for ``attach`` to plan."""
        if self.connector is None:
            return
        for seq in seqs:
            start, hashes = self.prefix.past_hbm(seq)
            known = self.prefix.lookups.get(seq.seq_id)
            if not hashes or (known is not None and known.start == start):
                continue
            self.prefix.lookups[seq.seq_id] = TierLookup(start, tuple(self._lookup(hashes)))

    def save_evictions(self) -> None:
        """Offer blocks evicted from HBM to the tiers; must run before their ids are written."""
        evictions = self.blocks.take_evictions()
        self.stats.hbm_evictions += len(evictions)
        if self.connector is None or not evictions:
            return
        refs = [e.ref for e in evictions]
        self._call("save", lambda c: c.save(refs, [self.store.block(e.block_id) for e in evictions]))

    def load(self, loads: Sequence[TierLoad]) -> list[Seq]:
        """Carry out the planned loads; returns the sequences whose load came up short (they
        compute the rest from the next step on)."""
        short: list[Seq] = []
        for load in loads:
            if not self.prefix.loaded(load, self._load(load)):
                short.append(load.seq)
        return short

    def _lookup(self, hashes: list[bytes]) -> list[Tier]:
        tiers = self._call("lookup", lambda c: c.lookup(hashes)) or []
        return list(tiers[: len(hashes)])

    def _load(self, load: TierLoad) -> int:
        hashes = [r.hash for r in load.refs]
        out = [self.store.block(b) for b in load.block_ids]
        got = self._call("load", lambda c: c.load(hashes, out)) or 0
        return max(0, min(got, len(hashes)))

    def computed(self, published: Sequence[tuple[BlockRef, int]]) -> None:
        """Write-through: offer blocks as soon as they are computed."""
        if self.write_through and published:
            refs = [ref for ref, _ in published]
            self._call("save", lambda c: c.save(refs, [self.store.block(b) for _, b in published]))

    def sync_queue(self, queued: Sequence[Seq]) -> None:
        """Look-ahead: the tiers learn which requests now wait (the first ``lookahead`` in
        admission order) and forget those that were scheduled or left."""
        if not self.lookahead:
            return
        head = {seq.seq_id: seq for seq in queued[: self.lookahead]}
        gone = sorted(self._expected - head.keys())
        if gone:
            self._call("unexpect", lambda c: c.unexpect([str(i) for i in gone]))
        for seq_id, seq in head.items():
            if seq_id not in self._expected:
                self._expect(str(seq_id), self.prefix.usable_hashes(seq))
        self._expected = set(head)

    def _expect(self, request: str, hashes: list[bytes]) -> None:
        self._call("expect", lambda c: c.expect(request, hashes))

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
