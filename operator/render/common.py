"""Metadata shared by every child: names, labels, owner reference, byte quantities."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from strata.operator import names
from strata.operator.api.quantity import format_size
from strata.operator.plan import OwnerRef, ServicePlan

Manifest = dict[str, Any]


def bytes_quantity(size: int) -> str:
    """The shortest exact Kubernetes quantity for ``size`` bytes (``64Gi``, ``1536Mi``, ``1000``)."""
    return format_size(size)


def owner_reference(owner: OwnerRef) -> Manifest:
    # controller=true makes the owner the one managing controller; blockOwnerDeletion lets
    # foreground deletion of the InferenceService wait for its children.
    return {
        "apiVersion": owner.api_version,
        "kind": owner.kind,
        "name": owner.name,
        "uid": owner.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def metadata(plan: ServicePlan, name: str, component: str) -> Manifest:
    labels = {**names.common_labels(plan.name, plan.tier), names.LABEL_COMPONENT: component}
    return {
        "name": name,
        "namespace": plan.namespace,
        "labels": labels,
        "ownerReferences": [owner_reference(plan.owner)],
    }


def content_hash(*parts: Any) -> str:
    """A stable short hash of JSON-serialisable parts (pod-template annotations)."""
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]
