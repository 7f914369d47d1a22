"""Signals of one service over the last interval, from two scrapes of its pods.

Counters and histograms are cumulative per pod, so everything except the KV gauge is a delta
between two scrapes, as Prometheus' ``rate`` and ``histogram_quantile`` would compute it. A
counter that went down means the pod restarted: its current value is the whole delta. A pod
seen for the first time has no earlier sample and contributes only its gauges, like a series'
first sample in Prometheus."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from strata.operator.autoscale.metrics import PodSample

TTFT_QUANTILE = 0.95


@dataclass(frozen=True)
class Scrape:
    time: float  # seconds, any monotonic clock
    pods: Mapping[str, PodSample]  # keyed by pod uid: a replaced pod is a new pod


@dataclass(frozen=True)
class Aggregate:
    kv_cache_usage: float | None  # mean over scraped pods
    ttft_p95_s: float | None  # over the interval; None without a first token in it
    requests_waiting: int | None
    prefix_hit_ratio: Mapping[str, float] = field(default_factory=dict)  # per tier, over the interval
    first_tokens: float = 0.0  # requests that got a first token in the interval
    prompt_tokens: float = 0.0  # prompt tokens admitted in the interval
    # ENGINE_COUNTERS deltas summed over the pods seen twice, and the pod-seconds they cover.
    engine: Mapping[str, float] = field(default_factory=dict)
    pod_seconds: float = 0.0
    interval_s: float = 0.0  # between the two scrapes

    @property
    def prefill_busy(self) -> float | None:
        """Replicas' worth of prompt computing in the interval: the utilization times the pods
        measured (seen in both scrapes), the load that sizing divides by the target."""
        utilization = self.prefill_utilization
        if utilization is None or self.interval_s <= 0:
            return None
        return utilization * self.pod_seconds / self.interval_s

    @property
    def prefill_utilization(self) -> float | None:
        """Mean share of the interval the pods spent in steps that computed prompt tokens; None
        when no pod seen in both scrapes exposes it."""
        busy = self.engine.get("prefill_busy_s")
        if busy is None or self.pod_seconds <= 0:
            return None
        return min(1.0, busy / self.pod_seconds)

    @property
    def had_traffic(self) -> bool:
        return self.first_tokens > 0 or self.prompt_tokens > 0


def aggregate(previous: Scrape, current: Scrape) -> Aggregate:
    pods = list(current.pods.values())
    usages = [p.kv_usage for p in pods if p.kv_usage is not None]
    waiting = [p.requests_waiting for p in pods if p.requests_waiting is not None]
    buckets: dict[float, float] = {}
    first_tokens = prompt = 0.0
    hits: dict[str, float] = {}
    engine: dict[str, float] = {}
    pod_seconds = 0.0
    for uid, now in current.pods.items():
        before = previous.pods.get(uid)
        if before is None:
            continue
        pod_seconds += max(0.0, current.time - previous.time)
        for key, value in now.engine.items():
            engine[key] = engine.get(key, 0.0) + _delta(before.engine.get(key, 0.0), value)
        for bound, count in _histogram_delta(before, now):
            buckets[bound] = buckets.get(bound, 0.0) + count
        first_tokens += _delta(before.ttft_count, now.ttft_count)
        restarted = now.prompt_tokens < before.prompt_tokens
        prompt += now.prompt_tokens if restarted else now.prompt_tokens - before.prompt_tokens
        for tier, value in now.prefix_hit_tokens.items():
            # One reset rule for the whole pod: its counters restart together.
            earlier = 0.0 if restarted else before.prefix_hit_tokens.get(tier, 0.0)
            hits[tier] = hits.get(tier, 0.0) + _delta(earlier, value)
    return Aggregate(
        kv_cache_usage=min(1.0, max(0.0, sum(usages) / len(usages))) if usages else None,
        ttft_p95_s=histogram_quantile(TTFT_QUANTILE, sorted(buckets.items())),
        requests_waiting=round(sum(waiting)) if waiting else None,
        prefix_hit_ratio={t: min(1.0, h / prompt) for t, h in sorted(hits.items())} if prompt > 0 else {},
        first_tokens=first_tokens,
        prompt_tokens=prompt,
        engine=engine,
        pod_seconds=pod_seconds,
        interval_s=max(0.0, current.time - previous.time),
    )


def _delta(before: float, now: float) -> float:
    return now if now < before else now - before


def _histogram_delta(before: PodSample, now: PodSample) -> list[tuple[float, float]]:
    if now.ttft_count < before.ttft_count:
        return list(now.ttft_buckets)  # restarted: everything it counted is new
    earlier = dict(before.ttft_buckets)
    return [(bound, max(0.0, count - earlier.get(bound, 0.0))) for bound, count in now.ttft_buckets]


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """The q-quantile of cumulative (upper bound, count) buckets, ascending with +Inf last,
    interpolated linearly inside the bucket that holds it, as Prometheus does; a quantile in
    the +Inf bucket is the highest finite bound. None when nothing was observed."""
    if not buckets or not math.isinf(buckets[-1][0]):
        return None
    total = buckets[-1][1]
    if total <= 0:
        return None
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    running = 0.0
    for bound, raw in buckets:
        count = max(running, raw)  # cumulative counts never go down (a scrape between two pods' buckets)
        running = count
        if count >= rank:
            if math.isinf(bound):
                return lower_bound
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = bound, count
    return lower_bound
