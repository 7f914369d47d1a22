"""What the operator keeps of a watched child's or pod's body: the few fields it reads.

kopf queues every watch event's whole parsed body for the object's worker, and in a burst
(a thousand services: ten children and a few pods each, every one created, then moved along by
its controller several times) thousands of them wait at once: a Deployment's body parsed into
Python is some 50 KB, most of it the pod template and ``managedFields``, which the operator
rendered itself and never reads back. That is what made the operator's peak memory. Slimming
each event as it leaves the API stream, before kopf queues it, bounds a queued event to a few
hundred bytes. Pure: the hook that applies it is strata.operator.slimwatch."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"  # a second copy of the spec
# What is read of a child (handlers.child_event, child_events, children.Applier), a workload
# (views.workload_snapshot: spec.replicas and the whole status) and a pod (views.ready_pod).
WORKLOAD_SPEC = ("replicas",)
POD_STATUS_FIELDS = ("phase", "podIP", "conditions")


def slim_body(plural: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """``body`` with only identity, labels, annotations (but kubectl's copy of the spec), the
    generation, ``spec.replicas`` and the status (a pod's phase, IP and conditions) left."""
    kept: dict[str, Any] = {k: body[k] for k in ("apiVersion", "kind") if k in body}
    kept["metadata"] = slim_metadata(body.get("metadata") or {})
    spec = body.get("spec") or {}
    replicas = {k: spec[k] for k in WORKLOAD_SPEC if k in spec}
    if replicas:
        kept["spec"] = replicas
    status = body.get("status")
    if status is not None:
        kept["status"] = _pod_status(status) if plural == "pods" else status
    return kept


def slim_metadata(meta: Mapping[str, Any]) -> dict[str, Any]:
    """``meta`` without ``managedFields`` and kubectl's last-applied copy of the spec: nothing
    reads them, and they are a large part of every object (the index caches services too)."""
    kept = {k: v for k, v in meta.items() if k != "managedFields"}
    annotations = meta.get("annotations")
    if annotations and LAST_APPLIED in annotations:
        kept["annotations"] = {k: v for k, v in annotations.items() if k != LAST_APPLIED}
    return kept


def slim_event(plural: str, event: Any) -> Any:
    """A raw watch event with its object slimmed; anything else (kopf's bookmarks, errors, a
    BOOKMARK's bare object) unchanged."""
    if not isinstance(event, dict) or event.get("type") not in (None, "ADDED", "MODIFIED", "DELETED"):
        return event
    obj = event.get("object")
    if not isinstance(obj, dict):
        return event
    return {"type": event["type"], "object": slim_body(plural, obj)}


def _pod_status(status: Mapping[str, Any]) -> dict[str, Any]:
    return {k: status[k] for k in POD_STATUS_FIELDS if k in status}
