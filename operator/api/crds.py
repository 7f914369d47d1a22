"""The two CustomResourceDefinitions, built from the models.

Names, scopes, subresources and printer columns are the API's public face (``kubectl get``,
``kubectl explain``, ``kubectl scale``); the schemas come from ``schema.structural_schema``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from strata.operator.api.base import DNS_1035_LABEL, DNS_LABEL
from strata.operator.api.cel import rule
from strata.operator.api.models import (
    GROUP,
    SERVICE_NAME_MAX,
    TIER_NAME_MAX,
    VERSION,
    InferenceServiceSpec,
    InferenceServiceStatus,
    ServiceTierSpec,
    ServiceTierStatus,
)
from strata.operator.api.schema import filled_default, structural_schema

JsonDict = dict[str, Any]

CATEGORY = "strata"
LABELS = {"app.kubernetes.io/name": "strata", "app.kubernetes.io/part-of": "strata"}


def _name_rule(pattern: str, max_length: int, why: str) -> JsonDict:
    return rule(
        f"self.metadata.name.size() <= {max_length} && self.metadata.name.matches('{pattern}')",
        f"metadata.name must match {pattern} and have at most {max_length} characters: {why}",
    )


def _object_schema(
    description: str, spec: type[BaseModel], status: type[BaseModel], spec_required: bool, name_rule: JsonDict
) -> JsonDict:
    spec_schema = structural_schema(spec)
    if not spec_required:
        spec_schema["default"] = filled_default(spec_schema)
    status_schema = structural_schema(status)
    status_schema["description"] = "Observed state, written by the operator through the status subresource."
    schema: JsonDict = {
        "type": "object",
        "description": description,
        "properties": {
            "apiVersion": {
                "type": "string",
                "description": "APIVersion of this object: strata.dev/v1alpha1.",
            },
            "kind": {"type": "string", "description": "Kind of this object."},
            "metadata": {"type": "object"},
            "spec": spec_schema,
            "status": status_schema,
        },
        "x-kubernetes-validations": [name_rule],
    }
    if spec_required:
        schema["required"] = ["spec"]
    return schema


def _crd(kind: str, plural: str, short_name: str, scope: str, version: JsonDict) -> JsonDict:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}", "labels": dict(LABELS)},
        "spec": {
            "group": GROUP,
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": [short_name],
                "categories": [CATEGORY],
            },
            "scope": scope,
            "versions": [{"name": VERSION, "served": True, "storage": True, **version}],
        },
    }


def _column(name: str, type_: str, path: str, description: str, priority: int = 0) -> JsonDict:
    column: JsonDict = {"name": name, "type": type_, "jsonPath": path, "description": description}
    if priority:
        column["priority"] = priority
    return column


def inference_service_crd() -> JsonDict:
    schema = _object_schema(
        "InferenceService: an LLM served by GPU worker pods with a tiered KV cache "
        "(HBM, host DRAM, local NVMe, shared storage).",
        InferenceServiceSpec,
        InferenceServiceStatus,
        spec_required=True,
        name_rule=_name_rule(
            DNS_1035_LABEL, SERVICE_NAME_MAX, "it names the service's Service and StatefulSet"
        ),
    )
    columns = [
        _column("Tier", "string", ".spec.tier", "ServiceTier of the service."),
        _column("Model", "string", ".spec.model.name", "Served model name."),
        _column("Ready", "integer", ".status.readyReplicas", "Ready worker pods."),
        _column("Desired", "integer", ".status.desiredReplicas", "Replicas the operator converges to."),
        _column("KV", "number", ".status.signals.kvCacheUsage", "HBM KV-cache usage (0..1)."),
        _column("TTFT-P95-MS", "number", ".status.signals.ttftP95Ms", "Time to first token, p95 (ms)."),
        _column("Age", "date", ".metadata.creationTimestamp", "Time since creation."),
        _column("Endpoint", "string", ".status.endpoint", "In-cluster URL of the API.", priority=1),
        # -o wide: what limits the service, and the numbers behind the verdict.
        _column(
            "Bottleneck", "string", ".status.bottleneck.verdict", "What limits the service now.", priority=1
        ),
        _column("Busy", "number", ".status.bottleneck.engineBusy", "Engine busy share (0..1).", priority=1),
        _column(
            "Tier-Wait",
            "number",
            ".status.bottleneck.tierWaitShare",
            "Step time waiting on tiers (0..1).",
            priority=1,
        ),
    ]
    version = {
        "schema": {"openAPIV3Schema": schema},
        "subresources": {
            "status": {},
            "scale": {
                "specReplicasPath": ".spec.replicas",
                "statusReplicasPath": ".status.replicas",
                "labelSelectorPath": ".status.selector",
            },
        },
        "additionalPrinterColumns": columns,
    }
    return _crd("InferenceService", "inferenceservices", "infsvc", "Namespaced", version)


def service_tier_crd() -> JsonDict:
    schema = _object_schema(
        "ServiceTier: a tier of service (priority, latency SLOs, KV-cache policy per memory tier, "
        "autoscaling policy, limits) that InferenceServices name in spec.tier.",
        ServiceTierSpec,
        ServiceTierStatus,
        spec_required=False,
        name_rule=_name_rule(DNS_LABEL, TIER_NAME_MAX, "it becomes a label value and a PriorityClass name"),
    )
    columns = [
        _column("Priority", "integer", ".spec.priority", "Value of the tier's PriorityClass."),
        _column("TTFT-P95-MS", "integer", ".spec.slo.ttftP95Ms", "Target time to first token, p95 (ms)."),
        _column(
            "ITL-P95-MS", "integer", ".spec.slo.interTokenLatencyP95Ms", "Target inter-token latency, p95."
        ),
        _column("DRAM-Max", "string", ".spec.cache.dram.maxSize", "Largest DRAM tier per replica."),
        _column("NVMe-Max", "string", ".spec.cache.nvme.maxSize", "Largest NVMe tier per replica."),
        _column("Services", "integer", ".status.services", "InferenceServices using the tier."),
        # -o wide: what the tier's services held, cumulated (docs/operator.md, cost per tenant and tier).
        _column(
            "GPU-Seconds", "number", ".status.usage.gpuSeconds", "GPU-seconds held, cumulated.", priority=1
        ),
        _column("Usage-Since", "date", ".status.usage.since", "When usage accounting started.", priority=1),
        _column("Age", "date", ".metadata.creationTimestamp", "Time since creation."),
    ]
    version = {
        "schema": {"openAPIV3Schema": schema},
        "subresources": {"status": {}},
        "additionalPrinterColumns": columns,
    }
    return _crd("ServiceTier", "servicetiers", "stier", "Cluster", version)
