"""Bodies of InferenceServices and ServiceTiers as the API server returns them (defaults filled)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from strata.operator.api import InferenceService, ServiceTier, to_manifest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NS_UID = "0b5e7c1e-1111-4222-8333-444455556666"


def tier_body(name: str = "standard", **spec_overrides: Any) -> dict[str, Any]:
    raw = yaml.safe_load((EXAMPLES / "servicetiers" / f"{name}.yaml").read_text())
    _merge(raw["spec"], spec_overrides)
    body = to_manifest(ServiceTier.model_validate(raw))
    body["metadata"] = {"name": name, "uid": f"tier-uid-{name}", "generation": 1}
    return body


def isvc_body(name: str = "chat", namespace: str = "team-a", **spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "tier": "standard",
        "model": {"name": "tiny", "source": {"builtin": "tiny"}},
        "resources": {"gpus": 1, "gpuProduct": "NVIDIA-H100-80GB-HBM3", "cpu": "4", "memory": "32Gi"},
    }
    _merge(base, spec)
    raw = {"apiVersion": "strata.dev/v1alpha1", "kind": "InferenceService", "metadata": {}, "spec": base}
    body = to_manifest(InferenceService.model_validate(raw))
    body["metadata"] = {"name": name, "namespace": namespace, "uid": f"uid-{name}", "generation": 1}
    return body


def _merge(into: dict[str, Any], overrides: dict[str, Any]) -> None:
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict) and key != "source":
            _merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)
