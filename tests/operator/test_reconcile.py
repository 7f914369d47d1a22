"""The reconcile loop against an in-memory API: what it writes, what it leaves alone, what it says.

The watch caches it reads are live views of the fake API's objects, as kopf's indices would be."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

from strata.operator.children import Applier, Written
from strata.operator.events import CountedSink, RecordedEvents
from strata.operator.kube import KubeError
from strata.operator.metrics import OperatorMetrics
from strata.operator.reconcile import Reconciler, TierReconciler
from strata.operator.settings import OperatorSettings
from strata.operator.views import IndexViews, owning_service

from .factories import NS_UID, isvc_body, tier_body

Key = tuple[str, str, str]
GENERATION_KINDS = {"Deployment", "StatefulSet", "PodDisruptionBudget", "InferenceService"}


class FakeKube:
    """Server-side apply, get and delete over a dict; generation moves when the spec changes."""

    def __init__(self) -> None:
        self.objects: dict[Key, dict[str, Any]] = {}
        self.writes: list[tuple[str, Key]] = []
        self.fail_kinds: set[str] = set()

    def put(self, obj: dict[str, Any]) -> None:
        self.objects[
            self._key(obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        ] = obj

    @staticmethod
    def _key(kind: str, namespace: str | None, name: str) -> Key:
        return (kind, namespace or "", name)

    async def get(self, api_version: str, kind: str, name: str, namespace: str | None = None):
        obj = self.objects.get(self._key(kind, namespace, name))
        return copy.deepcopy(obj) if obj else None

    async def apply(self, manifest: dict[str, Any], *, subresource: str = "") -> dict[str, Any]:
        return (await self.apply_created(manifest, subresource=subresource))[0]

    async def apply_created(
        self, manifest: dict[str, Any], *, subresource: str = ""
    ) -> tuple[dict[str, Any], bool]:
        if manifest["kind"] in self.fail_kinds:
            raise KubeError(500, "InternalError", "etcd is sad")
        meta = manifest["metadata"]
        key = self._key(manifest["kind"], meta.get("namespace"), meta["name"])
        current = self.objects.get(key)
        if subresource == "status":
            assert current is not None
            current["status"] = copy.deepcopy(manifest["status"])
            self.writes.append(("status", key))
            current["metadata"]["resourceVersion"] = str(len(self.writes))  # every write moves it
            return copy.deepcopy(current), False
        body = {k: copy.deepcopy(v) for k, v in manifest.items() if k != "metadata"}
        if current is not None and json.dumps(_strip(current), sort_keys=True) == json.dumps(
            body, sort_keys=True
        ):
            return copy.deepcopy(current), False
        obj = {
            **body,
            "metadata": {
                **copy.deepcopy(meta),
                "uid": f"uid-{key}",
                "resourceVersion": str(len(self.writes) + 1),
            },
        }
        if manifest["kind"] in GENERATION_KINDS:  # like the API server: ConfigMaps have none
            obj["metadata"]["generation"] = (current or {}).get("metadata", {}).get("generation", 0) + 1
        if current is not None and "status" in current:
            obj["status"] = current["status"]
        self.objects[key] = obj
        self.writes.append(("apply", key))
        return copy.deepcopy(obj), current is None

    async def delete(
        self, api_version: str, kind: str, name: str, namespace: str | None = None, uid=None
    ) -> bool:
        self.writes.append(("delete", self._key(kind, namespace, name)))
        return self.objects.pop(self._key(kind, namespace, name), None) is not None

    async def close(self) -> None:
        pass


def _strip(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status")}


class Live(Mapping[tuple[str, str], list[dict[str, Any]]]):
    """The fake API's objects of one kind by (namespace, service): a watch cache that is never late."""

    def __init__(self, kube: FakeKube, kind: str, service: Callable[[dict[str, Any]], str | None]):
        self.kube, self.kind, self.service = kube, kind, service

    def _found(self) -> dict[tuple[str, str], list[dict[str, Any]]]:
        found: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for (kind, namespace, _), obj in self.kube.objects.items():
            name = self.service(obj)
            if kind == self.kind and name:
                found.setdefault((namespace, name), []).append(obj)
        return found

    def __getitem__(self, key: tuple[str, str]) -> list[dict[str, Any]]:
        return self._found()[key]

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(self._found())

    def __len__(self) -> int:
        return len(self._found())


