"""The kopf wiring: watches, indices and start-up. Thin on purpose; the logic is elsewhere.

Every trigger (the service itself, any of its children, its tier) funnels into one level-based
reconcile per service. Only ``on.event`` handlers are used: no finalizers and no progress
annotations, so the operator can be killed at any moment and deleting a service never waits
for it (owner references do the garbage collection). What the reconciles and the autoscaler
read comes from kopf indices of these same watches (strata.operator.views), and the watches of
children, pods and PriorityClasses ask the API server only for objects labelled as managed by
this operator. Their events are slimmed to the fields the operator reads before kopf queues them
(strata.operator.slimwatch): whole bodies queued in a burst made the operator's peak memory.
The index functions are coroutines: kopf runs plain functions in a thread pool,
a hand-off per watch event, and what they keep then comes from that thread's malloc arena.
Run with ``strata operator`` or ``kopf run -m strata.operator.handlers --all-namespaces``."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import kopf
from kopf._core.reactor.inventory import ResourceMemories, ResourceMemory

from strata.operator import names, slimwatch
from strata.operator.api.models import InferenceServiceSpec
from strata.operator.autoscale.loop import Autoscaler, Peering
from strata.operator.child_events import child_action
from strata.operator.events import EventType
from strata.operator.kube import ClientPolicy, KubeClient
from strata.operator.runtime import Runtime
from strata.operator.settings import OperatorSettings, settings_from_env
from strata.operator.views import (
    PodRef,
    ServiceKey,
    owning_service,
    pod_owner,
    ready_pod,
    snapshot,
    workload_snapshot,
)

CHILD_RESOURCES = (
    ("apps", "v1", "deployments"),
    ("apps", "v1", "statefulsets"),
    ("", "v1", "services"),
    ("", "v1", "configmaps"),
    ("", "v1", "persistentvolumeclaims"),
    ("policy", "v1", "poddisruptionbudgets"),
    ("networking.k8s.io", "v1", "networkpolicies"),
    ("", "v1", "serviceaccounts"),
    ("rbac.authorization.k8s.io", "v1", "roles"),
    ("rbac.authorization.k8s.io", "v1", "rolebindings"),
)
CHILD_KINDS = {
    "deployments": "Deployment",
    "statefulsets": "StatefulSet",
    "services": "Service",
    "configmaps": "ConfigMap",
    "persistentvolumeclaims": "PersistentVolumeClaim",
    "poddisruptionbudgets": "PodDisruptionBudget",
    "networkpolicies": "NetworkPolicy",
    "serviceaccounts": "ServiceAccount",
    "roles": "Role",
    "rolebindings": "RoleBinding",
}
QUEUE_IDLE_S = 0.5
MANAGED = {names.LABEL_MANAGED_BY: names.MANAGED_BY}
MANAGED_SELECTOR = f"{names.LABEL_MANAGED_BY}={names.MANAGED_BY}"
# Watched with MANAGED_SELECTOR: the API server sends only the operator's own objects.
LABELLED = {(g, p) for g, _, p in CHILD_RESOURCES} | {("", "pods"), ("scheduling.k8s.io", "priorityclasses")}


def kopf_sink(obj: Mapping[str, Any], type_: EventType, reason: str, message: str) -> None:
    """Events posted by kopf, with a client of its own."""
    kopf.event(dict(obj), type=type_, reason=reason, message=message[:1024])  # type: ignore[arg-type]


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    config: OperatorSettings = memo.get("strata_settings") or settings_from_env()
    configure(settings, config)
    policy = ClientPolicy(max_in_flight=config.api_max_in_flight, timeout_floor_s=config.api_timeout_s)
    runtime = Runtime.build(KubeClient.from_environment(policy=policy), config, kopf_sink)
    if config.metrics_port:
        runtime.metrics.serve(config.metrics_port, config.metrics_host)
    runtime.start()
    memo["strata"] = runtime
    peering = settings.peering  # kopf.run has filled it in by now
    memo["strata_autoscaler"] = AutoscalerSlot(
        Peering(None if peering.standalone else peering.name, peering.priority),
        config,
        per_namespace=not peering.standalone and not peering.clusterwide,
    )


@dataclass
class AutoscalerSlot:
    """Shared by reference: kopf gives each object a shallow copy of the operator's memo."""

    peering: Peering
    config: OperatorSettings
    per_namespace: bool  # namespaced KopfPeerings, which the autoscaler does not follow
    task: asyncio.Task[None] | None = None
    autoscaler: Autoscaler | None = None
    started: bool = False


