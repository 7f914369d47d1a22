"""Small kubectl helpers: read an object, list by selector, wait for an InferenceService."""

from __future__ import annotations

import json
from typing import Any

from strata.cluster.cluster import Cluster
from strata.cluster.podwait import raise_if_stuck
from strata.operator import names
from strata.operator.api.models import REASON_INVALID_SPEC
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


# Reasons of Accepted=False that no wait cures: the spec itself must change.
REFUSED = frozenset({REASON_INVALID_SPEC})


class ServiceStuck(AssertionError):
    """An InferenceService cannot become Ready by waiting; the message says why."""


def refusal(obj: dict[str, Any] | None) -> str | None:
    """Why the operator will not run this InferenceService as it is; None while it may."""
    accepted = condition(obj, "Accepted")
    if accepted.get("status") == "False" and accepted.get("reason") in REFUSED:
        return f"Accepted=False {accepted['reason']}: {accepted.get('message', '')}"
    return None


def wait_ready(cluster: Cluster, namespace: str, name: str, timeout_s: float = 600) -> dict[str, Any]:
    """The InferenceService once its Ready condition is True; fails at once (ServiceStuck or
    PodStuck) when its spec is refused or one of its pods cannot start."""

    def ready() -> dict[str, Any] | None:
        obj: dict[str, Any] | None = get(cluster, "inferenceservice", name, namespace)
        if condition(obj, "Ready").get("status") == "True":
            return obj
        if (why := refusal(obj)) is not None:
            raise ServiceStuck(f"InferenceService {namespace}/{name}: {why}")
        raise_if_stuck(cluster, live_pods(cluster, namespace, names.selector_labels(name)))
        return None

    return wait_for(ready, timeout_s, what=f"InferenceService {namespace}/{name} Ready", interval_s=1)


def live_pods(cluster: Cluster, namespace: str, labels: dict[str, str]) -> list[dict[str, Any]]:
    """The pods with ``labels`` that are not being deleted, whatever their phase."""
    pods = items(cluster, "pods", namespace, names.label_selector(labels))
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def running_pods(
    cluster: Cluster, namespace: str, service: str, labels: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """The service's worker pods (or those with ``labels``) that run and are not being deleted."""
    pods = live_pods(cluster, namespace, labels or names.selector_labels(service))
    return [p for p in pods if p["status"].get("phase") == "Running"]


def events(cluster: Cluster, namespace: str, name: str) -> list[dict[str, Any]]:
    """The Events of InferenceService ``namespace/name``."""
    listed = items(cluster, "events", namespace)
    return [
        e
        for e in listed
        if e["involvedObject"].get("name") == name and e["involvedObject"].get("kind") == "InferenceService"
    ]
