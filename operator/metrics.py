"""The operator's own Prometheus metrics, in a registry of their own (tests create many)."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server


@dataclass
class OperatorMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.reconciles = Counter(
            "strata_operator_reconciles", "InferenceService reconciles, by result.", ["result"], registry=r
        )
        self.refreshes = Counter(
            "strata_operator_status_refreshes",
            "Status-only refreshes after a workload's rollout moved (no child applied).",
            registry=r,
        )
        self.errors = Counter(
            "strata_operator_reconcile_errors", "Reconciles that failed on an API call.", registry=r
        )
        self.duration = Histogram(
            "strata_operator_reconcile_duration_seconds",
            "Wall time of one InferenceService reconcile.",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=r,
        )
        self.managed = Gauge(
            "strata_operator_managed_services", "InferenceServices being managed.", registry=r
        )
        self.applied = Counter(
            "strata_operator_children_applied",
            "Child objects written with server-side apply, by kind and outcome.",
            ["kind", "outcome"],
            registry=r,
        )

    def serve(self, port: int) -> None:
        start_http_server(port, registry=self.registry)