def views_of(kube: FakeKube) -> IndexViews:
    def label(obj: dict[str, Any]) -> str | None:
        """The owning service, as the operator's index keys it (never the router's Deployment)."""
        key = owning_service(obj["metadata"].get("labels", {}), obj["metadata"].get("namespace"))
        return key[1] if key else None

    return IndexViews(
        services=Live(kube, "InferenceService", lambda obj: obj["metadata"]["name"]),
        workloads=(Live(kube, "Deployment", label), Live(kube, "StatefulSet", label)),
    )


def setup(tier: str = "standard", **spec: Any):
    kube = FakeKube()
    kube.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a", "uid": NS_UID}})
    kube.put(isvc_body(tier=tier, **spec))
    events = RecordedEvents()
    applier = Applier(kube, OperatorSettings(), OperatorMetrics(), events, views_of(kube))  # type: ignore[arg-type]
    reconciler = Reconciler(applier, now=lambda: datetime(2026, 1, 1, tzinfo=UTC))
    return kube, events, reconciler


def tiers(reconciler: Reconciler, *names: str, **overrides: Any) -> Reconciler:
    """The tiers the watch cache holds from now on."""
    reconciler.views.tiers = {n: [tier_body(n, **overrides)] for n in names}
    return reconciler


async def reconcile(reconciler: Reconciler, *tier_names: str, **overrides: Any) -> bool:
    return await tiers(reconciler, *tier_names, **overrides).reconcile_service(("team-a", "chat"))


def conditions(kube: FakeKube, name: str = "chat") -> dict[str, dict[str, Any]]:
    obj = kube.objects[("InferenceService", "team-a", name)]
    return {c["type"]: c for c in obj["status"]["conditions"]}


async def test_first_reconcile_creates_every_child_and_reports():
    kube, events, reconciler = setup()
    assert await reconcile(reconciler, "standard")
    kinds = {k[0] for k in kube.objects}
    assert {"ConfigMap", "Service", "PodDisruptionBudget", "Deployment", "PriorityClass"} <= kinds
    # One Event for the tier's PriorityClass, one listing every child of the service (the router's too).
    assert events.reasons().count("Created") == 2
    (listing,) = [e[3] for e in events.events if e[0] == "chat" and e[2] == "Created"]
    children = (
        "ConfigMap chat-config, Deployment chat, Deployment chat-router, NetworkPolicy chat, "
        "NetworkPolicy chat-router, PodDisruptionBudget chat, "
        "PodDisruptionBudget chat-router, Role chat-router, RoleBinding chat-router, Service chat, "
        "Service chat-metrics, ServiceAccount chat-router"
    )
    assert listing == f"created {children}"
    conds = conditions(kube)
    assert conds["Accepted"]["status"] == "True" and conds["Ready"]["status"] == "False"
    assert "Warning" not in {e[1] for e in events.events}


async def test_second_reconcile_writes_nothing_and_says_nothing():
    kube, events, reconciler = setup()
    await reconcile(reconciler, "standard")
    writes, said = len(kube.writes), len(events.events)
    assert await reconcile(reconciler, "standard")
    assert kube.writes[writes:] == [] and events.events[said:] == []


async def test_missing_tier_touches_no_child():
    kube, events, reconciler = setup()
    await reconcile(reconciler, "standard")
    workload = copy.deepcopy(kube.objects[("Deployment", "team-a", "chat")])
    writes = len(kube.writes)
    assert await reconcile(reconciler)
    assert [w for w in kube.writes[writes:] if w[0] != "status"] == []
    assert kube.objects[("Deployment", "team-a", "chat")] == workload
    conds = conditions(kube)
    assert conds["Accepted"]["reason"] == "TierNotFound" and conds["Degraded"]["status"] == "True"
    assert ("chat", "Warning", "TierNotFound") in {e[:3] for e in events.events}


