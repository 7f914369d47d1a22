"""The corpus of invalid manifests: each a change to a valid object, and the field the error must name.

``offline`` says which offline check must refuse it too: ``model`` (the pydantic models), ``tier``
(``check_against_tier`` against the example tier), or ``none`` (only the API server can tell: a
change of an immutable field needs the old object).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Literal

Kind = Literal["InferenceService", "ServiceTier"]
Offline = Literal["model", "tier", "none"]


class Replace(dict[str, Any]):
    """A change that replaces a mapping instead of merging into it."""


@dataclass(frozen=True)
class Case:
    name: str
    kind: Kind
    change: dict[str, Any]
    field: str
    offline: Offline = "model"
    before: dict[str, Any] | None = None  # create with this first: an update case
    object_name: str | None = None  # metadata.name, when the case is about it


def merged(base: dict[str, Any], change: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``change`` merged in; a None value deletes the key, Replace replaces."""
    out = copy.deepcopy(base)
    for key, value in change.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and not isinstance(value, Replace) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(dict(value) if isinstance(value, Replace) else value)
    return out


def isvc(name: str, change: dict[str, Any], field_: str, offline: Offline = "model") -> Case:
    return Case(name, "InferenceService", change, field_, offline)


def tier(name: str, change: dict[str, Any], field_: str) -> Case:
    return Case(name, "ServiceTier", change, field_)


def src(**source: Any) -> dict[str, Any]:
    return {"model": {"source": Replace(source)}}


