"""The shared-storage KV tier's ReadWriteMany claim, one per service, owned by the service."""

from __future__ import annotations

from strata.operator.plan import ServicePlan
from strata.operator.render.common import Manifest, bytes_quantity, metadata


def render_shared_claim(plan: ServicePlan) -> Manifest | None:
    if plan.shared is None:
        return None
    spec: Manifest = {
        "accessModes": ["ReadWriteMany"],
        "resources": {"requests": {"storage": bytes_quantity(plan.shared.size_bytes)}},
    }
    if plan.shared.storage_class:
        spec["storageClassName"] = plan.shared.storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": metadata(plan, plan.shared.claim_name, "kv-shared"),
        "spec": spec,
    }
