"""Counters the engine keeps for metrics; plain numbers, so the engine needs no Prometheus."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from strata.common.tiers import TIERS, Tier

# Calls to the KV-tier connector that a step waits on (prefetch only queues work).
TIER_OPS = ("lookup", "load", "save")


@dataclass
class EngineStats:
    prompt_tokens: int = 0
    generation_tokens: int = 0
    recomputed_tokens: int = 0  # prompt/context tokens computed rather than served from a cache
    preemptions: int = 0
    hit_tokens: dict[Tier, int] = field(default_factory=lambda: dict.fromkeys(TIERS, 0))
    rejected: Counter[str] = field(default_factory=Counter)  # reason -> requests refused
    # Where step time goes, for the operator's bottleneck verdict (docs/operator.md).
    busy_seconds: float = 0.0  # wall time inside step() with work to do
    prefill_busy_seconds: float = 0.0  # the part of it in steps that computed prompt tokens
    tier_wait_seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(TIER_OPS, 0.0))
    hbm_evictions: int = 0  # cached blocks pushed out of HBM to make room

    @property
    def prefix_hit_ratio(self) -> float:
        return sum(self.hit_tokens.values()) / self.prompt_tokens if self.prompt_tokens else 0.0