CASES: list[Case] = [
    # InferenceService: types, ranges, enums, formats, one-object rules.
    isvc("model-missing", {"model": None}, "spec.model"),
    isvc("model-name-missing", {"model": {"name": None}}, "spec.model.name"),
    isvc("model-name-pattern", {"model": {"name": "-bad name"}}, "spec.model.name"),
    isvc("source-empty", src(), "spec.model.source"),
    isvc("source-two", src(builtin="tiny", uri="s3://bucket/model"), "spec.model.source"),
    isvc("uri-scheme", src(uri="ftp://host/model"), "spec.model.source.uri"),
    isvc("pvc-claim-missing", src(pvc={"path": "models/m"}), "spec.model.source.pvc.claimName"),
    isvc("pvc-path-absolute", src(pvc={"claimName": "models", "path": "/abs"}), "spec.model.source.pvc.path"),
    isvc(
        "pvc-path-parent",
        src(pvc={"claimName": "models", "path": "a/../../etc"}),
        "spec.model.source.pvc.path",
    ),
    isvc("builtin-pattern", src(builtin="Tiny_Model"), "spec.model.source.builtin"),
    isvc("dtype-enum", {"model": {"dtype": "int8"}}, "spec.model.dtype"),
    isvc("context-too-small", {"model": {"maxContextTokens": 8}}, "spec.model.maxContextTokens"),
    isvc("context-type", {"model": {"maxContextTokens": "lots"}}, "spec.model.maxContextTokens"),
    isvc("kv-bytes-zero", {"model": {"kvBytesPerToken": 0}}, "spec.model.kvBytesPerToken"),
    isvc("kv-bytes-in-bits", {"model": {"kvBytesPerToken": 1073741824}}, "spec.model.kvBytesPerToken"),
    isvc("engine-enum", {"engine": {"kind": "sglang"}}, "spec.engine.kind"),
    isvc("vllm-settings-for-torch", {"engine": {"vllm": {"args": []}}}, "spec.engine.vllm"),
    isvc("vllm-owned-flag", {"engine": {"kind": "vllm", "vllm": {"args": ["--port=9000"]}}}, "--port"),
    isvc("vllm-owned-alias", {"engine": {"kind": "vllm", "vllm": {"args": ["-tp", "2"]}}}, "-tp"),
    isvc("vllm-positional", {"engine": {"kind": "vllm", "vllm": {"args": ["org/model"]}}}, "args[0]"),
    isvc(
        "vllm-cpu-block-size",
        {"engine": {"kind": "vllm", "blockSize": 16}, "resources": {"gpus": 0}},
        "spec.engine.blockSize",
    ),
    isvc("block-size-zero", {"engine": {"blockSize": 0}}, "spec.engine.blockSize"),
    isvc("num-seqs-too-many", {"engine": {"maxNumSeqs": 5000}}, "spec.engine.maxNumSeqs"),
    isvc("batched-tokens-small", {"engine": {"maxBatchedTokens": 8}}, "spec.engine.maxBatchedTokens"),
    isvc("gpus-negative", {"resources": {"gpus": -1}}, "spec.resources.gpus"),
    isvc("gpus-too-many", {"resources": {"gpus": 17}}, "spec.resources.gpus"),
    isvc("gpus-type", {"resources": {"gpus": "two"}}, "spec.resources.gpus"),
    isvc("gpu-product-pattern", {"resources": {"gpuProduct": "NVIDIA H100"}}, "spec.resources.gpuProduct"),
    isvc("cpu-format", {"resources": {"cpu": "four"}}, "spec.resources.cpu"),
    isvc("cpu-zero", {"resources": {"cpu": "0"}}, "spec.resources.cpu"),
    isvc("memory-format", {"resources": {"memory": "32GB"}}, "spec.resources.memory"),
    isvc("memory-milli", {"resources": {"memory": "500m"}}, "spec.resources.memory"),
    isvc("memory-negative", {"resources": {"memory": -1}}, "spec.resources.memory"),
    isvc("replicas-negative", {"replicas": -1}, "spec.replicas"),
    isvc("replicas-too-many", {"replicas": 1001}, "spec.replicas"),
    isvc("min-above-max", {"minReplicas": 3, "maxReplicas": 2}, "spec.minReplicas"),
    isvc("max-zero", {"maxReplicas": 0}, "spec.maxReplicas"),
    isvc("autoscaling-enum", {"autoscaling": {"mode": "auto"}}, "spec.autoscaling.mode"),
    isvc("dram-format", {"cache": {"dram": "lots"}}, "spec.cache.dram"),
    isvc("nvme-space", {"cache": {"nvme": "1.5 Gi"}}, "spec.cache.nvme"),
    isvc("nvme-negative", {"cache": {"nvme": -5}}, "spec.cache.nvme"),
    isvc("shared-type", {"cache": {"shared": "yes"}}, "spec.cache.shared"),
    isvc("pinned-empty-prefix", {"cache": {"pinnedPrefixes": [""]}}, "spec.cache.pinnedPrefixes"),
    isvc(
        "pinned-too-many",
        {"cache": {"pinnedPrefixes": [f"p{i}" for i in range(9)]}},
        "spec.cache.pinnedPrefixes",
    ),
    isvc("pod-env-name", {"pod": {"env": [{"name": "1 bad", "value": "x"}]}}, "spec.pod.env"),
    isvc(
        "pod-env-both",
        {
            "pod": {
                "env": [{"name": "A", "value": "x", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]
            }
        },
        "spec.pod.env",
    ),
    isvc("pod-env-ref-empty", {"pod": {"env": [{"name": "A", "valueFrom": {}}]}}, "spec.pod.env"),
    isvc(
        "pod-env-too-many",
        {"pod": {"env": [{"name": f"V{i}", "value": "x"} for i in range(65)]}},
        "spec.pod.env",
    ),
    isvc("pod-env-from-empty", {"pod": {"envFrom": [{"prefix": "X_"}]}}, "spec.pod.envFrom"),
    isvc(
        "pod-pull-secret-name",
        {"pod": {"imagePullSecrets": [{"name": "Bad_Name"}]}},
        "spec.pod.imagePullSecrets",
    ),
    isvc("pod-service-account", {"pod": {"serviceAccountName": "Not A Name"}}, "spec.pod.serviceAccountName"),
    isvc("pod-label-owned", {"pod": {"labels": {"app.kubernetes.io/name": "x"}}}, "spec.pod.labels"),
    isvc("pod-label-value", {"pod": {"labels": {"team": "has space"}}}, "spec.pod.labels"),
    isvc("pod-selector-key", {"pod": {"nodeSelector": {"bad key!": "x"}}}, "spec.pod.nodeSelector"),
    isvc("pod-affinity-key", {"pod": {"affinity": {"nodeAfinity": {}}}}, "spec.pod.affinity.nodeAfinity"),
    isvc(
        "pod-toleration-effect",
        {"pod": {"tolerations": [{"key": "a", "effect": "Never"}]}},
        "spec.pod.tolerations",
    ),
    isvc("pod-unknown-field", {"pod": {"hostNetwork": True}}, "spec.pod.hostNetwork"),
    isvc("tier-name", {"tier": "Premium_Tier"}, "spec.tier"),
    isvc("unknown-field", {"gpu": 1}, "spec.gpu"),
    Case("name-too-long", "InferenceService", {}, "metadata.name", object_name="a" * 53),
    Case("name-starts-with-digit", "InferenceService", {}, "metadata.name", object_name="1chat"),
    # InferenceService: over the limits of its tier (the ValidatingAdmissionPolicy).
    isvc("dram-over-tier", {"cache": {"dram": "100Gi"}}, "spec.cache.dram", "tier"),
    isvc("dram-over-tier-bytes", {"cache": {"dram": 68719476737}}, "spec.cache.dram", "tier"),
    isvc("nvme-over-tier", {"cache": {"nvme": "600Gi"}}, "spec.cache.nvme", "tier"),
    isvc("shared-not-in-tier", {"cache": {"shared": True}}, "spec.cache.shared", "tier"),
    isvc("gpus-over-tier", {"resources": {"gpus": 9}}, "spec.resources.gpus", "tier"),
    isvc("gpus-per-service", {"resources": {"gpus": 8}, "maxReplicas": 9}, "spec.maxReplicas", "tier"),
    isvc("max-over-tier", {"maxReplicas": 17}, "spec.maxReplicas", "tier"),
    isvc("zero-not-in-tier", {"minReplicas": 0}, "spec.minReplicas", "tier"),
    # ServiceTier.
    tier("ttft-zero", {"slo": {"ttftP95Ms": 0}}, "spec.slo.ttftP95Ms"),
    tier("itl-type", {"slo": {"interTokenLatencyP95Ms": "fast"}}, "spec.slo.interTokenLatencyP95Ms"),
    tier("kv-fraction-zero", {"cache": {"hbm": {"kvFraction": 0}}}, "spec.cache.hbm.kvFraction"),
    tier("kv-fraction-above-one", {"cache": {"hbm": {"kvFraction": 1.5}}}, "spec.cache.hbm.kvFraction"),
    tier(
        "dram-default-above-max", {"cache": {"dram": {"defaultSize": "65Gi"}}}, "spec.cache.dram.defaultSize"
    ),
    tier(
        "nvme-default-above-max", {"cache": {"nvme": {"defaultSize": "2Ti"}}}, "spec.cache.nvme.defaultSize"
    ),
    tier("nvme-max-format", {"cache": {"nvme": {"maxSize": "1TB"}}}, "spec.cache.nvme.maxSize"),
    tier("eviction-enum", {"cache": {"dram": {"eviction": "fifo"}}}, "spec.cache.dram.eviction"),
    tier("admission-enum", {"cache": {"nvme": {"admission": "never"}}}, "spec.cache.nvme.admission"),
    tier("write-mode-enum", {"cache": {"writeMode": "write-around"}}, "spec.cache.writeMode"),
    tier("retention-zero", {"cache": {"retentionSeconds": 0}}, "spec.cache.retentionSeconds"),
    tier(
        "storage-class-pattern",
        {"cache": {"nvme": {"storageClassName": "Fast_SSD"}}},
        "spec.cache.nvme.storageClassName",
    ),
    tier("replicas-min-above-max", {"autoscaling": {"minReplicas": 20}}, "spec.autoscaling.minReplicas"),
    tier("zero-without-scale-to-zero", {"autoscaling": {"minReplicas": 0}}, "spec.autoscaling.minReplicas"),
    tier("tolerance-one", {"autoscaling": {"tolerance": 1}}, "spec.autoscaling.tolerance"),
    tier("target-zero", {"autoscaling": {"targetKvCacheUsage": 0}}, "spec.autoscaling.targetKvCacheUsage"),
    tier("step-zero", {"autoscaling": {"maxScaleUpStep": 0}}, "spec.autoscaling.maxScaleUpStep"),
    tier(
        "gpus-replica-above-service",
        {"limits": {"maxGpusPerReplica": 8, "maxGpusPerService": 4}},
        "spec.limits.maxGpusPerReplica",
    ),
    tier("priority-too-high", {"priority": 2000000000}, "spec.priority"),
    tier("unknown-field", {"gold": True}, "spec.gold"),
    Case("name-too-long", "ServiceTier", {}, "metadata.name", object_name="t" * 64),
    Case("name-with-dot", "ServiceTier", {}, "metadata.name", object_name="gold.tier"),
    # Changes to immutable fields: only the API server, which sees the old object, can refuse them.
    Case(
        "model-name-changed",
        "InferenceService",
        {"model": {"name": "other"}},
        "spec.model.name",
        "none",
        before={},
    ),
    Case(
        "nvme-changed",
        "InferenceService",
        {"cache": {"nvme": "200Gi"}},
        "spec.cache.nvme",
        "none",
        {"cache": {"nvme": "100Gi"}},
    ),
    Case(
        "nvme-added", "InferenceService", {"cache": {"nvme": "100Gi"}}, "spec.cache.nvme", "none", before={}
    ),
    Case(
        "storage-class-changed",
        "ServiceTier",
        {"cache": {"nvme": {"storageClassName": "other"}}},
        "spec.cache.nvme.storageClassName",
        "none",
        before={"cache": {"nvme": {"storageClassName": "local-nvme"}}},
    ),
]
