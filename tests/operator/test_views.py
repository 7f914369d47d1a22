"""The watch-cache views: what the indices keep of a pod, a workload, a service."""

from __future__ import annotations

from typing import Any

from strata.operator.slim import LAST_APPLIED
from strata.operator.status import rollout
from strata.operator.views import (
    IndexViews,
    PodRef,
    owning_service,
    pod_owner,
    ready_pod,
    snapshot,
    workload_snapshot,
)

READY = [{"type": "Ready", "status": "True"}]


def pod(ip: str = "127.64.0.1", conditions=READY, **meta: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p", "uid": "u", **meta}, "status": {"podIP": ip, "conditions": conditions}}


def test_only_ready_pods_with_an_ip_that_are_not_going_away_are_kept() -> None:
    assert ready_pod(pod()) == PodRef("u", "p", "127.64.0.1")
    assert ready_pod(pod(conditions=[{"type": "Ready", "status": "False"}])) is None
    assert ready_pod(pod(ip="")) is None
    assert ready_pod(pod(deletionTimestamp="2026-01-01T00:00:00Z")) is None


def test_worker_and_router_pods_share_one_index_and_are_told_apart_by_app() -> None:
    worker, router = {"app.kubernetes.io/name": "strata-worker"}, {"app.kubernetes.io/name": "strata-router"}
    labels = {"strata.dev/inferenceservice": "chat"}
    assert pod_owner({**labels, **router}, "a") == pod_owner({**labels, **worker}, "a") == ("a", "chat")
    assert pod_owner({**labels, "app.kubernetes.io/name": "other"}, "a") is None
    ref = ready_pod(pod(labels={**labels, **router}))
    assert ref is not None and ref.app == "strata-router"
    views = IndexViews(pods={("a", "chat"): [PodRef("u", "p", "127.64.0.1"), ref]})
    assert views.ready_pods(("a", "chat")) == [PodRef("u", "p", "127.64.0.1")]
    assert views.ready_routers(("a", "chat")) == [ref]


def test_children_are_keyed_by_the_service_label_in_their_namespace() -> None:
    assert owning_service({"strata.dev/inferenceservice": "chat"}, "team-a") == ("team-a", "chat")
    assert (
        owning_service({}, "team-a") is None
        and owning_service({"strata.dev/inferenceservice": "c"}, None) is None
    )


def test_a_snapshot_keeps_the_object_not_the_event() -> None:
    body = {
        "apiVersion": "v1",
        "kind": "X",
        "metadata": {"name": "a"},
        "spec": {},
        "status": {},
        "type": "ADDED",
    }
    assert snapshot(body) == {k: v for k, v in body.items() if k != "type"}


def test_a_snapshot_leaves_out_managed_fields_and_the_event_body_unchanged() -> None:
    fields = [{"manager": "strata-operator", "fieldsV1": {"f:spec": {"f:replicas": {}}}}]
    body: dict[str, Any] = {
        "kind": "Deployment",
        "metadata": {"name": "a", "resourceVersion": "7", "managedFields": fields},
    }
    kept = snapshot(body)
    assert kept["metadata"] == {"name": "a", "resourceVersion": "7"}
    assert body["metadata"]["managedFields"] == fields


def test_views_read_services_tiers_workloads_and_counts() -> None:
    views = IndexViews()
    assert views.service(("a", "b")) is None and not views.bound
    deployment = {"kind": "Deployment", "metadata": {"name": "chat"}}
    views.bind(
        services={("a", "chat"): [{"metadata": {"name": "chat"}}]},
        tiers={"standard": [{"metadata": {"name": "standard"}}]},
        workloads=({("a", "chat"): [deployment]}, {}),
        pods={("a", "chat"): [PodRef("u", "p", "127.64.0.1")]},
        services_by_tier={"standard": [("a", "chat"), ("b", "x")]},
    )
    assert views.bound and views.service(("a", "chat")) == {"metadata": {"name": "chat"}}
    assert (
        views.workload(("a", "chat")) is deployment and views.workload(("a", "chat"), "StatefulSet") is None
    )
    assert views.ready_pods(("a", "chat")) == [PodRef("u", "p", "127.64.0.1")]
    assert views.tier_services("standard") == 2 and views.tier_services("batch") == 0


def test_a_services_router_objects_are_not_its_workload_or_worker_pods():
    from strata.operator import names
    from strata.operator.views import owning_service

    worker = {**names.common_labels("chat", "standard")}
    router = {**worker, **names.router_selector_labels("chat")}
    assert owning_service(worker, "ns") == ("ns", "chat")
    assert owning_service(router, "ns") is None
    assert owning_service(router, "ns", names.ROUTER_APP) == ("ns", "chat")


def test_a_workload_snapshot_keeps_identity_replicas_and_status_not_the_pod_template() -> None:
    status = {"replicas": 2, "readyReplicas": 1, "observedGeneration": 3, "conditions": []}
    body: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "chat", "uid": "u", "generation": 3, "labels": {"a": "b"}, "managedFields": []},
        "spec": {"replicas": 2, "template": {"spec": {"containers": [{"name": "engine"}]}}},
        "status": status,
    }
    kept = workload_snapshot(body)
    assert kept == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "chat", "uid": "u", "generation": 3},
        "spec": {"replicas": 2},
        "status": status,
    }
    assert rollout(kept) == rollout(body)  # status reads the same from either


def test_a_snapshot_leaves_out_kubectls_copy_of_the_last_applied_spec() -> None:
    meta = {"name": "a", "annotations": {LAST_APPLIED: "{...}", "team": "x"}}
    assert snapshot({"metadata": meta})["metadata"] == {"name": "a", "annotations": {"team": "x"}}
    assert LAST_APPLIED in meta["annotations"]
