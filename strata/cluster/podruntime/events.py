"""Events the runtime records on pods and nodes, as a kubelet does (Started, Killing, BackOff,
Unhealthy, FailedMount, ...), from the component ``strata-pod-runtime``."""

from __future__ import annotations

import logging
import time
from typing import Any

from strata.cluster.podruntime.status import timestamp
from strata.operator.kube import KubeClient, KubeError

log = logging.getLogger(__name__)
COMPONENT = "strata-pod-runtime"


def event_body(
    involved: dict[str, Any], reason: str, message: str, type_: str, host: str, now: float
) -> dict[str, Any]:
    stamp = timestamp(now)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "generateName": f"{involved['name']}.",
            "namespace": involved.get("namespace", "default"),
        },
        "involvedObject": involved,
        "reason": reason,
        "message": message,
        "type": type_,
        "source": {"component": COMPONENT, "host": host},
        "reportingComponent": COMPONENT,
        "reportingInstance": host,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


def pod_ref(namespace: str, name: str, uid: str, container: str | None = None) -> dict[str, Any]:
    ref: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": namespace,
        "name": name,
        "uid": uid,
    }
    if container:
        ref["fieldPath"] = f"spec.containers{{{container}}}"
    return ref


async def emit(
    api: KubeClient, involved: dict[str, Any], reason: str, message: str, host: str, warning: bool = False
) -> None:
    """Record an event; a failure to record one is logged, never raised (events are best effort)."""
    type_ = "Warning" if warning else "Normal"
    log.log(
        logging.WARNING if warning else logging.INFO,
        "%s %s/%s: %s",
        reason,
        involved.get("namespace", ""),
        involved["name"],
        message,
    )
    body = event_body(involved, reason, message, type_, host, time.time())
    namespace = body["metadata"]["namespace"]
    try:
        await api.create_path(f"/api/v1/namespaces/{namespace}/events", body)
    except (KubeError, OSError) as error:
        log.warning("could not record event %s: %s", reason, error)