async def test_persistent_nvme_tier_replaces_the_deployment_with_a_statefulset():
    kube, events, reconciler = setup()
    await reconcile(reconciler, "standard")
    assert await reconcile(reconciler, "standard", cache={"nvme": {"survivesRestart": True}})
    assert ("Deployment", "team-a", "chat") not in kube.objects
    assert ("StatefulSet", "team-a", "chat") in kube.objects
    assert "Replaced" in events.reasons()


async def test_api_failure_is_reported_and_retried():
    kube, _, reconciler = setup()
    kube.fail_kinds = {"Deployment"}
    assert not await reconcile(reconciler, "standard")
    conds = conditions(kube)
    assert conds["Degraded"]["reason"] == "ReconcileError" and "etcd is sad" in conds["Degraded"]["message"]
    kube.fail_kinds = set()
    assert await reconcile(reconciler, "standard")
    assert conditions(kube)["Degraded"]["status"] == "False"


async def test_deleted_service_is_left_to_garbage_collection():
    kube, _, reconciler = setup()
    del kube.objects[("InferenceService", "team-a", "chat")]
    assert await reconcile(reconciler, "standard")
    assert kube.writes == []


async def test_status_refresh_applies_nothing_once_reconciled():
    kube, _, reconciler = setup()
    await reconcile(reconciler, "standard")
    deployment = kube.objects[("Deployment", "team-a", "chat")]
    deployment["status"] = {"replicas": 1, "readyReplicas": 1, "updatedReplicas": 1, "observedGeneration": 1}
    writes = len(kube.writes)
    assert await tiers(reconciler, "standard").refresh_status(("team-a", "chat"))
    assert [w[0] for w in kube.writes[writes:]] == ["status"]
    assert conditions(kube)["Ready"]["status"] == "True"


async def test_status_refresh_of_a_rejected_service_reconciles_fully():
    kube, _, reconciler = setup()
    await reconcile(reconciler)
    assert conditions(kube)["Accepted"]["status"] == "False"
    assert await tiers(reconciler, "standard").refresh_status(("team-a", "chat"))
    assert conditions(kube)["Accepted"]["status"] == "True"
    assert ("Deployment", "team-a", "chat") in kube.objects


async def test_unchanged_children_are_not_reapplied_until_a_watch_shows_a_change():
    kube, events, reconciler = setup()
    applier = reconciler.applier
    await reconcile(reconciler, "standard")
    calls: list[str] = []
    original = kube.apply_created

    async def counting(manifest, *, subresource=""):
        calls.append(manifest["kind"])
        return await original(manifest, subresource=subresource)

    kube.apply_created = counting
    await reconcile(reconciler, "standard")
    assert calls == []
    # Someone edits the ConfigMap: the watch shows a resourceVersion we did not write.
    cm = kube.objects[("ConfigMap", "team-a", "chat-config")]
    cm["data"] = {"worker.yaml": "hacked"}
    cm["metadata"]["resourceVersion"] = "999"
    applier.observe("ConfigMap", cm["metadata"], deleted=False)
    await reconcile(reconciler, "standard")
    assert calls == ["ConfigMap"]
    assert kube.objects[("ConfigMap", "team-a", "chat-config")]["data"]["worker.yaml"] != "hacked"
    assert "Updated" in events.reasons()
    # Deleted: re-created.
    del kube.objects[("Service", "team-a", "chat-metrics")]
    applier.observe("Service", {"namespace": "team-a", "name": "chat-metrics"}, deleted=True)
    await reconcile(reconciler, "standard")
    assert ("Service", "team-a", "chat-metrics") in kube.objects


async def test_a_refresh_before_the_cache_shows_our_own_status_write_writes_nothing_again():
    kube, _, reconciler = setup()
    await reconcile(reconciler, "standard")
    stale = copy.deepcopy(kube.objects[("InferenceService", "team-a", "chat")])
    stale["status"], stale["metadata"]["resourceVersion"] = {}, "1"  # the watch is behind our write
    reconciler.views.services = {("team-a", "chat"): [stale]}
    writes = len(kube.writes)
    assert await reconciler.refresh_status(("team-a", "chat"))
    assert kube.writes[writes:] == []


