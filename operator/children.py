"""Write every child of one service with server-side apply, and retire what no longer belongs.

Order matters only where admission or scheduling depends on it: the PriorityClass before any
pod (admission rejects an unknown class), the ConfigMap and claims before the workload. What is
already there is read from the watch caches (strata.operator.views), never fetched; one Event
per reconcile lists the children it created (or repaired), not one Event per child."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from strata.operator import names
from strata.operator.events import EventSink
from strata.operator.kube import KubeClient, KubeError, Obj
from strata.operator.metrics import OperatorMetrics
from strata.operator.plan import OwnerRef, ServicePlan
from strata.operator.render.common import content_hash
from strata.operator.render.configmap import render_configmap
from strata.operator.render.networkpolicy import render_network_policies
from strata.operator.render.pdb import render_pdb
from strata.operator.render.priorityclass import render_priorityclass
from strata.operator.render.router import render_router
from strata.operator.render.services import render_client_service, render_metrics_service
from strata.operator.render.storage import render_shared_claim
from strata.operator.render.workload import render_workload
from strata.operator.settings import OperatorSettings
from strata.operator.views import IndexViews

WORKLOAD_KINDS = ("Deployment", "StatefulSet")
DELETED = "deleted"  # the marker of a child whose watch showed it deleted
ChildKey = tuple[str, str, str]  # (kind, namespace, name)


@dataclass
class Applier:
    kube: KubeClient
    settings: OperatorSettings
    metrics: OperatorMetrics
    events: EventSink
    views: IndexViews = field(default_factory=IndexViews)
    # What this process last applied and saw of each child: one small record per child, since
    # a fleet has ten children per service (a dict per field cost twice the memory).
    children: dict[ChildKey, ChildState] = field(default_factory=dict)
    # Tier name -> (uid, priority) of the PriorityClass applied by this process; a PriorityClass
    # edited or deleted by someone else is re-applied from its watch, which refreshes this.
    priority_classes: dict[str, tuple[str, int]] = field(default_factory=dict)
    # Children whose apply has been sent and not yet answered: under load the watch event of our
    # own write often arrives before the answer, and would look like someone else's change.
    in_flight: dict[ChildKey, asyncio.Future[None]] = field(default_factory=dict)

    async def apply_service(
        self, plan: ServicePlan, owner: Mapping[str, Any], tier: Mapping[str, Any]
    ) -> Obj:
        """Apply every child of ``plan``; returns the workload as the API server now has it."""
        await self.ensure_priority_class(tier)
        await self._retire_other_workload(plan, owner)
        account, role, binding, router_pdb, router = render_router(plan, self.settings)
        # Three rounds, each sent at once. RBAC refuses a RoleBinding to a Role that does not
        # exist yet, and the router's pods need their account and its rights.
        first = [
            render_configmap(plan),
            render_client_service(plan),
            render_metrics_service(plan),
            render_pdb(plan),
            router_pdb,
            account,
            role,
            *render_network_policies(plan, self.settings),
        ]
        claim = render_shared_claim(plan)
        if claim is not None:
            first.append(claim)
        workload = render_workload(plan, self.settings)
        written = Written()
        try:
            await asyncio.gather(*(self.apply_if_changed(m, written) for m in first))
            applied, _ = await asyncio.gather(
                self.apply_if_changed(workload, written), self.apply_if_changed(binding, written)
            )
            await self.apply_if_changed(router, written)
        finally:
            written.announce(self.events, owner)
        if applied is not None:
            return applied
        current = self.views.workload((plan.namespace, plan.name), workload["kind"])
        return dict(current) if current is not None else await self.apply(workload, Written())

    async def apply_if_changed(self, manifest: Mapping[str, Any], written: Written) -> Obj | None:
        """Skip the write (None) when this process already applied exactly this manifest and no
        watch event has shown the object changed since: a no-op apply still costs the API server
        a full server-side-apply merge. Anything else is applied."""
        key = _key(manifest)
        digest = content_hash(manifest)
        known = self.children.get(key)
        if known is not None and known.observed == known.applied and known.digest == digest:
            self.metrics.applied.labels(kind=key[0], outcome="skipped").inc()
            return None
        obj = await self.apply(manifest, written)
        self.children[key].digest = digest
        return obj

    def knows(self, kind: str, meta: Mapping[str, Any]) -> bool:
        return _child_key(kind, meta) in self.children

    def observe(self, kind: str, meta: Mapping[str, Any], deleted: bool) -> None:
        """Record what a watch event showed of a child, for :meth:`apply_if_changed`."""
        known = self.children.get(_child_key(kind, meta))
        if known is not None:
            known.observed = DELETED if deleted else _marker(meta)

    async def settled(self, kind: str, meta: Mapping[str, Any]) -> None:
        """Wait until no apply of this child is on its way: then :meth:`is_own_write` can tell
        the echo of our own write from a change by someone else."""
        pending = self.in_flight.get(_child_key(kind, meta))
        if pending is not None:
            await asyncio.shield(pending)

    async def apply(self, manifest: Mapping[str, Any], written: Written) -> Obj:
        sent = _key(manifest)
        answered = self.in_flight[sent] = asyncio.get_running_loop().create_future()
        try:
            obj, created = await self.kube.apply_created(manifest)
        finally:
            if self.in_flight.get(sent) is answered:
                del self.in_flight[sent]
            answered.set_result(None)
        kind, marker = manifest["kind"], _marker(obj.get("metadata", {}))
        before = self.children.get(sent)
        service = manifest["metadata"].get("labels", {}).get(names.LABEL_SERVICE, "")
        self.children[sent] = ChildState(marker, marker, before.digest if before else "", service)
        if created:
            outcome = "created"
        elif before is not None and before.applied != marker:
            outcome = "updated"
        else:
            outcome = "unchanged"
        written.record(outcome, f"{kind} {sent[2]}")
        self.metrics.applied.labels(kind=kind, outcome=outcome).inc()
        return obj

    async def ensure_priority_class(self, tier: Mapping[str, Any]) -> None:
        """Apply the tier's PriorityClass unless this process already did for this tier version."""
        meta = tier["metadata"]
        if self.priority_classes.get(meta["name"]) != (
            meta["uid"],
            int(tier.get("spec", {}).get("priority", 0)),
        ):
            await self.apply_priority_class(tier)

    async def apply_priority_class(self, tier: Mapping[str, Any]) -> Obj:
        obj = await self._apply_priority_class(tier)
        meta = tier["metadata"]
        self.priority_classes[meta["name"]] = (meta["uid"], int(obj.get("value", 0)))
        return obj

    async def _apply_priority_class(self, tier: Mapping[str, Any]) -> Obj:
        meta, spec = tier["metadata"], tier.get("spec", {})
        owner = OwnerRef(names.API_VERSION, names.TIER_KIND, meta["name"], meta["uid"])
        manifest = render_priorityclass(
            meta["name"], int(spec.get("priority", 0)), owner, spec.get("description", "")
        )
        written = Written()
        try:
            return await self.apply(manifest, written)
        except KubeError as exc:
            if exc.status != 422:
                raise
        finally:
            written.announce(self.events, tier)
        # A PriorityClass's value is immutable: a tier whose priority changed gets a new class.
        # Running pods keep the priority they were admitted with; new pods get the new one.
        current = await self.kube.get(manifest["apiVersion"], "PriorityClass", manifest["metadata"]["name"])
        if current is not None:
            await self.kube.delete(
                manifest["apiVersion"],
                "PriorityClass",
                current["metadata"]["name"],
                uid=current["metadata"]["uid"],
            )
            self.events(
                tier,
                "Normal",
                "Replaced",
                f"PriorityClass {current['metadata']['name']} re-created with value {manifest['value']}",
            )
        return await self.apply(manifest, Written())

    def current_workload(self, namespace: str, name: str) -> Obj | None:
        for kind in WORKLOAD_KINDS:
            found = self.views.workload((namespace, name), kind)
            if found is not None:
                return dict(found)
        return None

    async def _retire_other_workload(self, plan: ServicePlan, owner: Mapping[str, Any]) -> None:
        """A tier that starts (or stops) keeping NVMe across restarts switches the workload kind;
        the old one is deleted so the two never run side by side."""
        other = "StatefulSet" if plan.workload_kind == "Deployment" else "Deployment"
        old = self.views.workload((plan.namespace, plan.name), other)
        if old is None or not owned_by(old, plan.owner.uid):
            return
        if await self.kube.delete(
            "apps/v1", other, old["metadata"]["name"], plan.namespace, old["metadata"]["uid"]
        ):
            self.events(
                owner, "Normal", "Replaced", f"deleted {other} {plan.name}: now a {plan.workload_kind}"
            )

    def is_own_write(self, kind: str, meta: Mapping[str, Any]) -> bool:
        """The child is exactly as this process's last apply left it (spec-wise): its watch
        event is the echo of our own write, with nothing to repair."""
        known = self.children.get(_child_key(kind, meta))
        return known is not None and known.applied == _marker(meta)

    def forget(self, namespace: str, name: str) -> None:
        """Drop what this process remembers of a deleted service's children."""
        self.children = {
            k: v for k, v in self.children.items() if not (k[1] == namespace and v.service == name)
        }


