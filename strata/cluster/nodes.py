"""Fake GPU nodes: Node objects that KWOK keeps alive and the real scheduler places pods on.

The labels follow what real clusters carry (NVIDIA GPU feature discovery's ``nvidia.com/gpu.*``,
the well-known ``topology.kubernetes.io/*``), plus Strata's own local-NVMe labels, so the
operator's placement logic is tested against the same keys it meets in production.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

KWOK_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_ANNOTATION_VALUE = "fake"
GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
LOCAL_NVME_LABEL = "strata.dev/local-nvme"
LOCAL_NVME_GIB_LABEL = "strata.dev/local-nvme-gib"
ZONE_LABEL = "topology.kubernetes.io/zone"
REGION_LABEL = "topology.kubernetes.io/region"


@dataclass(frozen=True)
class GpuNodeShape:
    """What one fake node offers. The default is an 8 x H100 80GB server (p5/ND H100 v5 class)."""

    gpus: int = 8
    gpu_product: str = "NVIDIA-H100-80GB-HBM3"
    gpu_memory_mib: int = 81559
    cpu: int = 192
    memory_gib: int = 2048
    pods: int = 110
    local_nvme_gib: int = 3500
    zones: tuple[str, ...] = ("zone-a", "zone-b")
    region: str = "local"

    def __post_init__(self) -> None:
        for name in ("gpus", "cpu", "memory_gib", "pods", "local_nvme_gib"):
            if getattr(self, name) < 0:
                raise ValueError(f"GpuNodeShape.{name}: must be >= 0, got {getattr(self, name)}")
        if not self.zones:
            raise ValueError("GpuNodeShape.zones: needs at least one zone")


def node_name(prefix: str, index: int) -> str:
    return f"{prefix}-{index}"


def _resources(shape: GpuNodeShape, reserved: bool) -> dict[str, str]:
    # Allocatable keeps back what a kubelet reserves for the system, so requests sized to
    # "exactly the capacity" fail here as they would on a real node.
    cpu_reserved, memory_reserved_gib = (2, 16) if reserved else (0, 0)
    return {
        "cpu": str(max(shape.cpu - cpu_reserved, 0)),
        "memory": f"{max(shape.memory_gib - memory_reserved_gib, 0)}Gi",
        "pods": str(shape.pods),
        "ephemeral-storage": f"{shape.local_nvme_gib}Gi",
        GPU_RESOURCE: str(shape.gpus),
    }


def gpu_node_manifest(name: str, index: int, shape: GpuNodeShape) -> dict[str, Any]:
    """The Node object for fake node number ``index`` (zones are assigned round-robin)."""
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": f"gpu-{shape.gpus}x",
        "type": "kwok",
        ZONE_LABEL: shape.zones[index % len(shape.zones)],
        REGION_LABEL: shape.region,
        GPU_PRODUCT_LABEL: shape.gpu_product,
        GPU_COUNT_LABEL: str(shape.gpus),
        GPU_MEMORY_LABEL: str(shape.gpu_memory_mib),
        LOCAL_NVME_LABEL: "true" if shape.local_nvme_gib > 0 else "false",
        LOCAL_NVME_GIB_LABEL: str(shape.local_nvme_gib),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": {KWOK_ANNOTATION: KWOK_ANNOTATION_VALUE}},
        "spec": {},
        "status": {
            "capacity": _resources(shape, reserved=False),
            "allocatable": _resources(shape, reserved=True),
        },
    }


def gpu_nodes_manifest(prefix: str, start: int, count: int, shape: GpuNodeShape) -> dict[str, Any]:
    """A v1 List of ``count`` nodes numbered from ``start``, ready for ``kubectl create -f -``."""
    if count < 0:
        raise ValueError(f"count: must be >= 0, got {count}")
    items = [gpu_node_manifest(node_name(prefix, i), i, shape) for i in range(start, start + count)]
    return {"apiVersion": "v1", "kind": "List", "items": items}