async def test_a_tier_reports_its_class_and_service_count_and_writes_only_changes():
    kube, _, reconciler = setup()
    tiers(reconciler, "standard")
    tier = reconciler.views.tiers["standard"][0]
    kube.put(copy.deepcopy(tier))
    reconciler.views.services_by_tier = {"standard": [("team-a", "chat")]}
    tiers_reconciler = TierReconciler(reconciler.applier)
    assert await tiers_reconciler.reconcile_tier("standard")
    written = kube.objects[("ServiceTier", "", "standard")]["status"]
    assert written["services"] == 1 and written["priorityClassName"] == "strata-standard"
    applies = len(kube.writes)
    assert await tiers_reconciler.reconcile_tier("standard")  # nothing moved: no write, no apply
    assert kube.writes[applies:] == []
    reconciler.views.services_by_tier = {"standard": [("team-a", "chat"), ("team-b", "x")]}
    assert await tiers_reconciler.reconcile_tier("standard")
    assert kube.writes[applies:] == [("status", ("ServiceTier", "", "standard"))]
    assert kube.objects[("ServiceTier", "", "standard")]["status"]["services"] == 2


async def test_the_watch_echo_of_an_apply_still_in_flight_is_known_as_our_own_write_once_it_lands():
    """Under load the watch event of a create arrives before its answer: the handler waits for
    the answer (Applier.settled) instead of taking the echo for someone else's change."""
    kube, _, reconciler = setup()
    applier, answer, written = reconciler.applier, asyncio.Event(), asyncio.Event()
    real_apply = kube.apply_created

    async def slow_apply(manifest: dict[str, Any], *, subresource: str = "") -> Any:
        created = await real_apply(manifest, subresource=subresource)
        written.set()
        await answer.wait()  # the object exists (its watch event is out); the answer is late
        return created

    kube.apply_created = slow_apply
    manifest = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "team-a"}}
    applying = asyncio.create_task(applier.apply(manifest, Written()))
    await asyncio.wait_for(written.wait(), 5)
    echo = kube.objects[("ConfigMap", "team-a", "c")]["metadata"]
    assert not applier.is_own_write("ConfigMap", echo)  # what the handler saw before: a change
    settled = asyncio.create_task(applier.settled("ConfigMap", echo))
    await asyncio.sleep(0.01)
    assert not settled.done()
    answer.set()
    await asyncio.wait_for(settled, 5)
    assert applier.is_own_write("ConfigMap", echo)
    await applying
    await applier.settled("ConfigMap", echo)  # nothing in flight: returns at once


async def test_forgetting_a_service_forgets_its_children_only():
    """Another service whose name starts with the same letters keeps its records, so its
    unchanged children are still not re-applied."""
    kube, _, reconciler = setup()
    kube.put(isvc_body(name="chat-b"))
    tiers(reconciler, "standard")
    await reconciler.reconcile_service(("team-a", "chat"))
    await reconciler.reconcile_service(("team-a", "chat-b"))
    applier = reconciler.applier
    applier.forget("team-a", "chat")
    assert not applier.knows("ConfigMap", {"namespace": "team-a", "name": "chat-config"})
    assert applier.knows("ConfigMap", {"namespace": "team-a", "name": "chat-b-config"})
    skipped = applier.metrics.applied.labels(kind="ConfigMap", outcome="skipped")._value.get()
    await reconciler.reconcile_service(("team-a", "chat-b"))
    assert applier.metrics.applied.labels(kind="ConfigMap", outcome="skipped")._value.get() == skipped + 1


def test_every_event_is_counted_by_type_and_reason_and_passed_on():
    recorded, metrics = RecordedEvents(), OperatorMetrics()
    sink = CountedSink(recorded, metrics.event)
    sink({"metadata": {"name": "chat"}}, "Normal", "Ready", "1 of minimum 1 replicas ready")
    assert recorded.reasons() == ["Ready"]
    assert metrics.events.labels(type="Normal", reason="Ready")._value.get() == 1
