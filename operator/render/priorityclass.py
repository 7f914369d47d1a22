"""One PriorityClass per ServiceTier, owned by the (cluster-scoped) tier."""

from __future__ import annotations

from strata.operator import names
from strata.operator.plan import OwnerRef
from strata.operator.render.common import Manifest, owner_reference


def render_priorityclass(tier: str, value: int, owner: OwnerRef, description: str = "") -> Manifest:
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {
            "name": names.priority_class_name(tier),
            "labels": {names.LABEL_MANAGED_BY: names.MANAGED_BY, names.LABEL_TIER: tier},
            "ownerReferences": [owner_reference(owner)],
        },
        "value": value,
        "globalDefault": False,
        # Lower tiers must never evict running higher-tier pods by accident of ordering; they
        # wait instead. Preemption stays on so a premium pod can displace batch pods.
        "preemptionPolicy": "PreemptLowerPriority",
        "description": description or f"Strata ServiceTier {tier}",
    }
