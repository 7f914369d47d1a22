"""Simulated volume provisioning: StorageClasses whose claims KWOK provisions and binds.

Without a provisioner, every PersistentVolumeClaim stays Pending and so do the pods using it;
the operator renders claims (the shared-storage tier, StatefulSet claim templates for NVMe).
KWOK's volume stages (kwok-stages.yaml) act for every class with ``PROVISIONER``.
"""

from __future__ import annotations

from typing import Any, Literal

PROVISIONER = "kwok.x-k8s.io/volume"
DEFAULT_STORAGE_CLASS = "standard"

BindingMode = Literal["Immediate", "WaitForFirstConsumer"]


def storage_class_manifest(
    name: str, default: bool = False, binding_mode: BindingMode = "Immediate"
) -> dict[str, Any]:
    """A StorageClass KWOK provisions for; ``default`` makes claims without a class use it."""
    annotations = {"storageclass.kubernetes.io/is-default-class": "true"} if default else {}
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": name, "annotations": annotations},
        "provisioner": PROVISIONER,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": binding_mode,
        "allowVolumeExpansion": True,
    }
