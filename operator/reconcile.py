"""One level-based reconcile of one InferenceService, and of one ServiceTier.

Read the service from the watch cache, resolve it against its tier, apply every child, then
write status from what the API server returned. A rejected spec (unknown tier, over the tier's
limits) touches no child: the pods keep serving the last accepted spec while the condition and
an Event say why. Status is written only when a field the reconciler owns changed, compared with
the newer of the cache and this process's own last write (the cache may not show it yet)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import aiohttp

from strata.common.endpoints import WORKER_PORT
from strata.operator import names
from strata.operator.api import ACCEPTED, DEGRADED, READY
from strata.operator.api.models import InferenceServiceSpec
from strata.operator.children import Applier
from strata.operator.kube import KubeError, Obj
from strata.operator.resolve import ResolveInput, SpecRejected, resolve
from strata.operator.status import Observed, compute_status, stamp_condition, status_changed
from strata.operator.tenancy import host_path_allowed
from strata.operator.views import IndexViews, ServiceKey

log = logging.getLogger(__name__)
# A failed call: the API server refused, or the connection broke or timed out.
API_ERRORS = (KubeError, aiohttp.ClientError, TimeoutError)


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass
class StatusMemory:
    """The status this process last wrote per object, with the resourceVersion that write made."""

    written: dict[Hashable, tuple[int, Mapping[str, Any]]] = field(default_factory=dict)

    def current(self, key: Hashable, cached: Mapping[str, Any]) -> Mapping[str, Any]:
        """The newer of the cached object's status and our last write of it."""
        mine = self.written.get(key)
        seen = _version(cached)
        if mine is not None and (seen is None or mine[0] > seen):
            return mine[1]
        if mine is not None:  # the cache has caught up: our copy (a few KB) is not needed any more
            del self.written[key]
        return cached.get("status") or {}

    def remember(self, key: Hashable, written: Mapping[str, Any]) -> None:
        version = _version(written)
        if version is not None:
            self.written[key] = (version, written.get("status") or {})

    def forget(self, key: Hashable) -> None:
        self.written.pop(key, None)


def _version(obj: Mapping[str, Any]) -> int | None:
    # resourceVersions are etcd revisions: comparable integers (KEP-5504, Kubernetes 1.34).
    try:
        return int(obj.get("metadata", {}).get("resourceVersion", ""))
    except ValueError:
        return None


