"""The PodDisruptionBudget: voluntary disruptions (drains) keep the service's minimum up."""

from __future__ import annotations

from strata.operator import names
from strata.operator.plan import ServicePlan
from strata.operator.render.common import Manifest, metadata


def max_unavailable(replicas: int, min_replicas: int) -> int:
    """Drains may take replicas down to the minimum, but always at least one at a time: a
    single-replica service must not block node maintenance forever."""
    return max(1, replicas - min_replicas)


def render_pdb(plan: ServicePlan) -> Manifest:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata(plan, names.pdb_name(plan.name), "disruption-budget"),
        "spec": {
            "maxUnavailable": max_unavailable(plan.replicas, plan.min_replicas),
            "selector": {"matchLabels": names.selector_labels(plan.name)},
            # A crash-looping pod is not serving; evicting it cannot hurt the service.
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }
