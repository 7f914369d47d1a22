"""Manifests the tests, the benchmark and examples create: a small valid InferenceService."""

from __future__ import annotations

from typing import Any

from strata.cluster.nodes import GpuNodeShape
from strata.common.apigroup import API_VERSION
from strata.operator.api.models import DEFAULT_TIER

GPU_PRODUCT = GpuNodeShape().gpu_product  # what strata.cluster's default fake GPU nodes carry


def inference_service(name: str, tier: str = DEFAULT_TIER, **spec: Any) -> dict[str, Any]:
    """The ``tiny`` builtin model on one GPU; ``spec`` keys replace the defaults' top-level keys."""
    return {
        "apiVersion": API_VERSION,
        "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": {
            "tier": tier,
            "model": {"name": "tiny", "source": {"builtin": "tiny"}},
            "resources": {"gpus": 1, "gpuProduct": GPU_PRODUCT, "cpu": "1", "memory": "4Gi"},
            "cache": {"dram": "1Gi", "nvme": "10Gi"},
            **spec,
        },
    }
