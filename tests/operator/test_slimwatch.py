"""Watched children and pods are slimmed before kopf queues them: what the operator reads of
them is unchanged, what it never reads is gone, and the hook sits where kopf's watchers look."""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import AsyncGenerator
from typing import Any

import kopf
from kopf._cogs.clients import watching
from kopf._core.reactor import queueing

from strata.operator import handlers, names, slimwatch
from strata.operator.plan import OwnerRef
from strata.operator.render.configmap import render_configmap
from strata.operator.render.workload import render_workload
from strata.operator.resolve import ResolveInput, resolve
from strata.operator.settings import OperatorSettings
from strata.operator.slim import LAST_APPLIED, slim_body, slim_event
from strata.operator.views import owning_service, ready_pod, workload_snapshot

from .factories import NS_UID, isvc_body, tier_body

MANAGED_FIELDS = [{"manager": "strata-operator", "operation": "Apply", "fieldsV1": {"f:spec": {"f:x": {}}}}]


def _plan() -> Any:
    return resolve(ResolveInput(isvc_body(), tier_body(), NS_UID))


def _as_served(manifest: dict[str, Any], **status: Any) -> dict[str, Any]:
    """A rendered child as the API server sends it back in a watch event."""
    body: dict[str, Any] = json.loads(json.dumps(manifest))
    meta = body["metadata"]
    meta.update(uid="u-1", resourceVersion="42", generation=3, managedFields=MANAGED_FIELDS)
    meta.setdefault("annotations", {})[LAST_APPLIED] = json.dumps(manifest)
    meta["ownerReferences"] = [OwnerRef("v1", "InferenceService", "chat", "svc-uid").__dict__]
    body["status"] = status
    return body


def _deployment() -> dict[str, Any]:
    workload = render_workload(_plan(), OperatorSettings())
    return _as_served(workload, observedGeneration=3, readyReplicas=1, replicas=1)


def _pod(ready: bool = True) -> dict[str, Any]:
    template = render_workload(_plan(), OperatorSettings())["spec"]["template"]
    pod = {"apiVersion": "v1", "kind": "Pod", **template}
    pod["metadata"] = {**template["metadata"], "name": "chat-0", "namespace": "team-a"}
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    status = {"phase": "Running", "podIP": "127.0.0.9", "conditions": conditions}
    return _as_served(pod, **status, containerStatuses=[{"name": "engine", "image": "x" * 200}])


def test_a_workload_keeps_what_the_views_and_child_events_read_and_loses_its_template():
    full = _deployment()
    slim = slim_body("deployments", full)
    assert workload_snapshot(slim) == workload_snapshot(full)
    assert slim["metadata"]["labels"] == full["metadata"]["labels"]
    assert slim["status"] == full["status"]  # observedGeneration: handlers._status_only
    assert "template" not in slim["spec"] and "managedFields" not in slim["metadata"]
    assert LAST_APPLIED not in slim["metadata"]["annotations"]
    assert len(json.dumps(slim)) * 4 < len(json.dumps(full))


def test_a_pod_keeps_its_readiness_and_owner():
    for ready in (True, False):
        full = _pod(ready)
        slim = slim_body("pods", full)
        assert ready_pod(slim) == ready_pod(full)
        labels = slim["metadata"]["labels"]
        assert owning_service(labels, "team-a") == owning_service(full["metadata"]["labels"], "team-a")
        assert "spec" not in slim and "containerStatuses" not in slim["status"]


def test_a_configmap_keeps_its_identity_and_loses_its_data():
    full = _as_served(render_configmap(_plan()))
    slim = slim_body("configmaps", full)
    assert "data" not in slim
    assert {k: slim["metadata"][k] for k in ("name", "namespace", "resourceVersion", "labels")} == {
        k: full["metadata"][k] for k in ("name", "namespace", "resourceVersion", "labels")
    }


def test_events_without_an_object_to_slim_pass_unchanged():
    error = {"type": "ERROR", "object": {"code": 410}}
    bookmark = {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "7"}}}
    for event in (error, bookmark, "LISTED"):
        assert slim_event("pods", event) is event
    listed = slim_event("pods", {"type": None, "object": _pod()})
    assert listed["type"] is None and "spec" not in listed["object"]


def test_kopf_watchers_call_the_stream_function_where_the_hook_replaces_it():
    """A kopf release that moves this would keep whole bodies again: fail here instead."""
    assert vars(queueing)["watching"] is watching
    assert "watching.infinite_watch(" in inspect.getsource(queueing.watcher)
    assert slimwatch.installed()  # by importing strata.operator.handlers


def test_the_operator_slims_its_children_pods_and_priorityclasses_but_not_its_own_kinds():
    def resource(group: str, plural: str) -> kopf.Resource:
        return kopf.Resource(group, "v1", plural)

    for group, plural in (("apps", "deployments"), ("", "pods"), ("", "configmaps")):
        assert handlers._labelled(resource(group, plural))
    assert handlers._labelled(resource("scheduling.k8s.io", "priorityclasses"))
    assert not handlers._labelled(resource(names.GROUP, names.ISVC_PLURAL))
    assert not handlers._labelled(resource(names.GROUP, names.TIER_PLURAL))


def test_the_hook_slims_selected_streams_and_closes_kopfs_stream_when_it_stops(monkeypatch):
    closed: list[str] = []

    async def kopf_stream(*, resource: Any, **_: Any) -> AsyncGenerator[Any, None]:
        try:
            yield {"type": "ADDED", "object": _pod()}
            yield {"type": "ADDED", "object": _pod()}
        finally:
            closed.append(resource.plural)

    monkeypatch.setattr(slimwatch, "_KOPF_INFINITE_WATCH", kopf_stream)
    stream = slimwatch._slimming(lambda r: r.plural == "pods")

    async def first(plural: str) -> Any:
        agen = stream(resource=kopf.Resource("", "v1", plural), settings=None)
        event = await anext(agen)
        await agen.aclose()
        return event

    slimmed, whole = asyncio.run(first("pods")), asyncio.run(first("secrets"))
    assert "spec" not in slimmed["object"] and "spec" in whole["object"]
    assert closed == ["pods", "secrets"]


def test_kopf_still_takes_the_ephemeral_memories_the_operator_asks_for():
    """handlers.EventMemories relies on kopf's ``recall(..., ephemeral=True)`` keeping nothing."""
    from kopf._core.reactor.inventory import ResourceMemories

    assert "ephemeral" in inspect.signature(ResourceMemories.recall).parameters

    async def recall() -> int:
        memories = handlers.EventMemories()
        await memories.recall({"metadata": {"uid": "u-1"}})
        return len(list(memories.iter_all_memories()))

    assert asyncio.run(recall()) == 0
