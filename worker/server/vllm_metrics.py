"""vLLM's metric names, for the dashboards, KEDA scalers and gateways that already query them.

Same figures as the ``strata_worker_*`` ones, under vLLM's names (``vllm:`` prefix) with the
``model_name`` label vLLM puts on every series. Prefix-cache hits are counted in tokens, as vLLM
counts them, so ``rate(vllm:prefix_cache_hits_total) / rate(vllm:prefix_cache_queries_total)`` is
the hit ratio over any window.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from strata.worker.server.engine_loop import EngineLoop

V = "vllm:"
MODEL = "model_name"


class VllmEngineCollector(Collector):
    def __init__(self, loop: EngineLoop, model_name: str) -> None:
        self.loop, self.model_name = loop, model_name

    def _one(self, family: GaugeMetricFamily | CounterMetricFamily, value: float) -> Metric:
        family.add_metric([self.model_name], value)
        return family

    def collect(self) -> Iterator[Metric]:
        engine, stats = self.loop.engine, self.loop.engine.stats
        gauges = {
            "num_requests_running": ("Requests in the running batch.", self.loop.num_running),
            "num_requests_waiting": ("Requests waiting to be scheduled.", self.loop.num_waiting),
            "kv_cache_usage_perc": ("KV-cache usage; 1 means 100 percent.", engine.blocks.usage),
        }
        for name, (doc, value) in gauges.items():
            yield self._one(GaugeMetricFamily(V + name, doc, labels=[MODEL]), value)
        counters = {
            "prompt_tokens": ("Prompt tokens of admitted requests.", stats.prompt_tokens),
            "generation_tokens": ("Tokens generated.", stats.generation_tokens),
            "prefix_cache_queries": ("Prompt tokens looked up in the prefix cache.", stats.prompt_tokens),
            "prefix_cache_hits": (
                "Prompt tokens served from a cache (any tier).",
                sum(stats.hit_tokens.values()),
            ),
        }
        for name, (doc, value) in counters.items():
            yield self._one(CounterMetricFamily(V + name, doc, labels=[MODEL]), value)


class VllmMetrics:
    """The latency histograms and the finished-request counter; the rest is read at scrape time."""

    def __init__(
        self,
        registry: CollectorRegistry,
        loop: EngineLoop,
        model_name: str,
        latency_buckets: tuple[float, ...],
        token_buckets: tuple[float, ...],
    ) -> None:
        self.model_name = model_name

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(V + name, doc, [MODEL], buckets=buckets, registry=registry)

        self.ttft = histogram("time_to_first_token_seconds", "Time to first token.", latency_buckets).labels(
            model_name
        )
        self.itl = histogram(
            "inter_token_latency_seconds", "Time between output tokens.", token_buckets
        ).labels(model_name)
        self.e2e = histogram(
            "e2e_request_latency_seconds", "Time from request to last token.", latency_buckets
        ).labels(model_name)
        self.success = Counter(
            V + "request_success",
            "Finished requests, by finish reason.",
            [MODEL, "finished_reason"],
            registry=registry,
        )
        registry.register(VllmEngineCollector(loop, model_name))
