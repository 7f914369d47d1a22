"""The service's NetworkPolicies: its workers take traffic only from its own routers; its routers
take any client on their serving port.

A tenant in another namespace (or another service of the same namespace) reaches the model only
through the routers, where the API key is checked and requests queue by priority. The metrics
ports are open to the namespaces the operator names (its own, for the autoscaler's scrapes, and
Prometheus's). Only ingress is restricted: workers fetch models and routers watch the API.
Enforced by the cluster's network plugin; without one that implements NetworkPolicy they are
inert objects."""

from __future__ import annotations

from strata.operator import names
from strata.operator.plan import ServicePlan
from strata.operator.render.common import Manifest, metadata
from strata.operator.settings import OperatorSettings

NETWORKING_API = "networking.k8s.io/v1"
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"  # set by the API server on every namespace


def render_network_policies(plan: ServicePlan, settings: OperatorSettings) -> list[Manifest]:
    """The workers' policy and the routers', or none where the operator setting turns them off."""
    if not settings.network_policy:
        return []
    return [render_worker_policy(plan, settings), render_router_policy(plan)]


def render_worker_policy(plan: ServicePlan, settings: OperatorSettings) -> Manifest:
    ingress = [
        {
            "from": [{"podSelector": {"matchLabels": names.router_selector_labels(plan.name)}}],
            "ports": worker_ports(plan),
        }
    ]
    if settings.metrics_namespaces:
        ingress.append({"from": [namespaces_peer(settings.metrics_namespaces)], "ports": worker_ports(plan)})
    return _policy(plan, names.workload_name(plan.name), "worker", names.selector_labels(plan.name), ingress)


def render_router_policy(plan: ServicePlan) -> Manifest:
    ingress = [{"ports": [_tcp(plan.router.port)]}]  # no "from": any client, any namespace
    selector = names.router_selector_labels(plan.name)
    return _policy(plan, names.router_name(plan.name), "router", selector, ingress)


def worker_ports(plan: ServicePlan) -> list[Manifest]:
    """The engine's API and metrics port, and the sidecar's (block events and look-ahead for the
    routers, metrics for the scrapers) where the pod has one."""
    ports = [_tcp(plan.http_port)]
    if plan.kv_sidecar:
        ports.append(_tcp(plan.kv_metrics_port))
    return ports


def namespaces_peer(namespaces: tuple[str, ...]) -> Manifest:
    expression = {"key": NAMESPACE_NAME_LABEL, "operator": "In", "values": sorted(namespaces)}
    return {"namespaceSelector": {"matchExpressions": [expression]}}


def _tcp(port: int) -> Manifest:
    return {"protocol": "TCP", "port": port}


def _policy(
    plan: ServicePlan, name: str, component: str, selector: dict[str, str], ingress: list[Manifest]
) -> Manifest:
    return {
        "apiVersion": NETWORKING_API,
        "kind": "NetworkPolicy",
        "metadata": metadata(plan, name, f"{component}-network-policy"),
        "spec": {"podSelector": {"matchLabels": selector}, "policyTypes": ["Ingress"], "ingress": ingress},
    }
