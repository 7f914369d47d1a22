"""What the kopf handlers share: the reconcilers, the runners, the watch caches, the metrics.

Built once at operator start-up and kept in kopf's ``memo``; nothing here imports kopf, so
tests drive it directly."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from strata.operator.autoscale.telemetry import Telemetry
from strata.operator.children import Applier
from strata.operator.events import CountedSink, EventSink
from strata.operator.kube import KubeClient
from strata.operator.metrics import OperatorMetrics
from strata.operator.reconcile import Reconciler, TierReconciler
from strata.operator.runner import KeyedRunner
from strata.operator.settings import OperatorSettings
from strata.operator.views import IndexViews, ServiceKey

STATUS, FULL = 1, 2  # runner levels: a full reconcile also refreshes status


@dataclass
class Runtime:
    reconciler: Reconciler
    tiers: TierReconciler
    runner: KeyedRunner  # per service
    tier_runner: KeyedRunner  # per tier: status.services follows services coming and going
    metrics: OperatorMetrics
    # Filled by the autoscaler of the active replica; exported on the same metrics endpoint.
    telemetry: Telemetry
    lag_monitor: asyncio.Task[None] | None = None

    @classmethod
    def build(cls, kube: KubeClient, settings: OperatorSettings, events: EventSink) -> Runtime:
        metrics = OperatorMetrics()
        kube.observer = metrics
        telemetry = Telemetry()
        metrics.registry.register(telemetry)
        applier = Applier(kube, settings, metrics, CountedSink(events, metrics.event), IndexViews())
        runner = KeyedRunner(workers=settings.reconcile_workers, on_wait=metrics.queue_wait.observe)
        return cls(Reconciler(applier), TierReconciler(applier), runner, KeyedRunner(), metrics, telemetry)

    @property
    def events(self) -> EventSink:
        return self.reconciler.applier.events

    @property
    def views(self) -> IndexViews:
        return self.reconciler.applier.views

    # Triggers: each returns at once (KeyedRunner.submit); the runner coalesces and queues them.
    def reconcile(self, key: ServiceKey) -> None:
        async def job() -> bool:
            return await self.reconciler.reconcile_service(key)

        self.runner.submit(key, job, level=FULL)
        self.metrics.managed.set(len(self.runner.keys()))

    def refresh_status(self, key: ServiceKey) -> None:
        """Only the workload's status moved: refresh the service's status, apply nothing."""

        async def job() -> bool:
            return await self.reconciler.refresh_status(key)

        self.runner.submit(key, job, level=STATUS)

    def reconcile_tier(self, name: str) -> None:
        async def job() -> bool:
            return await self.tiers.reconcile_tier(name)

        self.tier_runner.submit(name, job)

    def recount_tiers(self) -> None:
        """A service came, went or changed tier: each tier's status.services, if it moved."""
        for name in list(self.views.tiers):
            self.reconcile_tier(name)

    def forget(self, key: ServiceKey) -> None:
        self.runner.forget(key)
        self.reconciler.applier.forget(*key)
        managed = self.runner.keys()
        last = not any(k[0] == key[0] for k in managed if isinstance(k, tuple))
        self.reconciler.forget(key, last_in_namespace=last)
        self.metrics.managed.set(len(self.runner.keys()))

    def start(self) -> None:
        """The background work that needs the running loop: the event-loop lag monitor."""
        self.lag_monitor = asyncio.create_task(self.metrics.watch_loop_lag(), name="strata-loop-lag")

    async def close(self) -> None:
        if self.lag_monitor is not None:
            self.lag_monitor.cancel()
            await asyncio.gather(self.lag_monitor, return_exceptions=True)
        await self.runner.close()
        await self.tier_runner.close()
        await self.reconciler.applier.kube.close()
