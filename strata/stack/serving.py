"""A service on the test control plane as its clients and its operator see it: the URL of a ready
router pod (clients reach a router by its pod IP: there is no Service traffic here), its worker
pods, what each worker's own metrics say, and the deletion cost the autoscaler gave each pod.

For the closed-loop tests and the demo's scaling act; pod IPs are loopback addresses of the
cluster's own range, so everything here stays on 127.0.0.0/8."""

from __future__ import annotations

import ipaddress
import urllib.request
from typing import Any

from strata.cluster.cluster import Cluster
from strata.cluster.podstate import classify
from strata.cluster.podwait import raise_if_stuck
from strata.common.endpoints import ROUTER_PORT, WORKER_PORT
from strata.operator import names
from strata.operator.autoscale.cachevalue import DELETION_COST
from strata.operator.autoscale.metrics import MetricsError, PodSample, parse_exposition
from strata.stack.kube import live_pods, running_pods
from strata.stack.wait import wait_for

Pod = dict[str, Any]


def loopback_ip(pod: Pod) -> str:
    """The pod's IP, refused unless it is a loopback address (nothing here dials anything else)."""
    ip = str(pod["status"]["podIP"])
    if not ipaddress.ip_address(ip).is_loopback:
        raise ValueError(f"pod {pod['metadata']['name']}: IP {ip} is outside 127.0.0.0/8; not dialing it")
    return ip


def ready_pod(pod: Pod) -> bool:
    return classify(pod).phase == "ready"


def router_url(cluster: Cluster, namespace: str, service: str) -> str | None:
    """The OpenAI base URL of a ready router pod of ``service`` that answers; None while none
    does. (A router scheduled onto a KWOK node is Ready but nothing listens at its IP.)"""
    routers = running_pods(cluster, namespace, service, names.router_selector_labels(service))
    for pod in sorted((p for p in routers if ready_pod(p)), key=lambda p: p["metadata"]["name"]):
        base = f"http://{loopback_ip(pod)}:{ROUTER_PORT}"
        if _answers(base + "/health"):
            return base + "/v1"
    return None


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return bool(reply.status == 200)
    except OSError:
        return False


def worker_pods(cluster: Cluster, namespace: str, service: str) -> list[Pod]:
    """The service's worker pods that run and are not being deleted, by name."""
    return sorted(running_pods(cluster, namespace, service), key=lambda p: p["metadata"]["name"])


def pod_sample(pod: Pod, timeout_s: float = 10.0) -> PodSample | None:
    """The worker's own /metrics, parsed as the autoscaler parses them; None if it does not answer."""
    url = f"http://{loopback_ip(pod)}:{WORKER_PORT}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as reply:
            return parse_exposition(reply.read().decode())
    except (OSError, MetricsError):
        return None


def deletion_cost(pod: Pod) -> int | None:
    """The ``pod-deletion-cost`` the autoscaler set before a scale-down; None if unset."""
    value = (pod["metadata"].get("annotations") or {}).get(DELETION_COST)
    return int(value) if value is not None else None


def ready_worker_pods(
    cluster: Cluster, namespace: str, service: str, count: int, timeout_s: float
) -> list[Pod]:
    """``count`` Ready worker pods of ``service``, by name; ``podwait.PodStuck`` at once, naming
    the container and its error, when one of them cannot start (not after ``timeout_s``)."""

    def ready() -> list[Pod] | None:
        pods = live_pods(cluster, namespace, names.selector_labels(service))
        raise_if_stuck(cluster, pods)
        up = sorted((p for p in pods if ready_pod(p)), key=lambda p: p["metadata"]["name"])
        return up if len(up) >= count else None

    return wait_for(ready, timeout_s, what=f"{count} Ready pods of {namespace}/{service}", interval_s=2)