def start_autoscaler(memo: kopf.Memo) -> None:
    """Once, from the first InferenceService event: one background task, not a kopf timer or
    daemon (those add a finalizer to every InferenceService). It starts from a handler rather
    than at start-up because kopf.event only works in a handler's context, which the task
    inherits. kopf does not pause it with the watches, so it checks the peering itself."""
    slot: AutoscalerSlot = memo["strata_autoscaler"]
    if slot.started:
        return
    slot.started = True
    runtime: Runtime = memo["strata"]
    if slot.per_namespace:
        logging.getLogger(__name__).warning(
            "autoscaler disabled: it follows only a ClusterKopfPeering, and this operator peers per namespace"
        )
        return
    slot.autoscaler = Autoscaler(
        kube=runtime.reconciler.applier.kube,
        events=runtime.events,
        services=lambda: _managed(runtime),
        views=runtime.views,
        peering=slot.peering,
        telemetry=runtime.telemetry,
        utilization_window_s=slot.config.utilization_window_s,
    )
    slot.task = asyncio.create_task(
        slot.autoscaler.run(slot.config.autoscale_interval_s), name="strata-autoscaler"
    )


def configure(settings: kopf.OperatorSettings, config: OperatorSettings) -> None:
    # Watch streams that go silent are re-opened (kopf#1276); the liveness probe exposes hangs.
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 10
    # Resources are discovered once at start-up: no cluster-wide CRD or namespace watch (RBAC).
    settings.scanning.disabled = True
    # Our own Events say what happened; kopf's per-handler ones would only add noise.
    settings.posting.level = logging.WARNING
    settings.peering.lifetime = config.peering_lifetime_s
    settings.watching.label_selectors[_labelled] = MANAGED_SELECTOR
    settings.persistence.diffbase_storage = NoEssence()
    # kopf's per-object worker keeps the last event's whole body while it waits for the next one
    # (5 s by default): in a burst that is a parsed body for every object touched in the last 5 s.
    settings.queueing.idle_timeout = QUEUE_IDLE_S


class NoEssence(kopf.AnnotationsDiffBaseStorage):
    """kopf deep-copies every event's body to diff it against the last handled one, which only
    on.create/update/resume handlers use; this operator has none (on.event and indices only).
    At scale that copy was about 6% of the operator's CPU: skip it."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()


class EventMemories(ResourceMemories):
    """kopf keeps a memory of every object it has seen (about 1 KB: a copy of the memo, an error
    throttler, daemon and indexing state), some 14 per service with its children and pods. This
    operator has no daemons, timers, patches or create/update handlers that would read one back,
    and its index functions do not fail, so each event gets a fresh memory that is not kept."""

    async def recall(
        self,
        raw_body: kopf.RawBody,
        *,
        memobase: Any = None,
        noticed_by_listing: bool = False,
        ephemeral: bool = False,
    ) -> ResourceMemory:
        return await super().recall(
            raw_body, memobase=memobase, noticed_by_listing=noticed_by_listing, ephemeral=True
        )


def _labelled(resource: kopf.Resource) -> bool:
    return (resource.group, resource.plural) in LABELLED


def _managed(runtime: Runtime) -> list[ServiceKey]:
    """The services this replica reconciles: a paused standby has none."""
    keys = runtime.runner.keys()
    return [(str(k[0]), str(k[1])) for k in keys if isinstance(k, tuple)]


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    slot: AutoscalerSlot | None = memo.get("strata_autoscaler")
    if slot is not None and slot.task is not None:
        slot.task.cancel()
        await asyncio.gather(slot.task, return_exceptions=True)
    if slot is not None and slot.autoscaler is not None:
        await slot.autoscaler.close()
    runtime: Runtime | None = memo.get("strata")
    if runtime is not None:
        await runtime.close()


@kopf.index(names.GROUP, names.VERSION, names.TIER_PLURAL)
async def tier_bodies(name: str, body: kopf.Body, **_: Any) -> dict[str, dict[str, Any]]:
    return {name: snapshot(body)}


@kopf.index(names.GROUP, names.VERSION, names.ISVC_PLURAL)
async def service_bodies(
    *, namespace: str | None, name: str, body: kopf.Body, **_: Any
) -> dict[ServiceKey, Any]:
    return {(namespace or "", name): snapshot(body)}


@kopf.index(names.GROUP, names.VERSION, names.ISVC_PLURAL)
async def services_by_tier(
    *, namespace: str | None, name: str, spec: kopf.Spec, **_: Any
) -> dict[str, ServiceKey]:
    return {InferenceServiceSpec.tier_of(spec): (namespace or "", name)}


@kopf.index("apps", "v1", "deployments", labels=MANAGED)
async def deployments_by_service(
    *, namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any
) -> Any:
    key = owning_service(labels, namespace)
    return {key: workload_snapshot(body)} if key else None


@kopf.index("apps", "v1", "statefulsets", labels=MANAGED)
async def statefulsets_by_service(
    *, namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any
) -> Any:
    key = owning_service(labels, namespace)
    return {key: workload_snapshot(body)} if key else None


@kopf.index("", "v1", "pods", labels=MANAGED)
async def ready_pods_by_service(
    *, namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any
) -> dict[ServiceKey, PodRef] | None:
    """A service's Ready worker and router pods (the routers' held requests wake a service at
    zero: autoscale/wake.py), told apart by PodRef.app. One index for both: kopf keeps an entry
    for every pod in every index of pods, whether the function returned a value for it or not."""
    key, pod = pod_owner(labels, namespace), ready_pod(body)
    return {key: pod} if key and pod else None


def _runtime(memo: Any, indices: dict[str, Any]) -> Runtime:
    """The runtime, its views bound to kopf's indices (the same objects on every call)."""
    runtime: Runtime = memo["strata"]
    if not runtime.views.bound:
        runtime.views.bind(
            services=indices["service_bodies"],
            tiers=indices["tier_bodies"],
            workloads=(indices["deployments_by_service"], indices["statefulsets_by_service"]),
            pods=indices["ready_pods_by_service"],
            services_by_tier=indices["services_by_tier"],
        )
    return runtime


