"""The operator's own Prometheus metrics, in a registry of their own (tests create many)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
LOOP_LAG_INTERVAL_S = 0.5


@dataclass
class OperatorMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        self._reconcile_metrics(self.registry)
        self._api_metrics(self.registry)
        self._wait_metrics(self.registry)

    def _reconcile_metrics(self, r: CollectorRegistry) -> None:
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
        self.events = Counter(
            "strata_operator_events",
            "Kubernetes Events the operator emitted (each a write to the API server), by type and reason.",
            ["type", "reason"],
            registry=r,
        )
        self.applied = Counter(
            "strata_operator_children_applied",
            "Child objects written with server-side apply, by kind and outcome.",
            ["kind", "outcome"],
            registry=r,
        )

    def _api_metrics(self, r: CollectorRegistry) -> None:
        self.api_requests = Counter(
            "strata_operator_api_requests",
            "Requests the operator's client sent to the API server, by verb, resource and answer "
            "(an HTTP code, or timeout / connection).",
            ["verb", "resource", "code"],
            registry=r,
        )
        self.api_latency = Histogram(
            "strata_operator_api_request_duration_seconds",
            "Time from sending a request to its answer, by verb (timeouts and dropped connections left out).",
            ["verb"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=r,
        )
        self.api_retries = Counter(
            "strata_operator_api_retries",
            "API requests retried after a back-off, by reason (timeout, connection, throttled, server).",
            ["reason"],
            registry=r,
        )
        self.api_throttled = Counter(
            "strata_operator_api_throttled",
            "API requests that waited for a free slot under the client's in-flight limit.",
            registry=r,
        )

    def _wait_metrics(self, r: CollectorRegistry) -> None:
        """Where a slow reconcile spends its time, apart from the API server's own latency."""
        self.api_slot_wait = Histogram(
            "strata_operator_api_slot_wait_seconds",
            "Time a request waited for a slot under the client's in-flight limit.",
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        self.queue_wait = Histogram(
            "strata_operator_reconcile_queue_seconds",
            "Time from a trigger (a watch event, a retry) to the start of the reconcile it asked for.",
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        self.loop_lag = Histogram(
            "strata_operator_event_loop_lag_seconds",
            "How late the operator's event loop ran a timer: time it was busy with other work.",
            buckets=WAIT_BUCKETS,
            registry=r,
        )

    def event(self, type_: str, reason: str) -> None:
        self.events.labels(type=type_, reason=reason).inc()

    # ApiObserver (strata.operator.kube): the client reports each request here.
    def request(self, verb: str, resource: str, code: str, seconds: float) -> None:
        self.api_requests.labels(verb=verb, resource=resource, code=code).inc()
        if code.isdigit():
            self.api_latency.labels(verb=verb).observe(seconds)

    def retry(self, reason: str) -> None:
        self.api_retries.labels(reason=reason).inc()

    def throttled(self) -> None:
        self.api_throttled.inc()

    def slot_wait(self, seconds: float) -> None:
        self.api_slot_wait.observe(seconds)

    async def watch_loop_lag(self, interval_s: float = LOOP_LAG_INTERVAL_S) -> None:
        """Forever: sleep ``interval_s`` and record how much later than that the loop woke up."""
        while True:
            asked = time.monotonic()
            await asyncio.sleep(interval_s)
            self.loop_lag.observe(max(0.0, time.monotonic() - asked - interval_s))

    def serve(self, port: int, host: str = "0.0.0.0") -> None:
        start_http_server(port, addr=host, registry=self.registry)
