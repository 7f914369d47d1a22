"""The autoscaler's parser against the worker's real exposition (its own WorkerMetrics)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from strata.operator.autoscale.metrics import MetricsError, parse_exposition
from strata.worker.engine.stats import EngineStats
from strata.worker.kv_connector import Tier
from strata.worker.server.metrics import LATENCY_BUCKETS, WorkerMetrics


def worker_exposition(usage: float, ttfts: list[float], hits: dict[Tier, int], prompt: int) -> str:
    stats = EngineStats(prompt_tokens=prompt)
    stats.hit_tokens.update(hits)
    engine = SimpleNamespace(
        blocks=SimpleNamespace(usage=usage, num_cached_blocks=7), stats=stats, kv_bytes_per_token=12288
    )
    metrics = WorkerMetrics(SimpleNamespace(engine=engine, num_waiting=3, num_running=2), "m")  # type: ignore[arg-type]
    for seconds in ttfts:
        metrics.ttft.observe(seconds)
    return metrics.render().decode()


def test_parses_the_workers_own_exposition():
    text = worker_exposition(0.625, [0.02, 0.3, 0.3, 7.0], {"hbm": 40, "dram": 10}, 200)
    sample = parse_exposition(text)
    assert sample.kv_usage == 0.625
    assert sample.requests_waiting == 3
    assert sample.prompt_tokens == 200
    assert sample.kv_cached_blocks == 7
    assert sample.kv_bytes_per_token == 12288
    assert sample.prefix_hit_tokens == {"hbm": 40, "dram": 10, "nvme": 0, "shared": 0}
    assert sample.ttft_count == 4
    bounds = [b for b, _ in sample.ttft_buckets]
    assert bounds == [*LATENCY_BUCKETS, math.inf]
    counts = dict(sample.ttft_buckets)
    assert counts[0.025] == 1 and counts[0.5] == 3 and counts[5.0] == 3 and counts[10.0] == 4
    assert counts[math.inf] == 4


def test_an_idle_worker_has_zero_counts():
    sample = parse_exposition(worker_exposition(0.0, [], {}, 0))
    assert sample.kv_usage == 0.0 and sample.ttft_count == 0 and sample.prompt_tokens == 0
    assert all(count == 0 for _, count in sample.ttft_buckets)


def test_hand_written_lines_parse_too():
    text = (
        "# TYPE strata_worker_kv_cache_usage_ratio gauge\n"
        "strata_worker_kv_cache_usage_ratio 0.5\n"
        'strata_worker_time_to_first_token_seconds_bucket{le="0.1"} 1.0\n'
        'strata_worker_time_to_first_token_seconds_bucket{le="+Inf"} 2.0\n'
        "strata_worker_time_to_first_token_seconds_count 2.0\n"
    )
    sample = parse_exposition(text)
    assert sample.kv_usage == 0.5 and sample.ttft_buckets == ((0.1, 1.0), (math.inf, 2.0))
    assert sample.kv_bytes_per_token is None  # a worker from before the gauge


@pytest.mark.parametrize("value", ["0", "-5", "NaN", "+Inf", str(2**40)])
def test_a_kv_size_no_model_has_is_ignored(value):
    text = f"strata_worker_kv_cache_usage_ratio 0.5\nstrata_worker_kv_bytes_per_token {value}\n"
    assert parse_exposition(text).kv_bytes_per_token is None


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("not prometheus {{{", "not Prometheus"),
        ("# TYPE other gauge\nother 1\n", "not a Strata worker"),
        ('strata_worker_time_to_first_token_seconds_bucket{le="0.1"} 1\n', "no le=.*Inf"),
        ('strata_worker_time_to_first_token_seconds_bucket{le="soon"} 1\n', "bad le"),
    ],
)
def test_bad_expositions_are_refused_with_the_reason(text, fragment):
    with pytest.raises(MetricsError, match=fragment):
        parse_exposition(text)


def test_engine_counters_and_the_slo_counter_come_from_the_worker() -> None:
    stats = EngineStats(
        prompt_tokens=10, preemptions=2, hbm_evictions=7, busy_seconds=4.5, prefill_busy_seconds=2.5
    )
    stats.tier_wait_seconds.update({"load": 1.0, "save": 0.5})
    engine = SimpleNamespace(
        blocks=SimpleNamespace(usage=0.1, num_cached_blocks=0), stats=stats, kv_bytes_per_token=4096
    )
    metrics = WorkerMetrics(SimpleNamespace(engine=engine, num_waiting=0, num_running=0), "m", 0.3)  # type: ignore[arg-type]
    for seconds in (0.1, 0.3, 0.31, 2.0):
        metrics.first_token(seconds)
    text = metrics.render().decode()
    assert "strata_worker_ttft_within_slo_total 2.0" in text  # 0.1 and 0.3: within, inclusive
    assert "strata_worker_ttft_slo_seconds 0.3" in text
    sample = parse_exposition(text)
    assert sample.engine == {
        "busy_s": 4.5,
        "tier_wait_s": 1.5,
        "preemptions": 2.0,
        "hbm_evictions": 7.0,
        "prefill_busy_s": 2.5,
    }
