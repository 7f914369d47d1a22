"""The client Service (in front of the routers) and the headless Service that selects the
workers (per-pod metrics scraping, the StatefulSet's identities)."""

from __future__ import annotations

from strata.operator import names
from strata.operator.plan import ServicePlan
from strata.operator.render.common import Manifest, metadata


def render_client_service(plan: ServicePlan) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(plan, names.client_service_name(plan.name), "api"),
        "spec": {
            "type": "ClusterIP",
            # Clients reach the router, which picks the worker (docs/router.md).
            "selector": names.router_selector_labels(plan.name),
            "ports": [{"name": "http", "port": plan.http_port, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def render_metrics_service(plan: ServicePlan) -> Manifest:
    ports = [{"name": "http", "port": plan.http_port, "targetPort": "http", "protocol": "TCP"}]
    if plan.kv_sidecar:
        ports.append(
            {
                "name": "kv-metrics",
                "port": plan.kv_metrics_port,
                "targetPort": "kv-metrics",
                "protocol": "TCP",
            }
        )
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(plan, names.metrics_service_name(plan.name), "metrics"),
        "spec": {
            "clusterIP": "None",
            "selector": names.selector_labels(plan.name),
            # Scrape pods while they load the model too: startup is when metrics matter most.
            "publishNotReadyAddresses": True,
            "ports": ports,
        },
    }


def endpoint(plan: ServicePlan) -> str:
    return f"http://{names.client_service_name(plan.name)}.{plan.namespace}.svc:{plan.http_port}"
