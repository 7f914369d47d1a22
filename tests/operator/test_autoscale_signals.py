"""Signals over an interval: counter and histogram deltas, resets, pods coming and going, p95."""

from __future__ import annotations

import math

import pytest

from strata.operator.autoscale.metrics import PodSample
from strata.operator.autoscale.signals import Scrape, aggregate, histogram_quantile

BOUNDS = (0.1, 0.5, 1.0, math.inf)


def pod(
    usage: float = 0.5,
    buckets: tuple[float, ...] = (0, 0, 0, 0),
    hits: dict[str, float] | None = None,
    prompt: float = 0,
    waiting: float = 0,
) -> PodSample:
    return PodSample(
        kv_usage=usage,
        requests_waiting=waiting,
        ttft_buckets=tuple(zip(BOUNDS, buckets, strict=True)),
        ttft_count=buckets[-1],
        prefix_hit_tokens=hits or {},
        prompt_tokens=prompt,
    )


def test_quantile_interpolates_inside_the_bucket_like_prometheus():
    # 100 observations: 50 under 0.1 s, 40 in (0.1, 0.5], 10 in (0.5, 1]. Rank 95 lies halfway
    # into the last finite bucket: 0.5 + 0.5 * (95 - 90) / 10 = 0.75.
    assert histogram_quantile(0.95, [(0.1, 50), (0.5, 90), (1.0, 100), (math.inf, 100)]) == 0.75
    # Inside the first bucket the lower bound is 0: rank 47.5 of 50 -> 0.095.
    assert histogram_quantile(0.475, [(0.1, 50), (0.5, 90), (math.inf, 100)]) == pytest.approx(0.095)


def test_quantile_in_the_inf_bucket_is_the_highest_finite_bound():
    assert histogram_quantile(0.95, [(0.1, 1), (0.5, 1), (math.inf, 10)]) == 0.5


def test_quantile_of_nothing_is_unknown():
    assert histogram_quantile(0.95, [(0.1, 0), (math.inf, 0)]) is None
    assert histogram_quantile(0.95, []) is None


def test_ttft_p95_is_over_the_interval_only_and_merges_pods():
    before = Scrape(0, {"a": pod(buckets=(100, 100, 100, 100)), "b": pod(buckets=(0, 0, 0, 0))})
    # In the interval: a got 10 slow ones (0.5..1 s), b 10 fast ones. The earlier 100 fast ones
    # of a do not count, or the p95 would sit in the first bucket.
    after = Scrape(15, {"a": pod(buckets=(100, 100, 110, 110)), "b": pod(buckets=(10, 10, 10, 10))})
    agg = aggregate(before, after)
    assert agg.first_tokens == 20
    # 20 merged: 10 <= 0.1, 10 in (0.5, 1]; rank 19 -> 0.5 + 0.5 * 9 / 10.
    assert agg.ttft_p95_s == pytest.approx(0.95)


def test_kv_usage_is_the_mean_over_scraped_pods_and_waiting_the_sum():
    before = Scrape(0, {"a": pod(0.2)})
    agg = aggregate(before, Scrape(15, {"a": pod(0.9, waiting=2), "b": pod(0.5, waiting=3)}))
    assert agg.kv_cache_usage == pytest.approx(0.7) and agg.requests_waiting == 5


def test_prefix_hit_ratio_per_tier_is_delta_hits_over_delta_prompt():
    before = Scrape(0, {"a": pod(hits={"hbm": 100, "dram": 0}, prompt=1000)})
    after = Scrape(15, {"a": pod(hits={"hbm": 150, "dram": 100}, prompt=1200)})
    agg = aggregate(before, after)
    assert agg.prefix_hit_ratio == {"dram": 0.5, "hbm": 0.25}
    assert agg.prompt_tokens == 200 and agg.had_traffic


def test_a_restarted_pod_counts_its_whole_new_values():
    before = Scrape(0, {"a": pod(buckets=(50, 50, 50, 50), hits={"hbm": 500}, prompt=5000)})
    after = Scrape(15, {"a": pod(buckets=(0, 4, 4, 4), hits={"hbm": 30}, prompt=60)})
    agg = aggregate(before, after)
    assert agg.first_tokens == 4 and agg.prompt_tokens == 60
    assert agg.prefix_hit_ratio == {"hbm": 0.5}
    assert agg.ttft_p95_s is not None and 0.1 < agg.ttft_p95_s <= 0.5


def test_a_new_pod_adds_its_gauge_but_no_deltas_and_a_gone_pod_nothing():
    before = Scrape(0, {"old": pod(0.4, buckets=(1, 1, 1, 1), prompt=10)})
    after = Scrape(15, {"new": pod(0.8, buckets=(9, 9, 9, 9), prompt=900)})
    agg = aggregate(before, after)
    assert agg.kv_cache_usage == 0.8
    assert agg.first_tokens == 0 and agg.prompt_tokens == 0 and agg.ttft_p95_s is None
    assert agg.prefix_hit_ratio == {} and not agg.had_traffic


def test_no_pods_means_no_signals():
    agg = aggregate(Scrape(0, {}), Scrape(15, {}))
    assert agg.kv_cache_usage is None and agg.ttft_p95_s is None and agg.requests_waiting is None


def busy(seconds: float | None) -> PodSample:
    return PodSample(kv_usage=0.1, engine={} if seconds is None else {"prefill_busy_s": seconds})


def test_prefill_utilization_is_the_share_of_pod_time_spent_on_prompts():
    before = Scrape(0.0, {"a": busy(10.0), "b": busy(0.0)})
    after = Scrape(20.0, {"a": busy(15.0), "b": busy(1.0), "c": busy(3.0)})
    # a: 5 s of 20, b: 1 s of 20; c was not seen before.
    assert aggregate(before, after).prefill_utilization == pytest.approx((5 + 1) / 40)
    # The load: 6 s of prompts in 20 s is 0.3 replicas' worth, however many pods were measured.
    assert aggregate(before, after).prefill_busy == pytest.approx(6 / 20)


def test_prefill_utilization_survives_a_restart_and_is_unknown_without_the_counter():
    restarted = aggregate(Scrape(0.0, {"a": busy(50.0)}), Scrape(10.0, {"a": busy(2.0)}))
    assert restarted.prefill_utilization == pytest.approx(0.2)  # the new counter's value is the delta
    unknown = aggregate(Scrape(0.0, {"a": busy(None)}), Scrape(10.0, {"a": busy(None)}))
    assert unknown.prefill_utilization is None and unknown.prefill_busy is None
