"""Small kubectl helpers: read an object, list by selector, wait for an InferenceService."""

from __future__ import annotations

import json
from typing import Any

from strata.cluster.cluster import Cluster
from strata.operator import names
from strata.stack.wait import wait_for


def get(cluster: Cluster, kind: str, name: str, namespace: str | None = None) -> Any:
    """The object as JSON, or None when it does not exist."""
    args = ["get", kind, name, "--ignore-not-found", "-o", "json"] + (["-n", namespace] if namespace else [])
    out = cluster.kubectl(*args).stdout.strip()
    return json.loads(out) if out else None


def items(cluster: Cluster, kind: str, namespace: str, selector: str = "") -> list[dict[str, Any]]:
    args = ["get", kind, "-n", namespace, "-o", "json"] + ([f"-l={selector}"] if selector else [])
    result: list[dict[str, Any]] = cluster.kubectl_json(*args)["items"]
    return result


def condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    """The status condition of ``type_``, or {} when the object or the condition is absent."""
    for cond in ((obj or {}).get("status") or {}).get("conditions", []):
        if cond["type"] == type_:
            return dict(cond)
    return {}


def wait_ready(cluster: Cluster, namespace: str, name: str, timeout_s: float = 600) -> dict[str, Any]:
    """The InferenceService once its Ready condition is True."""

    def ready() -> dict[str, Any] | None:
        obj = get(cluster, "inferenceservice", name, namespace)
        return obj if condition(obj, "Ready").get("status") == "True" else None

    return wait_for(ready, timeout_s, what=f"InferenceService {namespace}/{name} Ready")


def running_pods(
    cluster: Cluster, namespace: str, service: str, labels: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """The service's worker pods (or those with ``labels``) that run and are not being deleted."""
    selector = names.label_selector(labels or names.selector_labels(service))
    pods = items(cluster, "pods", namespace, selector)
    return [
        p
        for p in pods
        if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    ]


def events(cluster: Cluster, namespace: str, name: str) -> list[dict[str, Any]]:
    """The Events of InferenceService ``namespace/name``."""
    listed = items(cluster, "events", namespace)
    return [
        e
        for e in listed
        if e["involvedObject"].get("name") == name and e["involvedObject"].get("kind") == "InferenceService"
    ]
