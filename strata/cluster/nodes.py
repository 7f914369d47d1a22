"""Fake GPU nodes: Node objects that KWOK (or the local pod runtime) keeps alive and the real
scheduler places pods on.

The labels follow what real clusters carry (NVIDIA GPU feature discovery's ``nvidia.com/gpu.*``,
the well-known ``topology.kubernetes.io/*``), plus Strata's own local-NVMe labels, so the
operator's placement logic is tested against the same keys it meets in production.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

KWOK_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_ANNOTATION_VALUE = "fake"
GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
LOCAL_NVME_LABEL = "strata.dev/local-nvme"
LOCAL_NVME_GIB_LABEL = "strata.dev/local-nvme-gib"
# Nodes with this label are run by the local pod runtime (strata.cluster.podruntime), not KWOK.
POD_RUNTIME_LABEL = "strata.dev/pod-runtime"
POD_RUNTIME_LOCAL = "local"
# What a local node says its GPUs are: the engine of a pod there runs on the CPU, and a service
# (resources.gpuProduct) or a pod (nodeSelector) naming it lands on local nodes only.
LOCAL_GPU_PRODUCT = "Strata-Local-CPU"
# Local nodes are tainted, so only pods that ask to run for real (tolerate it) land there; the
# rest of a test suite keeps KWOK's instant, pretend pods.
LOCAL_TAINT = {"key": POD_RUNTIME_LABEL, "value": POD_RUNTIME_LOCAL, "effect": "NoSchedule"}
LOCAL_TOLERATION = {
    "key": POD_RUNTIME_LABEL,
    "operator": "Equal",
    "value": POD_RUNTIME_LOCAL,
    "effect": "NoSchedule",
}
# Every node's InternalIP: whatever dials a node (the API server for `kubectl logs`) dials this
# address, never the node's name, which only the machine's DNS resolver could answer.
NODE_IP = "127.0.0.1"
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


def local_node_shape() -> GpuNodeShape:
    """The default shape of a local node: a GPU server whose "GPU" is this machine's CPU."""
    return GpuNodeShape(gpu_product=LOCAL_GPU_PRODUCT)


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


def _labels(name: str, index: int, shape: GpuNodeShape, kind: str) -> dict[str, str]:
    return {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": f"gpu-{shape.gpus}x",
        "type": kind,
        ZONE_LABEL: shape.zones[index % len(shape.zones)],
        REGION_LABEL: shape.region,
        GPU_PRODUCT_LABEL: shape.gpu_product,
        GPU_COUNT_LABEL: str(shape.gpus),
        GPU_MEMORY_LABEL: str(shape.gpu_memory_mib),
        LOCAL_NVME_LABEL: "true" if shape.local_nvme_gib > 0 else "false",
        LOCAL_NVME_GIB_LABEL: str(shape.local_nvme_gib),
    }


def _node(
    metadata: dict[str, Any], pod_cidr: str, capacity: dict[str, str], allocatable: dict[str, str]
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": metadata,
        "spec": {"podCIDR": pod_cidr, "podCIDRs": [pod_cidr]},
        "status": {
            "capacity": capacity,
            "allocatable": allocatable,
            "addresses": node_addresses(metadata["name"]),
        },
    }


def node_addresses(name: str) -> list[dict[str, str]]:
    return [{"type": "InternalIP", "address": NODE_IP}, {"type": "Hostname", "address": name}]


def gpu_node_manifest(name: str, index: int, shape: GpuNodeShape, pod_cidr: str) -> dict[str, Any]:
    """The Node object for KWOK node number ``index`` (zones are assigned round-robin); its pods
    get addresses from ``pod_cidr``, as a CNI would assign them from the node's range."""
    metadata = {
        "name": name,
        "labels": _labels(name, index, shape, "kwok"),
        "annotations": {KWOK_ANNOTATION: KWOK_ANNOTATION_VALUE},
    }
    return _node(metadata, pod_cidr, _resources(shape, reserved=False), _resources(shape, reserved=True))


def local_node_manifest(
    name: str, index: int, shape: GpuNodeShape, pod_cidr: str, cpu: str, memory: str
) -> dict[str, Any]:
    """A node whose pods the local pod runtime runs as processes on this machine: no KWOK
    annotation, the runtime's label and taint (pods opt in with ``LOCAL_TOLERATION``), and the
    CPU and memory the machine can really give (the GPUs stay fake: the engine runs on the CPU)."""
    labels = {**_labels(name, index, shape, "local"), POD_RUNTIME_LABEL: POD_RUNTIME_LOCAL}
    resources = {**_resources(shape, reserved=False), "cpu": cpu, "memory": memory}
    node = _node({"name": name, "labels": labels}, pod_cidr, resources, dict(resources))
    node["spec"]["taints"] = [dict(LOCAL_TAINT)]
    return node


# The Ready reason a local node reports when the pod runtime cannot run pods here (no mount
# namespaces): waiting does not change it.
NODE_UNAVAILABLE = "PodRuntimeUnavailable"


def _ready_condition(node: dict[str, Any]) -> dict[str, Any]:
    conditions = (node.get("status") or {}).get("conditions") or []
    return next((dict(c) for c in conditions if c.get("type") == "Ready"), {})


def node_ready(node: dict[str, Any]) -> bool:
    return _ready_condition(node).get("status") == "True"


def node_problem(node: dict[str, Any]) -> str | None:
    """Why the node will not become Ready by waiting; None while it may."""
    ready = _ready_condition(node)
    if ready.get("status") == "False" and ready.get("reason") == NODE_UNAVAILABLE:
        return f"{ready['reason']}: {ready.get('message', '')}"
    return None


def machine_cpus() -> int:
    """The CPUs this process may run on (the affinity mask, not the host's core count)."""
    return len(os.sched_getaffinity(0))


def machine_memory() -> str:
    """The machine's memory as a quantity (MemTotal, in Mi)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return f"{int(line.split()[1]) // 1024}Mi"
    raise RuntimeError("/proc/meminfo: no MemTotal line")
