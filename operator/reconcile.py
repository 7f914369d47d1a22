"""One level-based reconcile of one InferenceService, and of one ServiceTier.

Read the service fresh, resolve it against its tier, apply every child, then write status from
what the API server returned. A rejected spec (unknown tier, over the tier's limits) touches no
child: the pods keep serving the last accepted spec while the condition and an Event say why."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp

from strata.operator import names
from strata.operator.api import ACCEPTED, DEGRADED, READY
from strata.operator.children import Applier
from strata.operator.kube import KubeError, Obj
from strata.operator.resolve import SERVER_PORT, ResolveInput, SpecRejected, resolve
from strata.operator.status import Observed, compute_status, stamp_condition, status_changed

log = logging.getLogger(__name__)
# A failed call: the API server refused, or the connection broke or timed out.
API_ERRORS = (KubeError, aiohttp.ClientError, TimeoutError)

TierLookup = Callable[[str], Mapping[str, Any] | None]


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass
class Reconciler:
    applier: Applier
    now: Callable[[], datetime] = utcnow

    async def reconcile_service(self, namespace: str, name: str, tiers: TierLookup) -> bool:
        """True when converged (or nothing to do); False asks the runner to retry."""
        kube, metrics = self.applier.kube, self.applier.metrics
        isvc = await kube.get(names.API_VERSION, names.ISVC_KIND, name, namespace)
        if isvc is None or isvc["metadata"].get("deletionTimestamp"):
            return True  # garbage collection removes the children through their owner references
        started = time.perf_counter()
        try:
            result = await self._reconcile(isvc, tiers)
        finally:
            metrics.duration.observe(time.perf_counter() - started)
        metrics.reconciles.labels(result=result).inc()
        if result == "error":
            metrics.errors.inc()
        return result != "error"

    async def refresh_status(self, namespace: str, name: str, tiers: TierLookup) -> bool:
        """Status from the workload as it is now, when only the workload's status changed; a
        service not yet reconciled at its generation, or rejected, gets a full reconcile."""
        isvc = await self.applier.kube.get(names.API_VERSION, names.ISVC_KIND, name, namespace)
        if isvc is None or isvc["metadata"].get("deletionTimestamp"):
            return True
        status = isvc.get("status") or {}
        accepted: dict[str, Any] = next(
            (c for c in status.get("conditions", []) if c.get("type") == ACCEPTED), {}
        )
        current = status.get("observedGeneration") == isvc["metadata"].get("generation")
        if not current or accepted.get("status") != "True":
            return await self.reconcile_service(namespace, name, tiers)
        spec = isvc.get("spec", {})
        seen = Observed(
            name=name,
            generation=int(isvc["metadata"].get("generation", 1)),
            tier=str(spec.get("tier", "standard")),
            min_replicas=int(spec.get("minReplicas", 1)),
            desired_replicas=None,  # the workload's own: this process applied it
            endpoint=status.get("endpoint"),
            workload=await self._observe_workload(namespace, name),
        )
        await self._write_status(isvc, seen)
        self.applier.metrics.refreshes.inc()
        return True

    async def _reconcile(self, isvc: Obj, tiers: TierLookup) -> str:
        meta, spec = isvc["metadata"], isvc.get("spec", {})
        tier_name = str(spec.get("tier", "standard"))
        tier = tiers(tier_name)
        rejected: tuple[str, str] | None = None
        error: str | None = None
        workload: Obj | None = None
        plan = None
        try:
            ns = await self.applier.kube.get("v1", "Namespace", meta["namespace"])
            ns_uid = ns["metadata"]["uid"] if ns else ""
            plan = resolve(ResolveInput(isvc, tier, ns_uid))
            assert tier is not None
            workload = await self.applier.apply_service(plan, isvc, tier)
        except SpecRejected as exc:
            rejected = (exc.reason, exc.message)
        except API_ERRORS as exc:
            error = str(exc) or type(exc).__name__
            log.warning("reconcile of %s/%s failed: %s", meta["namespace"], meta["name"], error)
        if workload is None:
            workload = await self._observe_workload(meta["namespace"], meta["name"])
        seen = Observed(
            name=meta["name"],
            generation=int(meta.get("generation", 1)),
            tier=tier_name,
            min_replicas=int(spec.get("minReplicas", 1)),
            desired_replicas=plan.replicas if plan else None,
            endpoint=f"http://{names.client_service_name(meta['name'])}.{meta['namespace']}.svc:{SERVER_PORT}",
            workload=workload,
            rejected=rejected,
            error=error,
        )
        await self._write_status(isvc, seen)
        return "error" if error else "rejected" if rejected else "success"

    async def _observe_workload(self, namespace: str, name: str) -> Obj | None:
        try:
            return await self.applier.current_workload(namespace, name)
        except API_ERRORS:
            return None

    async def _write_status(self, isvc: Obj, seen: Observed) -> None:
        current = isvc.get("status") or {}
        previous: Sequence[Mapping[str, Any]] = current.get("conditions", []) or []
        status = compute_status(seen, previous, self.now())
        self._emit_transitions(isvc, previous, status["conditions"])
        if not status_changed(current, status):
            return
        body = {
            "apiVersion": names.API_VERSION,
            "kind": names.ISVC_KIND,
            "metadata": {"name": isvc["metadata"]["name"], "namespace": isvc["metadata"]["namespace"]},
            "status": status,
        }
        await self.applier.kube.apply(body, subresource="status")

    def _emit_transitions(
        self, isvc: Obj, previous: Sequence[Mapping[str, Any]], new: Sequence[Mapping[str, Any]]
    ) -> None:
        before = {c.get("type"): c for c in previous}
        emit = self.applier.events
        for cond in new:
            old = before.get(cond["type"], {})
            true = cond["status"] == "True"
            if old.get("status") == cond["status"] and (true or old.get("message") == cond["message"]):
                continue
            if cond["type"] == ACCEPTED and not true:
                emit(isvc, "Warning", cond["reason"], cond["message"])
            elif cond["type"] == ACCEPTED and old.get("status") == "False":
                emit(isvc, "Normal", "Accepted", cond["message"])
            elif cond["type"] == READY and true:
                emit(isvc, "Normal", "Ready", cond["message"])
            elif cond["type"] == READY and old.get("status") == "True":
                emit(isvc, "Warning", "NotReady", cond["message"])  # lost readiness, not "not yet"
            elif cond["type"] == DEGRADED and true:
                emit(isvc, "Warning", cond["reason"], cond["message"])


@dataclass
class TierReconciler:
    applier: Applier

    async def reconcile_tier(self, tier: Mapping[str, Any], services: int) -> bool:
        """Apply the tier's PriorityClass and report it (with the count of services) in status."""
        meta = tier["metadata"]
        try:
            pc = await self.applier.apply_priority_class(tier)
        except KubeError as exc:
            self.applier.events(tier, "Warning", "PriorityClassFailed", str(exc))
            return False
        current = tier.get("status") or {}
        generation = int(meta.get("generation", 1))
        ready = {
            "type": READY,
            "status": "True",
            "reason": "PriorityClassReady",
            "message": f"PriorityClass {pc['metadata']['name']} has value {pc.get('value')}",
        }
        status = {
            "observedGeneration": generation,
            "priorityClassName": pc["metadata"]["name"],
            "services": services,
            "conditions": [stamp_condition(ready, generation, current.get("conditions", []) or [], utcnow())],
        }
        if any(current.get(k) != v for k, v in status.items()):
            body = {
                "apiVersion": names.API_VERSION,
                "kind": names.TIER_KIND,
                "metadata": {"name": meta["name"]},
                "status": status,
            }
            await self.applier.kube.apply(body, subresource="status")
        return True