@dataclass(slots=True)
class ChildState:
    """One child as this process last applied it and as its watch last showed it."""

    # generation (or resourceVersion) our last apply left behind: a different value on the
    # next apply means that apply changed the object
    applied: str
    observed: str  # the same marker as the watch last showed it; DELETED once it is gone
    digest: str  # content hash of the manifest last applied
    service: str  # the owning service's name (its label), for forget()


@dataclass
class Written:
    """The children one reconcile wrote, announced as one Event per outcome."""

    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)

    def record(self, outcome: str, what: str) -> None:
        if outcome == "created":
            self.created.append(what)
        elif outcome == "updated":
            self.updated.append(what)

    def announce(self, events: EventSink, target: Mapping[str, Any]) -> None:
        if self.created:
            events(target, "Normal", "Created", "created " + ", ".join(sorted(self.created)))
        if self.updated:
            events(target, "Normal", "Updated", "re-applied " + ", ".join(sorted(self.updated)) + ": changed")


def _key(manifest: Mapping[str, Any]) -> ChildKey:
    meta = manifest["metadata"]
    return (manifest["kind"], meta.get("namespace", ""), meta["name"])


def _child_key(kind: str, meta: Mapping[str, Any]) -> ChildKey:
    return (kind, meta.get("namespace", ""), meta.get("name", ""))


def _marker(meta: Mapping[str, Any]) -> str:
    # generation moves only with the spec (status updates leave it); kinds without one
    # (ConfigMap, Service) have no status to move their resourceVersion.
    return str(meta.get("generation") or meta.get("resourceVersion", ""))


def owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in obj.get("metadata", {}).get("ownerReferences", []) or [])
