"""What the operator reads, from its watch caches instead of the API server.

kopf keeps an index per watched resource, filled before any handler runs and updated before
each event's handlers; :class:`IndexViews` reads them. So a reconcile, a status refresh and an
autoscaler interval cost the API server no reads: only writes go out. Each index maps a key to
the values the objects under it contributed (kopf.Index); plain dicts of lists read the same,
which is what the unit tests pass. The values are the event's own bodies: read-only."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from strata.operator import names
from strata.operator.slim import WORKLOAD_SPEC, slim_metadata

ServiceKey = tuple[str, str]  # (namespace, name)
Body = Mapping[str, Any]
BODY_FIELDS = ("apiVersion", "kind", "metadata", "spec", "status")
# What the operator reads of a workload (status.rollout, Applier): its pod template, most of its
# size, is what the operator itself rendered and is never read back.
WORKLOAD_METADATA = ("name", "namespace", "uid", "generation", "resourceVersion", "ownerReferences")
POD_APPS = (names.WORKER_APP, names.ROUTER_APP)


@dataclass(frozen=True)
class PodRef:
    """A ready worker pod, as much of it as the autoscaler needs to scrape it."""

    uid: str
    name: str
    ip: str
    app: str = names.WORKER_APP  # or names.ROUTER_APP: one index holds both (handlers.py)


@dataclass
class IndexViews:
    """Empty until :meth:`bind`: kopf hands its indexes only to handlers, so the first handler
    call binds them here, and every reader holding this object sees them from then on."""

    services: Mapping[ServiceKey, Iterable[Body]] = field(default_factory=dict)
    tiers: Mapping[str, Iterable[Body]] = field(default_factory=dict)
    workloads: Sequence[Mapping[ServiceKey, Iterable[Body]]] = ()  # one index per workload kind
    pods: Mapping[ServiceKey, Iterable[PodRef]] = field(default_factory=dict)  # workers and routers
    services_by_tier: Mapping[str, Iterable[ServiceKey]] = field(default_factory=dict)
    bound: bool = False

    def bind(
        self,
        services: Mapping[ServiceKey, Iterable[Body]],
        tiers: Mapping[str, Iterable[Body]],
        workloads: Sequence[Mapping[ServiceKey, Iterable[Body]]],
        pods: Mapping[ServiceKey, Iterable[PodRef]],
        services_by_tier: Mapping[str, Iterable[ServiceKey]],
    ) -> None:
        self.services, self.tiers, self.workloads = services, tiers, workloads
        self.pods, self.services_by_tier, self.bound = pods, services_by_tier, True

    def service(self, key: ServiceKey) -> Body | None:
        return next(iter(self.services.get(key, ())), None)

    def tier(self, name: str) -> Body | None:
        return next(iter(self.tiers.get(name, ())), None)

    def workload(self, key: ServiceKey, kind: str | None = None) -> Body | None:
        """The service's Deployment or StatefulSet (of ``kind`` when given)."""
        for index in self.workloads:
            for workload in index.get(key, ()):
                if kind is None or workload.get("kind") == kind:
                    return workload
        return None

    def ready_pods(self, key: ServiceKey) -> list[PodRef]:
        return [p for p in self.pods.get(key, ()) if p.app == names.WORKER_APP]

    def ready_routers(self, key: ServiceKey) -> list[PodRef]:
        return [p for p in self.pods.get(key, ()) if p.app == names.ROUTER_APP]

    def tier_services(self, name: str) -> int:
        return len(list(self.services_by_tier.get(name, ())))


def snapshot(body: Mapping[str, Any]) -> dict[str, Any]:
    """The fields worth keeping of a watch event's body (no deep copy: events are never changed).
    metadata.managedFields and kubectl's last-applied annotation are left out: nothing reads
    them, and they are a large part of every cached service (memory grows with the fleet)."""
    kept = {k: body[k] for k in BODY_FIELDS if k in body}
    if "metadata" in kept:
        kept["metadata"] = slim_metadata(kept["metadata"])
    return kept


def workload_snapshot(body: Mapping[str, Any]) -> dict[str, Any]:
    """A Deployment or StatefulSet as the operator reads it: identity, replicas and status."""
    meta, spec = body.get("metadata") or {}, body.get("spec") or {}
    return {
        "apiVersion": body.get("apiVersion"),
        "kind": body.get("kind"),
        "metadata": {k: meta[k] for k in WORKLOAD_METADATA if k in meta},
        "spec": {k: spec[k] for k in WORKLOAD_SPEC if k in spec},
        "status": body.get("status") or {},
    }


def owning_service(
    labels: Mapping[str, str], namespace: str | None, app: str = names.WORKER_APP
) -> ServiceKey | None:
    """The service an object belongs to, when it is part of ``app`` (the workers, by default:
    a service's router Deployment and pods are not its workload or its worker pods)."""
    service = labels.get(names.LABEL_SERVICE)
    if labels.get(names.LABEL_NAME, names.WORKER_APP) != app:
        return None
    return (namespace, service) if service and namespace else None


def pod_owner(labels: Mapping[str, str], namespace: str | None) -> ServiceKey | None:
    """The service a worker or router pod belongs to."""
    app = labels.get(names.LABEL_NAME, names.WORKER_APP)
    return owning_service(labels, namespace, app) if app in POD_APPS else None


def ready_pod(body: Mapping[str, Any]) -> PodRef | None:
    """The pod as a PodRef when it is ready and not going away, else None."""
    meta, status = body.get("metadata") or {}, body.get("status") or {}
    if meta.get("deletionTimestamp") or not status.get("podIP"):
        return None
    conditions = status.get("conditions") or []
    if not any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
        return None
    app = (meta.get("labels") or {}).get(names.LABEL_NAME, names.WORKER_APP)
    return PodRef(str(meta.get("uid", "")), str(meta.get("name", "")), str(status["podIP"]), app)
