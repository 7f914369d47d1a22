"""The worker's Prometheus metrics, in their own registry.

Latencies are observed by the HTTP layer (what a client sees); engine counters and gauges are
read from the engine at scrape time, so the engine itself stays free of Prometheus. Each figure
is exposed twice: under the project's names (``strata_worker_*``, which the operator's autoscaler
reads) and under vLLM's (``vllm:*`` with a ``model_name`` label, see ``vllm_metrics``), which
existing dashboards, KEDA scalers and gateways already query.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from strata.common.tiers import TIERS
from strata.worker.server.engine_loop import EngineLoop
from strata.worker.server.vllm_metrics import VllmMetrics

P = "strata_worker_"
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class EngineCollector(Collector):
    def __init__(self, loop: EngineLoop) -> None:
        self.loop = loop

    def collect(self) -> Iterator[Metric]:
        engine, stats = self.loop.engine, self.loop.engine.stats
        yield GaugeMetricFamily(
            P + "queue_length", "Requests waiting to be scheduled.", self.loop.num_waiting
        )
        yield GaugeMetricFamily(
            P + "running_requests", "Requests in the running batch.", self.loop.num_running
        )
        yield GaugeMetricFamily(
            P + "kv_cache_usage_ratio", "Share of KV blocks held by running requests.", engine.blocks.usage
        )
        yield GaugeMetricFamily(
            P + "kv_cached_blocks",
            "HBM blocks holding a reusable prefix (what the pod's HBM cache is worth keeping).",
            engine.blocks.num_cached_blocks,
        )
        yield GaugeMetricFamily(
            P + "kv_bytes_per_token",
            "Bytes one token's KV takes in this model (every layer, K and V): what "
            "spec.model.kvBytesPerToken should say. The operator reports it in status.model.",
            engine.kv_bytes_per_token,
        )
        hits = CounterMetricFamily(
            P + "prefix_hit_tokens", "Prompt tokens served from cache.", labels=["tier"]
        )
        for tier in TIERS:
            hits.add_metric([tier], stats.hit_tokens[tier])
        yield hits
        counters = {
            "prompt_tokens": ("Prompt tokens of admitted requests.", stats.prompt_tokens),
            "generation_tokens": ("Tokens generated.", stats.generation_tokens),
            "recomputed_tokens": (
                "Context tokens computed rather than served from a cache.",
                stats.recomputed_tokens,
            ),
            "preemptions": ("Running requests preempted (KV freed, recomputed later).", stats.preemptions),
            "hbm_evictions": ("Cached KV blocks evicted from HBM to make room.", stats.hbm_evictions),
            "engine_busy_seconds": ("Wall time of engine steps that had work.", stats.busy_seconds),
            "prefill_busy_seconds": (
                "Wall time of engine steps that computed prompt tokens (the autoscaler's load signal).",
                stats.prefill_busy_seconds,
            ),
        }
        for name, (doc, value) in counters.items():
            yield CounterMetricFamily(P + name, doc, value)
        waits = CounterMetricFamily(
            P + "tier_wait_seconds",
            "Step time spent waiting on the KV-tier sidecar, by call (part of engine_busy_seconds).",
            labels=["op"],
        )
        for op, seconds in stats.tier_wait_seconds.items():
            waits.add_metric([op], seconds)
        yield waits


class WorkerMetrics:
    def __init__(self, loop: EngineLoop, model_name: str, ttft_slo_s: float | None = None) -> None:
        self.registry = CollectorRegistry()
        self.ttft_slo_s = ttft_slo_s
        self.ttft = Histogram(
            P + "time_to_first_token_seconds",
            "Time from request to first token.",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.itl = Histogram(
            P + "inter_token_latency_seconds",
            "Time between consecutive output tokens.",
            buckets=TOKEN_BUCKETS,
            registry=self.registry,
        )
        self.e2e = Histogram(
            P + "e2e_request_latency_seconds",
            "Time from request to last token.",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.rejected = Counter(
            P + "rejected_requests", "Requests refused, by reason.", ["reason"], registry=self.registry
        )
        # SLO attainment is within_slo / time_to_first_token_seconds_count; an exact count,
        # since the tier's target need not be one of the histogram's bucket bounds.
        self.within_slo = Counter(
            P + "ttft_within_slo",
            "Requests whose first token came within the service tier's TTFT target.",
            registry=self.registry,
        )
        if ttft_slo_s is not None:
            Gauge(P + "ttft_slo_seconds", "The service tier's TTFT target (s).", registry=self.registry).set(
                ttft_slo_s
            )
        self.registry.register(EngineCollector(loop))
        self.vllm = VllmMetrics(self.registry, loop, model_name, LATENCY_BUCKETS, TOKEN_BUCKETS)

    def first_token(self, seconds: float) -> None:
        self.ttft.observe(seconds)
        self.vllm.ttft.observe(seconds)
        if self.ttft_slo_s is not None and seconds <= self.ttft_slo_s:
            self.within_slo.inc()

    def next_token(self, seconds: float) -> None:
        self.itl.observe(seconds)
        self.vllm.itl.observe(seconds)

    def finished(self, reason: str, e2e_s: float | None) -> None:
        """A request that produced tokens ended: stop, length, abort (the client left) or error."""
        if e2e_s is not None:
            self.e2e.observe(e2e_s)
            self.vllm.e2e.observe(e2e_s)
        self.vllm.success.labels(self.vllm.model_name, reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
