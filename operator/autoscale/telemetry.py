"""Per-service observations of the active operator replica, exported as Prometheus metrics.

The autoscaler's interval fills it (replicas, the bottleneck verdict, cost); a Prometheus
collector reads it at scrape time. Only the active replica exports per-service series: a
standby's would be stale, and two replicas' would be double-counted. Cost counters are this
process's own (they restart at zero on a failover, which ``rate``/``increase`` handle); the
cumulative figures live in each ServiceTier's ``status.usage``."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from strata.common.tiers import LOWER_TIERS
from strata.operator.autoscale.bottleneck import VERDICTS, Diagnosis
from strata.operator.autoscale.cost import Usage

ServiceKey = tuple[str, str]  # (namespace, name)
LABELS = ["namespace", "service", "service_tier"]


@dataclass
class ServiceState:
    tier: str
    desired: int = 0
    ready: int = 0
    diagnosis: Diagnosis | None = None
    cost: Usage = field(default_factory=Usage)  # since this replica became active


@dataclass(eq=False)  # a registered collector must be hashable
class Telemetry(Collector):
    active: bool = False
    services: dict[ServiceKey, ServiceState] = field(default_factory=dict)
    scalings: Counter[tuple[str, str, str, str]] = field(default_factory=Counter)
    # Cost accrued since the last write of each ServiceTier's status.usage: tier -> namespace -> usage.
    unwritten: dict[str, dict[str, Usage]] = field(default_factory=dict)

    def state(self, key: ServiceKey, tier: str) -> ServiceState:
        state = self.services.get(key)
        if state is None or state.tier != tier:
            state = self.services[key] = ServiceState(tier)
        return state

    def accrue(self, key: ServiceKey, tier: str, cost: Usage) -> None:
        self.state(key, tier).cost.add(cost)
        self.unwritten.setdefault(tier, {}).setdefault(key[0], Usage()).add(cost)

    def scaled(self, key: ServiceKey, tier: str, before: int, after: int) -> None:
        self.scalings[(*key, tier, "up" if after > before else "down")] += 1

    def forget(self, keep: set[ServiceKey]) -> None:
        for key in set(self.services) - keep:
            del self.services[key]

    def deactivate(self) -> None:
        """A standby exports nothing per service; what it had not written is the new active's."""
        self.active = False
        self.services.clear()
        self.unwritten.clear()

    def collect(self) -> Iterator[Metric]:
        if not self.active:
            return
        yield from self._replicas()
        yield from self._bottleneck()
        yield from self._cost()
        decisions = CounterMetricFamily(
            "strata_autoscaler_scaling_decisions",
            "Scaling decisions the built-in autoscaler applied, by direction.",
            labels=[*LABELS, "direction"],
        )
        for labels, count in sorted(self.scalings.items()):
            decisions.add_metric(list(labels), count)
        yield decisions

    def _replicas(self) -> Iterator[Metric]:
        desired = GaugeMetricFamily(
            "strata_service_desired_replicas", "Replicas the operator converges to.", labels=LABELS
        )
        ready = GaugeMetricFamily("strata_service_ready_replicas", "Ready worker pods.", labels=LABELS)
        for (ns, name), s in sorted(self.services.items()):
            desired.add_metric([ns, name, s.tier], s.desired)
            ready.add_metric([ns, name, s.tier], s.ready)
        yield from (desired, ready)

    def _bottleneck(self) -> Iterator[Metric]:
        verdict = GaugeMetricFamily(
            "strata_service_bottleneck",
            "1 for the service's current bottleneck verdict, 0 for the others.",
            labels=[*LABELS, "verdict"],
        )
        busy = GaugeMetricFamily(
            "strata_service_engine_busy_ratio", "Share of wall time the engines were busy.", labels=LABELS
        )
        wait = GaugeMetricFamily(
            "strata_service_tier_wait_ratio", "Share of step time spent waiting on the tiers.", labels=LABELS
        )
        for (ns, name), s in sorted(self.services.items()):
            d = s.diagnosis
            if d is None:
                continue
            for v in VERDICTS:
                verdict.add_metric([ns, name, s.tier, v], 1.0 if v == d.verdict else 0.0)
            if d.engine_busy is not None:
                busy.add_metric([ns, name, s.tier], d.engine_busy)
            if d.tier_wait_share is not None:
                wait.add_metric([ns, name, s.tier], d.tier_wait_share)
        yield from (verdict, busy, wait)

    def _cost(self) -> Iterator[Metric]:
        gpu = CounterMetricFamily(
            "strata_cost_gpu_seconds", "GPU-seconds held: replicas x GPUs x time.", labels=LABELS
        )
        cache = CounterMetricFamily(
            "strata_cost_cache_gib_hours",
            "KV-cache capacity held, per cache tier (GiB x hours).",
            labels=[*LABELS, "tier"],
        )
        for (ns, name), s in sorted(self.services.items()):
            gpu.add_metric([ns, name, s.tier], s.cost.gpu_seconds)
            for tier in LOWER_TIERS:
                cache.add_metric([ns, name, s.tier, tier], s.cost.cache_gib_hours.get(tier, 0.0))
        yield from (gpu, cache)
