"""Cache-aware scale-in: before the replica count goes down, rank the service's pods by the cache
they would take with them, and tell the ReplicaSet through ``controller.kubernetes.io/pod-deletion-cost``
so that the coldest pod is removed first.

A pod's cache value, in prompt tokens (``cache_value``):

- recent hits: prompt tokens it served from its own tiers (HBM, DRAM, NVMe), as a sum decayed
  with a half-life of ``HIT_HALF_LIFE_S``, updated from every autoscaler scrape. The shared tier
  is left out: it outlives the pod, so losing the pod does not lose those hits;
- plus what it holds: blocks in those tiers times the block size (HBM from the worker's
  ``strata_worker_kv_cached_blocks``, DRAM and NVMe from the sidecar's ``strata_kvtier_blocks``),
  the prefixes a router can still send to it once the load has gone (the decayed hits say which
  pod was hot; the blocks still rank pods that have all gone quiet).

The ReplicaSet controller compares deletion costs after readiness (an unready pod still goes
first) and before pod age. StatefulSets ignore the annotation and always remove the highest
ordinal: for them the note only records which pod goes and what it held (docs/operator.md)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from strata.common.tiers import LOCAL_TIERS
from strata.operator.autoscale.metrics import PodSample

DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
HIT_HALF_LIFE_S = 300.0  # the default scale-down window: the load the autoscaler looks back on
MAX_COST = 2**31 - 1  # the annotation is an int32


@dataclass(frozen=True)
class HitScore:
    tokens: float  # decayed local-tier hit tokens
    at: float  # when last updated (the scrape's time)


@dataclass(frozen=True)
class PodCache:
    name: str
    hit_tokens: float  # decayed recent hits (HitScore.tokens); 0 for a pod never scraped twice
    held_blocks: Mapping[str, float]  # per local tier


def local_hits(before: PodSample, now: PodSample) -> float:
    """Local-tier hit tokens between two scrapes of one pod; a pod whose counters went down
    restarted, and everything it counted since is new."""
    restarted = now.prompt_tokens < before.prompt_tokens
    total = 0.0
    for tier in LOCAL_TIERS:
        value = now.prefix_hit_tokens.get(tier, 0.0)
        earlier = 0.0 if restarted else before.prefix_hit_tokens.get(tier, 0.0)
        total += value - earlier if value >= earlier else value
    return total


def update_hits(
    score: HitScore | None, before: PodSample, now: PodSample, at: float, half_life_s: float = HIT_HALF_LIFE_S
) -> HitScore:
    """Decay the score to ``at``, then add the interval's hits."""
    return HitScore(decayed(score, at, half_life_s) + local_hits(before, now), at)


def decayed(score: HitScore | None, at: float, half_life_s: float = HIT_HALF_LIFE_S) -> float:
    if score is None:
        return 0.0
    return score.tokens * math.pow(0.5, max(0.0, at - score.at) / half_life_s)


def cache_value(pod: PodCache, block_size: int) -> float:
    held = sum(pod.held_blocks.get(tier, 0.0) for tier in LOCAL_TIERS)
    return pod.hit_tokens + held * block_size


def deletion_cost(value: float) -> int:
    """The annotation's value: the cache value in tokens, rounded into the int32 range."""
    if math.isnan(value) or value <= 0:
        return 0
    return min(MAX_COST, round(value))


def ranking(pods: Sequence[PodCache], block_size: int) -> list[tuple[str, int]]:
    """(pod name, deletion cost), coldest first; equal costs in name order (stable output)."""
    costs = [(pod.name, deletion_cost(cache_value(pod, block_size))) for pod in pods]
    return sorted(costs, key=lambda c: (c[1], c[0]))


def note(ranked: Sequence[tuple[str, int]], statefulset_victim: str | None) -> str:
    """The Event message: who goes first and the whole ranking."""
    listing = ", ".join(f"{name} {cost}" for name, cost in ranked)
    if statefulset_victim is not None:
        return (
            f"StatefulSet removes the highest ordinal, {statefulset_victim}; its NVMe claim is kept for "
            f"when it returns (cache value in tokens: {listing})"
        )
    if not ranked:
        return "no pod with metrics to rank"
    return f"coldest first: {ranked[0][0]} goes first (pod-deletion-cost, tokens of cache: {listing})"
