"""Counters the engine keeps for metrics; plain numbers, so the engine needs no Prometheus."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from strata.worker.kv_connector import Tier

TIERS: tuple[Tier, ...] = ("hbm", "dram", "nvme", "shared")


@dataclass
class EngineStats:
    prompt_tokens: int = 0
    generation_tokens: int = 0
    recomputed_tokens: int = 0  # prompt/context tokens computed rather than served from a cache
    preemptions: int = 0
    hit_tokens: dict[Tier, int] = field(default_factory=lambda: dict.fromkeys(TIERS, 0))
    rejected: Counter[str] = field(default_factory=Counter)  # reason -> requests refused

    @property
    def prefix_hit_ratio(self) -> float:
        return sum(self.hit_tokens.values()) / self.prompt_tokens if self.prompt_tokens else 0.0
