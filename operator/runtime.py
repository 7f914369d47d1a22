"""What the kopf handlers share: the reconcilers, the per-service runner and the metrics.

Built once at operator start-up and kept in kopf's ``memo``; nothing here imports kopf, so
tests drive it directly."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from strata.operator.children import Applier
from strata.operator.events import EventSink
from strata.operator.kube import KubeClient
from strata.operator.metrics import OperatorMetrics
from strata.operator.reconcile import Reconciler, TierReconciler
from strata.operator.runner import KeyedRunner
from strata.operator.settings import OperatorSettings

ServiceKey = tuple[str, str]  # (namespace, name)
STATUS, FULL = 1, 2  # runner levels: a full reconcile also refreshes status
# kopf indices map a key to a store of values; any mapping of iterables reads the same.
TierIndex = Mapping[str, Iterable[Mapping[str, Any]]]


@dataclass
class Runtime:
    reconciler: Reconciler
    tiers: TierReconciler
    runner: KeyedRunner
    metrics: OperatorMetrics

    @classmethod
    def build(cls, kube: KubeClient, settings: OperatorSettings, events: EventSink) -> Runtime:
        metrics = OperatorMetrics()
        applier = Applier(kube, settings, metrics, events)
        return cls(Reconciler(applier), TierReconciler(applier), KeyedRunner(), metrics)

    async def reconcile(self, key: ServiceKey, tier_index: TierIndex) -> None:
        def lookup(name: str) -> Mapping[str, Any] | None:
            return next(iter(tier_index.get(name, ())), None)

        async def job() -> bool:
            return await self.reconciler.reconcile_service(key[0], key[1], lookup)

        await self.runner.run(key, job, level=FULL)
        self.metrics.managed.set(len(self.runner.keys()))

    async def refresh_status(self, key: ServiceKey, tier_index: TierIndex) -> None:
        """Only the workload's status moved: refresh the service's status, apply nothing."""

        def lookup(name: str) -> Mapping[str, Any] | None:
            return next(iter(tier_index.get(name, ())), None)

        async def job() -> bool:
            return await self.reconciler.refresh_status(key[0], key[1], lookup)

        await self.runner.run(key, job, level=STATUS)

    def forget(self, key: ServiceKey) -> None:
        self.runner.forget(key)
        self.reconciler.applier.forget(*key)
        self.metrics.managed.set(len(self.runner.keys()))

    async def close(self) -> None:
        await self.runner.close()
        await self.reconciler.applier.kube.close()
