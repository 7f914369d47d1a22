"""The bottleneck verdict (pure): each rule, its numbers, and the order in which they apply."""

from __future__ import annotations

import pytest

from strata.operator.autoscale.bottleneck import diagnose
from strata.operator.autoscale.signals import Aggregate


def interval(
    busy_s: float = 0.0,
    wait_s: float = 0.0,
    kv: float | None = 0.5,
    preemptions: float = 0.0,
    evictions: float = 0.0,
    traffic: bool = True,
    pod_seconds: float = 10.0,
) -> Aggregate:
    engine = {"busy_s": busy_s, "tier_wait_s": wait_s, "preemptions": preemptions, "hbm_evictions": evictions}
    return Aggregate(
        kv_cache_usage=kv,
        ttft_p95_s=None,
        requests_waiting=0,
        prompt_tokens=100.0 if traffic else 0.0,
        engine=engine,
        pod_seconds=pod_seconds,
    )


@pytest.mark.parametrize(
    ("agg", "verdict", "says"),
    [
        (interval(busy_s=0.1, traffic=False), "Idle", "no requests; engine busy 1%"),
        (interval(busy_s=5.0, wait_s=2.0), "DataPathBound", "tier loads and saves take 40% of step time"),
        (interval(busy_s=5.0, kv=0.97, preemptions=3), "HBMBound", "KV cache 97% full with 0.30 preemptions"),
        (interval(busy_s=5.0, kv=0.95, evictions=20), "HBMBound", "2.00 preemptions+evictions/s"),
        (interval(busy_s=9.5, kv=0.4), "ComputeBound", "engine busy 95% (>= 85%), KV cache 40%"),
        (interval(busy_s=4.0, kv=0.3), "Headroom", "engine busy 40%, KV cache 30%"),
    ],
)
def test_each_verdict_with_the_numbers_behind_it(agg: Aggregate, verdict: str, says: str) -> None:
    d = diagnose(agg)
    assert d is not None and d.verdict == verdict
    assert says in d.reason


def test_rules_apply_in_order() -> None:
    # Waiting on tiers wins over a full KV cache; a busy engine whose full cache evicts is HBM-bound
    # (it recomputes what HBM evicted), a busy one without eviction compute-bound.
    assert diagnose(interval(busy_s=9.0, wait_s=3.0, kv=0.99, preemptions=5)).verdict == "DataPathBound"  # type: ignore[union-attr]
    assert diagnose(interval(busy_s=9.5, kv=0.99, evictions=5)).verdict == "HBMBound"  # type: ignore[union-attr]
    assert diagnose(interval(busy_s=9.5, kv=0.99)).verdict == "ComputeBound"  # type: ignore[union-attr]
    # A full cache without preemption or eviction is only a well-used cache.
    assert diagnose(interval(busy_s=5.0, kv=0.99)).verdict == "Headroom"  # type: ignore[union-attr]
    # Traffic keeps a service out of Idle even when its engine is barely busy.
    assert diagnose(interval(busy_s=0.1)).verdict == "Headroom"  # type: ignore[union-attr]


def test_numbers_are_rates_over_the_interval() -> None:
    d = diagnose(interval(busy_s=5.0, wait_s=1.0, preemptions=2, evictions=4, pod_seconds=20.0))
    assert d is not None
    assert d.engine_busy == 0.25 and d.tier_wait_share == 0.2
    assert d.preemptions_per_s == 0.1 and d.hbm_evictions_per_s == 0.2


def test_no_verdict_without_engine_counters_or_a_second_scrape() -> None:
    assert diagnose(Aggregate(kv_cache_usage=0.5, ttft_p95_s=None, requests_waiting=None)) is None
    agg = interval(busy_s=1.0, pod_seconds=0.0)
    assert diagnose(agg) is None
