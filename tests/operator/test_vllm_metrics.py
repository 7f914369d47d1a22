"""The autoscaler reads a vLLM engine's exposition as it reads Strata's worker's."""

from __future__ import annotations

from strata.operator.autoscale.metrics import parse_exposition

VLLM = """# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 3.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 1000.0
# HELP vllm:prompt_tokens_cached_by_source_total Cached prompt tokens by source.
# TYPE vllm:prompt_tokens_cached_by_source_total counter
vllm:prompt_tokens_cached_by_source_total{engine="0",model_name="m",source="device"} 100.0
vllm:prompt_tokens_cached_by_source_total{engine="0",model_name="m",source="host"} 200.0
vllm:prompt_tokens_cached_by_source_total{engine="0",model_name="m",source="disk"} 64.0
vllm:prompt_tokens_cached_by_source_total{engine="0",model_name="m",source="p2p"} 5.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 2.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 2.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 1.0
# HELP strata_worker_engine_busy_seconds_total Wall time of engine steps that had work.
# TYPE strata_worker_engine_busy_seconds_total counter
strata_worker_engine_busy_seconds_total{engine="0",model_name="m"} 12.5
# HELP strata_worker_prefill_busy_seconds_total The part of it in steps that computed prompt tokens.
# TYPE strata_worker_prefill_busy_seconds_total counter
strata_worker_prefill_busy_seconds_total{engine="0",model_name="m"} 4.0
# HELP strata_worker_tier_wait_seconds_total Step time spent waiting on the KV-tier sidecar, by call.
# TYPE strata_worker_tier_wait_seconds_total counter
strata_worker_tier_wait_seconds_total{engine="0",model_name="m",op="load"} 0.5
strata_worker_tier_wait_seconds_total{engine="0",model_name="m",op="save"} 0.25
"""


def test_a_vllm_exposition_gives_the_autoscaler_its_signals_and_the_connectors_step_accounting() -> None:
    sample = parse_exposition(VLLM)
    assert (sample.kv_usage, sample.requests_waiting, sample.prompt_tokens) == (0.25, 3.0, 1000.0)
    assert sample.ttft_buckets == ((0.1, 1.0), (float("inf"), 2.0)) and sample.ttft_count == 2.0
    assert sample.prefix_hit_tokens == {"hbm": 100.0, "dram": 200.0, "nvme": 64.0}  # p2p is no tier of ours
    assert sample.engine == {"busy_s": 12.5, "prefill_busy_s": 4.0, "tier_wait_s": 0.75}


def test_vllm_names_beside_strata_workers_own_are_not_counted_twice() -> None:
    strata = (
        "# TYPE strata_worker_kv_cache_usage_ratio gauge\nstrata_worker_kv_cache_usage_ratio 0.5\n"
        "# TYPE strata_worker_prompt_tokens_total counter\nstrata_worker_prompt_tokens_total 10.0\n"
    )
    sample = parse_exposition(strata + VLLM.split("# HELP strata_worker_engine")[0])
    assert sample.kv_usage == 0.5 and sample.prompt_tokens == 10.0 and sample.prefix_hit_tokens == {}