@kopf.on.event(names.GROUP, names.VERSION, names.ISVC_PLURAL)
async def service_event(*, type: str, body: kopf.Body, memo: Any, **kwargs: Any) -> None:
    runtime = _runtime(memo, kwargs)
    start_autoscaler(memo)
    key: ServiceKey = (body.metadata.namespace or "", body.metadata.name or "")
    if type == "DELETED":
        runtime.forget(key)
        runtime.recount_tiers()
        return
    if type == "MODIFIED" and _status_only(body):
        return  # our own status write (or a metadata edit): nothing to render differently
    runtime.reconcile(key)
    runtime.recount_tiers()


@kopf.on.event(names.GROUP, names.VERSION, names.TIER_PLURAL)
async def tier_event(*, type: str, body: kopf.Body, memo: Any, **kwargs: Any) -> None:
    runtime = _runtime(memo, kwargs)
    services_by_tier: kopf.Index[str, ServiceKey] = kwargs["services_by_tier"]
    name = body.metadata.name or ""
    runtime.reconcile_tier(name)  # a deleted tier: forgets its status
    # At start-up every service reconciles on its own initial event; a status write is no change.
    if type is None or (type == "MODIFIED" and _status_only(body)):
        return
    for key in list(services_by_tier.get(name, [])):
        runtime.reconcile(key)


@kopf.on.event("scheduling.k8s.io", "v1", "priorityclasses", labels=MANAGED)
async def priorityclass_event(*, type: str, labels: kopf.Labels, memo: Any, **kwargs: Any) -> None:
    if type not in ("MODIFIED", "DELETED"):
        return
    runtime = _runtime(memo, kwargs)
    tier = runtime.views.tier(labels.get(names.LABEL_TIER, ""))
    if tier is not None:
        await runtime.tiers.applier.apply_priority_class(tier)


def _register_child_watches() -> None:
    for group, version, plural in CHILD_RESOURCES:
        kopf.on.event(group, version, plural, labels=MANAGED, id=f"child-{plural}")(child_event)


async def child_event(
    *, type: str, namespace: str | None, labels: kopf.Labels, memo: Any, **kwargs: Any
) -> None:
    """Any change to a child (deleted, edited by hand, or its status moved) re-runs its
    service's reconcile, which repairs the child and refreshes the service's status."""
    service = labels.get(names.LABEL_SERVICE)
    if not service or not namespace:
        return
    runtime = _runtime(memo, kwargs)
    body: kopf.Body = kwargs["body"]
    plural = kwargs["resource"].plural
    applier = runtime.reconciler.applier
    await applier.settled(CHILD_KINDS[plural], body.metadata)
    own = applier.is_own_write(CHILD_KINDS[plural], body.metadata)
    applier.observe(CHILD_KINDS[plural], body.metadata, deleted=type == "DELETED")
    known = applier.knows(CHILD_KINDS[plural], body.metadata)
    action = child_action(type, plural, own, known, _status_only(body))
    if action == "refresh":
        runtime.refresh_status((namespace, service))
    elif action == "reconcile":
        runtime.reconcile((namespace, service))


def _status_only(body: kopf.Body) -> bool:
    observed = (body.get("status") or {}).get("observedGeneration")
    return observed is not None and observed == body.metadata.get("generation")


_register_child_watches()
slimwatch.install(_labelled)
