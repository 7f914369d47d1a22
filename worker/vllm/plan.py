"""The scheduler side of Strata's vLLM connector, as pure bookkeeping: which blocks a request
loads from the KV tiers, and which blocks each step saves to them.

vLLM asks the connector, when it first schedules a request, how many tokens past its own prefix
cache hit the tiers hold (``matched``); allocates blocks for them (``allocated``); and at the end
of every scheduling step has it build the step's metadata for the workers (``step``): the loads
planned since the last step, and every block that this step completes. A block is offered to
the tiers as soon as it is computed (the built-in engine's write-through; vLLM reuses an evicted
block's memory without telling a connector first), and the sidecar's admission decides what it
keeps. Keys chain the request's token ids from its root (``keys.vllm_root``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from strata.worker.kv_connector import BlockRef, Tier, block_hash

Lookup = Callable[[Sequence[bytes]], list[Tier]]


@dataclass(frozen=True)
class BlockLoad:
    """Read ``keys`` from the tiers into vLLM's blocks ``block_ids`` (as many as arrive)."""

    request_id: str
    keys: tuple[bytes, ...]
    block_ids: tuple[int, ...]


@dataclass(frozen=True)
class BlockSave:
    """Offer vLLM's blocks ``block_ids`` to the tiers as ``refs``."""

    refs: tuple[BlockRef, ...]
    block_ids: tuple[int, ...]


@dataclass
class StepPlan:
    loads: list[BlockLoad] = field(default_factory=list)
    saves: list[BlockSave] = field(default_factory=list)
    tokens: int = 0  # tokens the step computes (0: an empty step)
    prefill: bool = False  # some of them prompt tokens


@dataclass(frozen=True)
class Scheduled:
    """One request in a step: its block ids (all of them, or those added this step), whether
    they replace the ones known (a new or resumed request), its tokens computed before the step
    (cache hits included) and the tokens the step computes."""

    request_id: str
    block_ids: Sequence[int] | None
    replace: bool
    computed_before: int
    scheduled_tokens: int


@dataclass
class RequestBlocks:
    root: bytes
    keys: list[bytes] = field(default_factory=list)  # chain of its full blocks known so far
    block_ids: list[int] = field(default_factory=list)
    saved: int = 0  # leading blocks that are in the tiers or were offered to them
    local_tokens: int = 0  # its own prefix-cache hit, as the last ``matched`` saw it
    hit_tiers: tuple[Tier, ...] = ()  # where the tiers' part of the hit is


class SchedulerBlocks:
    """Per request, its chain of keys and blocks; per step, the plan."""

    def __init__(self, block_size: int, lookup: Lookup) -> None:
        self.block_size = block_size
        self.lookup = lookup
        self.requests: dict[str, RequestBlocks] = {}
        self._loads: list[BlockLoad] = []

    def keys(self, request_id: str, root: bytes, tokens: Sequence[int], blocks: int) -> list[bytes]:
        """The keys of the request's first ``blocks`` full blocks, chained once and kept."""
        state = self.requests.setdefault(request_id, RequestBlocks(root))
        parent = state.keys[-1] if state.keys else state.root
        for i in range(len(state.keys), min(blocks, len(tokens) // self.block_size)):
            parent = block_hash(parent, tokens[i * self.block_size : (i + 1) * self.block_size])
            state.keys.append(parent)
        return state.keys[:blocks]

    def matched(self, request_id: str, root: bytes, tokens: Sequence[int], local_tokens: int) -> int:
        """Tokens past ``local_tokens`` (a block-aligned HBM hit) that the tiers hold, leaving at
        least the last token to compute (the engine needs one to sample from)."""
        usable = (len(tokens) - 1) // self.block_size
        start = local_tokens // self.block_size
        keys = self.keys(request_id, root, tokens, usable)
        state = self.requests[request_id]
        state.local_tokens = local_tokens
        state.hit_tiers = tuple(self.lookup(keys[start:])) if start < usable else ()
        return len(state.hit_tiers) * self.block_size

    def allocated(self, request_id: str, block_ids: Sequence[int], external_tokens: int) -> None:
        """vLLM gave the request its blocks; plan to load the tiers' part of its hit into them."""
        state = self.requests.get(request_id)
        if state is None:
            return
        start = state.local_tokens // self.block_size
        count = external_tokens // self.block_size
        state.hit_tiers = state.hit_tiers[:count]
        if count:
            keys = tuple(state.keys[start : start + count])
            self._loads.append(BlockLoad(request_id, keys, tuple(block_ids[start : start + count])))

    def step(self, scheduled: Sequence[Scheduled], tokens_of: Callable[[str], Sequence[int]]) -> StepPlan:
        """The workers' plan for this step: the loads, then every block the step completes."""
        plan = StepPlan(loads=self._loads)
        self._loads = []
        for item in scheduled:
            save = self._completed(item, tokens_of(item.request_id))
            if save is not None:
                plan.saves.append(save)
        return plan

    def _completed(self, item: Scheduled, tokens: Sequence[int]) -> BlockSave | None:
        state = self.requests.get(item.request_id)
        if state is None:
            return None
        if item.replace:
            state.block_ids = list(item.block_ids or ())
            if not state.saved:  # first scheduled: what it had cached needs no save
                state.saved = item.computed_before // self.block_size
        elif item.block_ids:
            state.block_ids += item.block_ids
        computed_after = item.computed_before + item.scheduled_tokens
        full = min(computed_after, len(tokens)) // self.block_size
        full = min(full, len(state.block_ids))
        if full <= state.saved:
            return None
        keys = self.keys(item.request_id, state.root, tokens, full)
        first = state.saved
        state.saved = full
        refs = tuple(BlockRef(keys[i], keys[i - 1] if i else state.root, i) for i in range(first, full))
        return BlockSave(refs, tuple(state.block_ids[first:full]))

    def finished(self, request_id: str) -> None:
        self.requests.pop(request_id, None)
