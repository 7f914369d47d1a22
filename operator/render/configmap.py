"""The ConfigMap holding the worker's own config file (``strata.worker.config.WorkerConfig``) and
the router's (``strata.router.config.RouterConfig``)."""

from __future__ import annotations

from strata.operator import names
from strata.operator.plan import ServicePlan
from strata.operator.render.common import Manifest, content_hash, metadata


def render_configmap(plan: ServicePlan) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(plan, names.configmap_name(plan.name), "config"),
        "data": {names.CONFIG_FILE: plan.worker.to_yaml(), names.ROUTER_CONFIG_FILE: plan.router.to_yaml()},
    }


def config_hash(plan: ServicePlan) -> str:
    """Changes whenever the rendered config does, so the pod template changes and pods roll:
    a ConfigMap edit alone never restarts the pods that mounted it."""
    return content_hash(plan.worker.to_yaml())
