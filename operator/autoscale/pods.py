"""A service's worker pods as the autoscaler sees them: listed by the service's selector, ready
or not, and the URL of a port's metrics on the pod IP."""

from __future__ import annotations

from strata.operator import names
from strata.operator.kube import MERGE_PATCH as MERGE_PATCH
from strata.operator.kube import KubeClient, Obj
from strata.operator.views import ready_pod


async def list_pods(kube: KubeClient, namespace: str, name: str) -> list[Obj]:
    selector = names.label_selector(names.selector_labels(name))
    listed = await kube.request(
        "GET", f"/api/v1/namespaces/{namespace}/pods", params={"labelSelector": selector}
    )
    return list(listed.get("items", []))


def ready(pod: Obj) -> bool:
    """Ready, with an IP, and not terminating."""
    return ready_pod(pod) is not None


def metrics_url(ip: str, port: int) -> str:
    host = f"[{ip}]" if ":" in ip else ip
    return f"http://{host}:{port}/metrics"
