"""One worker pod's /metrics, parsed into the few numbers the autoscaler reads.

The worker exposes Prometheus text (worker/server/metrics.py); only counters, the TTFT
histogram and two gauges matter here, so the rest of the exposition is ignored. A vLLM engine's
exposition has few of Strata's names: its own (``vllm:``) give the same figures (``VLLM``),
prefix hits per tier from ``prompt_tokens_cached_by_source`` (HBM is vLLM's ``device``; the
tiers are what Strata's connector reports each source as), and Strata's connector adds the step
accounting (``strata_worker_engine_busy_seconds`` and the rest, ``worker/vllm/prom.py``)."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from strata.operator.api.models import MAX_KV_BYTES_PER_TOKEN

P = "strata_worker_"
KV_USAGE = P + "kv_cache_usage_ratio"
QUEUE = P + "queue_length"
TTFT_BUCKET = P + "time_to_first_token_seconds_bucket"
TTFT_COUNT = P + "time_to_first_token_seconds_count"
PREFIX_HITS = P + "prefix_hit_tokens_total"
PROMPT_TOKENS = P + "prompt_tokens_total"
CACHED_BLOCKS = P + "kv_cached_blocks"
KV_BYTES_PER_TOKEN = P + "kv_bytes_per_token"  # the model's, as the engine sized its KV cache
TIER_BLOCKS = "strata_kvtier_blocks"  # the KV-tier sidecar's, on its own metrics port
# Where step time goes (the bottleneck verdict): plain counters, summed over their labels.
ENGINE_COUNTERS = {
    P + "engine_busy_seconds_total": "busy_s",
    P + "tier_wait_seconds_total": "tier_wait_s",
    P + "preemptions_total": "preemptions",
    P + "hbm_evictions_total": "hbm_evictions",
    P + "prefill_busy_seconds_total": "prefill_busy_s",  # the autoscaler's prefill utilization
}


V = "vllm:"
# vLLM's source of cached prompt tokens -> Strata's tier (connector.HIT_SOURCES, reversed)
VLLM_SOURCES = {"device": "hbm", "host": "dram", "disk": "nvme", "external_unspecified": "shared"}
VLLM = {
    V + "kv_cache_usage_perc": KV_USAGE,
    V + "num_requests_waiting": QUEUE,
    V + "time_to_first_token_seconds_bucket": TTFT_BUCKET,
    V + "time_to_first_token_seconds_count": TTFT_COUNT,
    V + "prompt_tokens_total": PROMPT_TOKENS,
}
VLLM_CACHED = V + "prompt_tokens_cached_by_source_total"


class MetricsError(ValueError):
    """The exposition cannot be parsed or lacks what the autoscaler needs."""


@dataclass(frozen=True)
class PodSample:
    """One scrape of one pod. Counters and histogram counts are cumulative since the pod started."""

    kv_usage: float | None = None
    requests_waiting: float | None = None
    # (upper bound, cumulative count), ascending, the last one +Inf.
    ttft_buckets: tuple[tuple[float, float], ...] = ()
    ttft_count: float = 0.0
    prefix_hit_tokens: Mapping[str, float] = field(default_factory=dict)
    prompt_tokens: float = 0.0
    kv_cached_blocks: float | None = None  # HBM blocks holding a reusable prefix
    engine: Mapping[str, float] = field(default_factory=dict)  # ENGINE_COUNTERS values, by field
    kv_bytes_per_token: int | None = None  # None: a worker from before the gauge


def parse_exposition(text: str) -> PodSample:
    try:
        families = list(text_string_to_metric_families(text))
    except (ValueError, TypeError, IndexError) as exc:
        raise MetricsError(f"not Prometheus text exposition: {exc}") from None
    if not any(f.name == KV_USAGE for f in families):  # a vLLM engine
        families = [f for f in families if f.name.startswith(P)] + list(_as_strata(families))
    kv: float | None = None
    waiting: float | None = None
    buckets: dict[float, float] = {}
    ttft_count = 0.0
    hits: dict[str, float] = {}
    prompt = 0.0
    cached: float | None = None
    per_token: int | None = None
    engine: dict[str, float] = {}
    for family in families:
        for sample in family.samples:
            name, value = sample.name, float(sample.value)
            if name in ENGINE_COUNTERS:
                key = ENGINE_COUNTERS[name]
                engine[key] = engine.get(key, 0.0) + value
            elif name == KV_USAGE:
                kv = value
            elif name == QUEUE:
                waiting = value
            elif name == TTFT_BUCKET:
                buckets[_bound(sample.labels.get("le", ""))] = value
            elif name == TTFT_COUNT:
                ttft_count = value
            elif name == PREFIX_HITS:
                tier = sample.labels.get("tier")
                if not tier:
                    raise MetricsError(f"{PREFIX_HITS} sample without a tier label")
                hits[tier] = value
            elif name == PROMPT_TOKENS:
                prompt = value
            elif name == CACHED_BLOCKS:
                cached = value
            elif name == KV_BYTES_PER_TOKEN and 1 <= value <= MAX_KV_BYTES_PER_TOKEN:  # NaN fails too
                per_token = int(value)
    if kv is None and not buckets:
        raise MetricsError(f"neither {KV_USAGE} nor {TTFT_BUCKET} in the exposition: not a Strata worker")
    if buckets and math.inf not in buckets:
        raise MetricsError(f'{TTFT_BUCKET} has no le="+Inf" bucket')
    return PodSample(
        kv_usage=kv,
        requests_waiting=waiting,
        ttft_buckets=tuple(sorted(buckets.items())),
        ttft_count=ttft_count,
        prefix_hit_tokens=hits,
        prompt_tokens=prompt,
        kv_cached_blocks=cached,
        engine=engine,
        kv_bytes_per_token=per_token,
    )


def _as_strata(families: list[Metric]) -> Iterator[Metric]:
    """A vLLM engine's families under the names Strata's worker gives the same figures."""
    for family in families:
        samples = [_renamed(s) for s in family.samples if s.name in VLLM or s.name == VLLM_CACHED]
        if samples:
            renamed = Metric(family.name, family.documentation, family.type)
            renamed.samples = [s for s in samples if s is not None]
            yield renamed


def _renamed(sample: Sample) -> Sample | None:
    if sample.name != VLLM_CACHED:
        return sample._replace(name=VLLM[sample.name])
    tier = VLLM_SOURCES.get(sample.labels.get("source", ""))
    return None if tier is None else sample._replace(name=PREFIX_HITS, labels={"tier": tier})


def parse_tier_blocks(text: str) -> dict[str, float]:
    """Blocks each tier of a KV-tier sidecar holds, from its exposition."""
    try:
        families = list(text_string_to_metric_families(text))
    except (ValueError, TypeError, IndexError) as exc:
        raise MetricsError(f"not Prometheus text exposition: {exc}") from None
    blocks = {
        str(sample.labels.get("tier")): float(sample.value)
        for family in families
        for sample in family.samples
        if sample.name == TIER_BLOCKS and sample.labels.get("tier")
    }
    if not blocks:
        raise MetricsError(f"no {TIER_BLOCKS} in the exposition: not a Strata KV-tier sidecar")
    return blocks


def _bound(le: str) -> float:
    try:
        return float(le)  # float() reads "+Inf" as infinity
    except ValueError:
        raise MetricsError(f"{TTFT_BUCKET} has a bad le label {le!r}") from None