@dataclass
class Reconciler:
    applier: Applier
    now: Callable[[], datetime] = utcnow
    statuses: StatusMemory = field(default_factory=StatusMemory)
    # A namespace's UID salts its services' cache namespace; it never changes while they exist.
    # Per namespace: its UID and whether its pods may mount hostPath volumes (read once).
    namespaces: dict[str, tuple[str, bool]] = field(default_factory=dict)

    @property
    def views(self) -> IndexViews:
        return self.applier.views

    async def reconcile_service(self, key: ServiceKey) -> bool:
        """True when converged (or nothing to do); False asks the runner to retry."""
        metrics = self.applier.metrics
        isvc = self.views.service(key)
        if isvc is None or isvc["metadata"].get("deletionTimestamp"):
            return True  # garbage collection removes the children through their owner references
        started = time.perf_counter()
        try:
            result = await self._reconcile(isvc)
        finally:
            metrics.duration.observe(time.perf_counter() - started)
        metrics.reconciles.labels(result=result).inc()
        if result == "error":
            metrics.errors.inc()
        return result != "error"

    async def refresh_status(self, key: ServiceKey) -> bool:
        """Status from the workload as it is now, when only the workload's status changed; a
        service not yet reconciled at its generation, or rejected, gets a full reconcile."""
        isvc = self.views.service(key)
        if isvc is None or isvc["metadata"].get("deletionTimestamp"):
            return True
        status = self.statuses.current(key, isvc)
        accepted: dict[str, Any] = next(
            (c for c in status.get("conditions", []) if c.get("type") == ACCEPTED), {}
        )
        current = status.get("observedGeneration") == isvc["metadata"].get("generation")
        if not current or accepted.get("status") != "True":
            return await self.reconcile_service(key)
        spec = isvc.get("spec", {})
        seen = Observed(
            name=key[1],
            generation=int(isvc["metadata"].get("generation", 1)),
            tier=InferenceServiceSpec.tier_of(spec),
            min_replicas=int(spec.get("minReplicas", 1)),
            desired_replicas=None,  # the workload's own: this process applied it
            endpoint=status.get("endpoint"),
            workload=self.applier.current_workload(*key),
        )
        await self._write_status(isvc, seen)
        self.applier.metrics.refreshes.inc()
        return True

    async def _reconcile(self, isvc: Mapping[str, Any]) -> str:
        meta, spec = isvc["metadata"], isvc.get("spec", {})
        tier_name = InferenceServiceSpec.tier_of(spec)
        tier = self.views.tier(tier_name)
        rejected: tuple[str, str] | None = None
        error: str | None = None
        workload: Obj | None = None
        plan = None
        try:
            plan = resolve(ResolveInput(isvc, tier, *await self._namespace(meta["namespace"])))
            assert tier is not None
            workload = await self.applier.apply_service(plan, isvc, tier)
        except SpecRejected as exc:
            rejected = (exc.reason, exc.message)
        except API_ERRORS as exc:
            error = str(exc) or type(exc).__name__
            log.warning("reconcile of %s/%s failed: %s", meta["namespace"], meta["name"], error)
        if workload is None:
            workload = self.applier.current_workload(meta["namespace"], meta["name"])
        seen = Observed(
            name=meta["name"],
            generation=int(meta.get("generation", 1)),
            tier=tier_name,
            min_replicas=int(spec.get("minReplicas", 1)),
            desired_replicas=plan.replicas if plan else None,
            endpoint=f"http://{names.client_service_name(meta['name'])}.{meta['namespace']}.svc:{WORKER_PORT}",
            workload=workload,
            rejected=rejected,
            error=error,
        )
        await self._write_status(isvc, seen)
        return "error" if error else "rejected" if rejected else "success"

    async def _namespace(self, namespace: str) -> tuple[str, bool]:
        """The namespace's UID (the cache namespace's salt) and whether its Pod Security level
        lets pods mount hostPath volumes, from one GET the first time it is needed."""
        if namespace not in self.namespaces:
            ns = await self.applier.kube.get("v1", "Namespace", namespace)
            if ns is None:
                return "", True  # going away with its services
            meta = ns["metadata"]
            self.namespaces[namespace] = (str(meta["uid"]), host_path_allowed(meta.get("labels") or {}))
        return self.namespaces[namespace]

    def forget(self, key: ServiceKey, last_in_namespace: bool) -> None:
        self.statuses.forget(key)
        if last_in_namespace:  # a namespace re-created under this name gets a new UID
            self.namespaces.pop(key[0], None)

    async def _write_status(self, isvc: Mapping[str, Any], seen: Observed) -> None:
        meta = isvc["metadata"]
        key = (meta["namespace"], meta["name"])
        current = self.statuses.current(key, isvc)
        previous: Sequence[Mapping[str, Any]] = current.get("conditions", []) or []
        status = compute_status(seen, previous, self.now())
        self._emit_transitions(isvc, previous, status["conditions"])
        if not status_changed(current, status):
            return
        body = {
            "apiVersion": names.API_VERSION,
            "kind": names.ISVC_KIND,
            "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
            "status": status,
        }
        self.statuses.remember(key, await self.applier.kube.apply(body, subresource="status"))

    def _emit_transitions(
        self, isvc: Mapping[str, Any], previous: Sequence[Mapping[str, Any]], new: Sequence[Mapping[str, Any]]
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
    statuses: StatusMemory = field(default_factory=StatusMemory)

    async def reconcile_tier(self, name: str) -> bool:
        """Apply the tier's PriorityClass (once per tier version) and report it, with the count of
        services on the tier, in status; written only when that changed."""
        tier = self.applier.views.tier(name)
        if tier is None:
            self.statuses.forget(name)
            return True
        try:
            await self.applier.ensure_priority_class(tier)
        except API_ERRORS as exc:
            self.applier.events(tier, "Warning", "PriorityClassFailed", str(exc))
            return False
        current = self.statuses.current(name, tier)
        status = tier_status(tier, self.applier, current)
        if any(current.get(k) != v for k, v in status.items()):
            body = {
                "apiVersion": names.API_VERSION,
                "kind": names.TIER_KIND,
                "metadata": {"name": name},
                "status": status,
            }
            self.statuses.remember(name, await self.applier.kube.apply(body, subresource="status"))
        return True


def tier_status(tier: Mapping[str, Any], applier: Applier, current: Mapping[str, Any]) -> dict[str, Any]:
    meta = tier["metadata"]
    pc_name = names.priority_class_name(meta["name"])
    value = applier.priority_classes[meta["name"]][1]
    generation = int(meta.get("generation", 1))
    ready = {
        "type": READY,
        "status": "True",
        "reason": "PriorityClassReady",
        "message": f"PriorityClass {pc_name} has value {value}",
    }
    return {
        "observedGeneration": generation,
        "priorityClassName": pc_name,
        "services": applier.views.tier_services(meta["name"]),
        "conditions": [stamp_condition(ready, generation, current.get("conditions", []) or [], utcnow())],
    }
