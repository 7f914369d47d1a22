"""The Strata API (group ``strata.dev``, version ``v1alpha1``): InferenceService and ServiceTier.

These pydantic models are the single source of truth. The CRDs in crds/ are generated from them
(``strata crds generate``); the operator parses the objects it watches with them. Field names are
snake_case here and camelCase on the wire (``model_dump(by_alias=True)``, or :func:`to_manifest`).

Rules checkable inside one object live twice, on purpose: as CEL in the schema (the API server
enforces them for every client) and as pydantic validators (the operator and tests enforce them
offline). Rules across objects (a service must fit its tier) are in ``tierlimits``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from strata.common.apigroup import API_VERSION as API_VERSION
from strata.common.apigroup import GROUP as GROUP
from strata.common.apigroup import VERSION as VERSION
from strata.common.hold import HOLD_MAX_REQUESTS, HOLD_TIMEOUT_S
from strata.operator.api.base import DNS_1035_LABEL, DNS_LABEL, DNS_SUBDOMAIN, ApiModel, exactly_one
from strata.operator.api.cel import immutable, one_of, rule, rules, size_le
from strata.operator.api.engine import VLLM_CPU_BLOCK_MULTIPLE, EngineSpec
from strata.operator.api.pod import PodOverrides
from strata.operator.api.quantity import (
    QUANTITY_PATTERN,
    SIZE_PATTERN,
    parse_milli,
    parse_size,
    quantity_fraction,
)

DEFAULT_TIER = "standard"  # the ServiceTier of a service whose spec names none

Dtype = Literal["float32", "bfloat16", "float16"]
# Llama-3.1-405B takes 0.5 MiB a token in bfloat16, a 175B model without grouped-query attention
# 4.5 MiB in float16: past 16 MiB the figure is surely per block, or in bits.
MAX_KV_BYTES_PER_TOKEN = 16 * 2**20
AutoscalingMode = Literal["builtin", "external", "off"]
EvictionPolicy = Literal["lru", "prefix-aware"]
AdmissionPolicy = Literal["always", "doorkeeper", "adaptive"]
WriteMode = Literal["write-through", "write-back"]
ConditionStatus = Literal["True", "False", "Unknown"]

# InferenceService condition types. `Accepted` explains an invalid spec or an unknown tier.
READY = "Ready"
PROGRESSING = "Progressing"
DEGRADED = "Degraded"
ACCEPTED = "Accepted"
# Reasons of Accepted=False.
REASON_TIER_NOT_FOUND = "TierNotFound"
REASON_TIER_LIMITS = "TierLimitsExceeded"
REASON_INVALID_TIER = "InvalidTier"
REASON_INVALID_SPEC = "InvalidSpec"

# A service's name becomes its Service's (a DNS-1035 label, with "-metrics" appended for the
# headless one) and its StatefulSet's, whose pods' revision label must stay within 63 characters.
SERVICE_NAME_MAX = 52
# A tier's name becomes a label value (63 characters) and the PriorityClass `strata-<tier>`.
TIER_NAME_MAX = 63
MAX_REPLICAS = 1000


def _as_size(value: object) -> object:
    """Accept an int or a string size; leave anything else for pydantic to refuse."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int | str):
        parse_size(value)
        return str(value)
    return value


def _as_cpu(value: object) -> object:
    if isinstance(value, bool):
        return value
    if isinstance(value, int | str):
        if parse_milli(value) <= 0:
            raise ValueError(f"cpu {value!r} must be positive")
        return str(value)
    return value


def _int_or_string_schema(pattern: str, *validations: dict[str, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = {
        "anyOf": [{"type": "integer"}, {"type": "string"}],
        "minimum": 0,  # the pattern covers strings; this covers integers
        "maxLength": 64,  # bounds the cost of CEL rules that parse it
        "pattern": pattern,
        "x-kubernetes-int-or-string": True,
    }
    if validations:
        schema["x-kubernetes-validations"] = list(validations)
    return schema


# A size in bytes as a Kubernetes quantity ("8Gi", "500G", 1073741824). Kept as the string the
# tenant wrote, so a round trip through the API does not rewrite it; `parse_size` gives bytes.
Size = Annotated[str, BeforeValidator(_as_size), WithJsonSchema(_int_or_string_schema(SIZE_PATTERN))]
# A CPU amount as a Kubernetes quantity ("4", "500m"); `parse_milli` gives millicores.
_CPU_POSITIVE = rule(
    "quantity(string(self)).isGreaterThan(quantity('0'))", "spec.resources.cpu must be positive"
)
Cpu = Annotated[
    str, BeforeValidator(_as_cpu), WithJsonSchema(_int_or_string_schema(QUANTITY_PATTERN, _CPU_POSITIVE))
]


class StatusModel(BaseModel):
    """Status is written by the operator; tolerate fields a newer operator added."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


# --------------------------------------------------------------------------- InferenceService spec


class PvcSource(ApiModel):
    claim_name: str = Field(
        min_length=1,
        max_length=253,
        pattern=DNS_SUBDOMAIN,
        description="PersistentVolumeClaim in the service's namespace that holds the model.",
    )
    path: str = Field(
        "",
        max_length=1024,
        pattern=r"^([^/].*)?$",
        description="Relative directory inside the claim with config.json and *.safetensors; empty means "
        "the root. No `..` segments: the pod mounts it as a subPath.",
        json_schema_extra=rules(
            rule(
                "!(self == '..' || self.startsWith('../') || self.contains('/../') || self.endsWith('/..'))",
                "spec.model.source.pvc.path must not contain '..' segments",
            )
        ),
    )

    @field_validator("path")
    @classmethod
    def _no_parent_segments(cls, path: str) -> str:
        if ".." in path.split("/"):
            raise ValueError("spec.model.source.pvc.path must not contain '..' segments")
        return path


class ModelSource(ApiModel):
    """Where the weights come from: exactly one of `pvc`, `uri`, `builtin`."""

    model_config = ConfigDict(json_schema_extra=one_of("spec.model.source", "pvc", "uri", "builtin"))

    pvc: PvcSource | None = Field(None, description="Weights on a PersistentVolumeClaim, mounted read-only.")
    uri: str | None = Field(
        None,
        max_length=2048,
        pattern=r"^(s3|gs|https?|hf)://.+",
        description="Weights fetched at pod start from an object store or HTTP: s3://, gs://, http(s)://, hf://.",
    )
    builtin: str | None = Field(
        None,
        max_length=63,
        pattern=DNS_LABEL,
        description="Name of a small test model the worker generates itself (no download; tests, demos).",
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> ModelSource:
        exactly_one(self, ("pvc", "uri", "builtin"), "spec.model.source")
        return self


class ModelSpec(ApiModel):
    name: str = Field(
        min_length=1,
        max_length=256,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._/:-]*$",
        description="Served model name: what clients pass as `model` in OpenAI API requests. "
        "Immutable: clients address it, and every KV-cache key is salted with it.",
        json_schema_extra=immutable(
            "spec.model.name", "clients address the service by it and every cached KV block is keyed by it"
        ),
    )
    source: ModelSource = Field(description="Where the weights come from.")
    dtype: Dtype = Field("bfloat16", description="Weights and KV-cache data type.")
    max_context_tokens: int = Field(
        4096, ge=16, le=1048576, description="Prompt plus generated tokens per request (tokens)."
    )
    kv_bytes_per_token: int | None = Field(
        None,
        ge=1,
        le=MAX_KV_BYTES_PER_TOKEN,
        description="KV-cache bytes one token takes over all layers at `dtype` (bytes): 2 x layers x "
        "KV heads x head dim x bytes per value, e.g. 131072 for Llama-3-8B in bfloat16, 57344 for "
        "Qwen2.5-7B, 12288 for Qwen2.5-0.5B. Sizes the KV-tier sidecar's memory for the index of "
        "every block its tiers hold, and the routers' for following every replica's blocks. Unset: "
        "the sidecar is sized for blocks of 1 MiB or more, and with smaller blocks indexes less of "
        "its shared and NVMe tiers (alert StrataKVTierFittedToMemory); the routers get the chart's "
        "memory. The workers report their model's own figure (status.model.kvBytesPerToken).",
    )


class ResourcesSpec(ApiModel):
    gpus: int = Field(
        1, ge=0, le=16, description="GPUs per replica (`nvidia.com/gpu`); 0 runs the worker on CPU (tests)."
    )
    gpu_product: str | None = Field(
        None,
        max_length=63,
        pattern=r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$",
        description="Required value of the node label `nvidia.com/gpu.product` (e.g. NVIDIA-H100-80GB-HBM3).",
    )
    cpu: Cpu = Field(
        "4", description="CPU per replica for the engine container (cores; quantity, e.g. 4, 500m)."
    )
    memory: Size = Field(
        "32Gi",
        description="Memory per replica for the engine container (bytes; quantity, e.g. 32Gi). "
        "The DRAM cache tier is requested separately, in `spec.cache.dram`.",
    )


class AutoscalingSpec(ApiModel):
    mode: AutoscalingMode = Field(
        "builtin",
        description="`builtin`: the operator scales on KV-cache usage and TTFT within the tier's policy; "
        "`external`: an HPA or KEDA drives `spec.replicas` through the scale subresource; "
        "`off`: `spec.replicas` is used as written. "
        "In every mode it is clamped to [minReplicas, maxReplicas].",
    )


MAX_PINNED_PREFIXES = 8
MAX_PINNED_PREFIX_CHARS = 32768
PinnedPrefix = Annotated[str, Field(min_length=1, max_length=MAX_PINNED_PREFIX_CHARS)]


class CacheRequest(ApiModel):
    """The tenant's KV-cache request per replica, within the tier's maxima."""

    model_config = ConfigDict(
        json_schema_extra=rules(
            rule(
                "has(self.nvme) == has(oldSelf.nvme) && (!has(self.nvme) || self.nvme == oldSelf.nvme)",
                "spec.cache.nvme is immutable: local NVMe volumes cannot be resized in place; "
                "create a new InferenceService instead",
                field_path=".nvme",
            )
        )
    )

    hbm: Size | None = Field(
        None,
        description="Cap on the KV cache in GPU memory per replica (bytes; quantity), below what the "
        "tier's `cache.hbm.kvFraction` leaves (on a CPU engine: 512 MiB). Unset: no cap.",
    )
    dram: Size | None = Field(
        None,
        description="Host-DRAM KV tier per replica (bytes; quantity). Unset uses the tier's "
        "`cache.dram.defaultSize`; must not exceed the tier's `cache.dram.maxSize`.",
    )
    nvme: Size | None = Field(
        None,
        description="Local-NVMe KV tier per replica (bytes; quantity). Unset uses the tier's "
        "`cache.nvme.defaultSize`; must not exceed `cache.nvme.maxSize`. Immutable once set.",
    )
    shared: bool = Field(
        False, description="Use the shared-storage KV tier; only where the tier has `cache.shared.enabled`."
    )
    pinned_prefixes: list[PinnedPrefix] | None = Field(
        None,
        max_length=MAX_PINNED_PREFIXES,
        description="Prompt prefixes, such as a system prompt, whose KV blocks the DRAM tier keeps "
        "resident (never evicted). Matched on tokens: a prompt must start with exactly this text to hit.",
    )


_REPLICA_RULES = rules(
    rule(
        "self.minReplicas <= self.maxReplicas",
        "spec.minReplicas must not exceed spec.maxReplicas",
        field_path=".minReplicas",
    ),
    rule(
        "!has(self.engine) || self.engine.kind != 'vllm' || !has(self.resources) || self.resources.gpus > 0"
        f" || self.engine.blockSize % {VLLM_CPU_BLOCK_MULTIPLE} == 0",
        f"spec.engine.blockSize must be a multiple of {VLLM_CPU_BLOCK_MULTIPLE} for vLLM on the CPU "
        "(spec.resources.gpus 0): its CPU attention takes no other",
        field_path=".engine.blockSize",
    ),
)


class InferenceServiceSpec(ApiModel):
    """Desired state of an InferenceService: what to serve, on what, in which tier."""

    model_config = ConfigDict(json_schema_extra=_REPLICA_RULES)

    tier: str = Field(
        DEFAULT_TIER,
        min_length=1,
        max_length=TIER_NAME_MAX,
        pattern=DNS_LABEL,
        description="Name of the ServiceTier whose priority, SLOs, cache and autoscaling policy apply.",
    )
    model: ModelSpec = Field(description="The model to serve.")
    engine: EngineSpec = Field(default_factory=EngineSpec, description="The inference engine and its tuning.")
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec, description="Resources per replica.")
    replicas: int = Field(
        1,
        ge=0,
        le=MAX_REPLICAS,
        description="Desired replicas (pods), written by `kubectl scale`, an HPA/KEDA or the built-in "
        "autoscaler through the scale subresource; the operator clamps it to [minReplicas, maxReplicas].",
    )
    min_replicas: int = Field(
        1,
        ge=0,
        le=MAX_REPLICAS,
        description="Fewest replicas (pods); 0 only where the tier allows scale to zero.",
    )
    max_replicas: int = Field(1, ge=1, le=MAX_REPLICAS, description="Most replicas (pods).")
    autoscaling: AutoscalingSpec = Field(
        default_factory=AutoscalingSpec, description="Who decides the replica count."
    )
    cache: CacheRequest = Field(
        default_factory=CacheRequest, description="KV-cache capacity per replica in the lower memory tiers."
    )
    pod: PodOverrides | None = Field(
        None,
        description="Settings for the worker pods: environment (e.g. HF_TOKEN from a Secret for a "
        "gated model), image pull secrets, ServiceAccount, labels, annotations, node selector, affinity, "
        "tolerations.",
    )

    @model_validator(mode="after")
    def _min_le_max(self) -> InferenceServiceSpec:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"spec.minReplicas ({self.min_replicas}) must not exceed "
                f"spec.maxReplicas ({self.max_replicas})"
            )
        return self

    @model_validator(mode="after")
    def _vllm_cpu_block_size(self) -> InferenceServiceSpec:
        engine = self.engine
        if engine.kind == "vllm" and self.resources.gpus == 0 and engine.block_size % VLLM_CPU_BLOCK_MULTIPLE:
            raise ValueError(
                f"spec.engine.blockSize {engine.block_size} must be a multiple of {VLLM_CPU_BLOCK_MULTIPLE} "
                "for vLLM on the CPU (spec.resources.gpus 0): its CPU attention takes no other"
            )
        return self

    @classmethod
    def tier_of(cls, spec: Mapping[str, Any] | None) -> str:
        """The ServiceTier a raw spec (a watched body's) names, else this model's default: the API
        server fills it in from the CRD, but a snapshot or a test's body may lack it. Reads the name
        alone, so that a spec invalid otherwise still finds its tier (and its rejection a reason)."""
        return str((spec or {}).get("tier", cls.model_fields["tier"].default))


# --------------------------------------------------------------------------- InferenceService status


class Condition(StatusModel):
    """A standard Kubernetes condition (metav1.Condition)."""

    type: str = Field(max_length=316, description="Ready, Progressing, Degraded or Accepted.")
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: str = Field("", max_length=1024, description="CamelCase reason for the last transition.")
    message: str = Field("", max_length=32768, description="Human-readable detail of the last transition.")
    observed_generation: int | None = Field(
        None, ge=0, description="metadata.generation the condition was computed from."
    )
    last_transition_time: datetime | None = Field(
        None, description="When the status last changed (RFC 3339)."
    )


class PrefixHitRatio(StatusModel):
    """Share of prompt tokens served from each cache tier (0..1) over the last window."""

    hbm: float | None = Field(None, ge=0, le=1, description="Share of prompt tokens found in GPU HBM (0..1).")
    dram: float | None = Field(
        None, ge=0, le=1, description="Share of prompt tokens found in host DRAM (0..1)."
    )
    nvme: float | None = Field(
        None, ge=0, le=1, description="Share of prompt tokens found on local NVMe (0..1)."
    )
    shared: float | None = Field(
        None, ge=0, le=1, description="Share of prompt tokens found in shared storage (0..1)."
    )


class Signals(StatusModel):
    """The live signals the autoscaler reads, aggregated over ready replicas."""

    kv_cache_usage: float | None = Field(
        None, ge=0, le=1, description="Mean share of HBM KV blocks in use across replicas (0..1)."
    )
    ttft_p95_ms: float | None = Field(None, ge=0, description="Time to first token, 95th percentile (ms).")
    inter_token_latency_p95_ms: float | None = Field(
        None, ge=0, description="Time between output tokens, 95th percentile (ms)."
    )
    requests_waiting: int | None = Field(
        None, ge=0, description="Requests queued across replicas (requests)."
    )
    prefix_hit_ratio: PrefixHitRatio | None = Field(None, description="Prefix-cache hit ratio per tier.")
    observed_at: datetime | None = Field(
        None,
        description="When these values were scraped (RFC 3339); written only when a signal changes, "
        "so an idle service keeps the time of its last change.",
    )


BottleneckVerdict = Literal["Idle", "DataPathBound", "HBMBound", "ComputeBound", "Headroom"]


class Bottleneck(StatusModel):
    """What limits the service over the last interval, and the numbers behind the verdict."""

    verdict: BottleneckVerdict = Field(
        description="Idle, DataPathBound (waiting on tier loads/saves), HBMBound (KV cache full, requests "
        "preempted or blocks evicted, engine not saturated), ComputeBound (engine busy), or Headroom."
    )
    reason: str = Field("", max_length=1024, description="The rule that decided it, with its numbers.")
    engine_busy: float | None = Field(
        None, ge=0, le=1, description="Share of wall time the engines spent in steps with work (0..1)."
    )
    tier_wait_share: float | None = Field(
        None, ge=0, le=1, description="Share of step time spent waiting on the KV-tier sidecar (0..1)."
    )
    kv_cache_usage: float | None = Field(None, ge=0, le=1, description="Mean HBM KV-cache usage (0..1).")
    preemptions_per_second: float | None = Field(
        None, ge=0, description="Requests preempted for lack of KV blocks, per pod-second."
    )
    hbm_evictions_per_second: float | None = Field(
        None, ge=0, description="Cached KV blocks evicted from HBM to make room, per pod-second."
    )
    observed_at: datetime | None = Field(None, description="When it was decided (RFC 3339).")


class ScalingDecision(StatusModel):
    time: datetime | None = Field(None, description="When the decision was made (RFC 3339).")
    from_replicas: int = Field(0, ge=0, description="Replicas before the decision (pods).")
    to_replicas: int = Field(0, ge=0, description="Replicas after the decision (pods).")
    reason: str = Field("", max_length=1024, description="Why, e.g. `kvCacheUsage 0.91 > target 0.75`.")


class ObservedModel(StatusModel):
    """What the workers report of the model they serve."""

    kv_bytes_per_token: int | None = Field(
        None,
        ge=1,
        le=MAX_KV_BYTES_PER_TOKEN,
        description="KV-cache bytes one token takes in the workers' model (bytes), as their engines "
        "sized their KV caches: the figure spec.model.kvBytesPerToken should give (an Event "
        "KVBytesPerTokenUnset or KVBytesPerTokenDiffers says so when it does not).",
    )
    observed_at: datetime | None = Field(None, description="When it was first reported (RFC 3339).")


class InferenceServiceStatus(StatusModel):
    observed_generation: int | None = Field(None, ge=0, description="metadata.generation last reconciled.")
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=16,
        description="Ready, Progressing, Degraded, and Accepted (False explains an invalid spec or tier).",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    replicas: int = Field(0, ge=0, description="Worker pods that exist (pods).")
    ready_replicas: int = Field(0, ge=0, description="Worker pods that are ready (pods).")
    desired_replicas: int = Field(
        0, ge=0, description="Replicas the operator is converging to: spec.replicas clamped to [min, max]."
    )
    selector: str | None = Field(
        None, max_length=4096, description="Label selector of the worker pods, for the scale subresource."
    )
    endpoint: str | None = Field(
        None, max_length=2048, description="Base URL of the OpenAI-compatible API inside the cluster."
    )
    tier: str | None = Field(None, max_length=253, description="The ServiceTier last applied.")
    signals: Signals | None = Field(None, description="Live signals the autoscaler uses.")
    last_scaling: ScalingDecision | None = Field(
        None, description="The last scaling decision and its reason."
    )
    bottleneck: Bottleneck | None = Field(
        None, description="What limits the service now (docs/operator.md, Bottleneck diagnosis)."
    )
    model: ObservedModel | None = Field(None, description="What the workers report of their model.")


class InferenceService(ApiModel):
    """An LLM served by GPU worker pods with a tiered KV cache."""

    model_config = ConfigDict(extra="ignore")

    api_version: Literal["strata.dev/v1alpha1"] = Field(
        "strata.dev/v1alpha1", description="strata.dev/v1alpha1"
    )
    kind: Literal["InferenceService"] = Field("InferenceService", description="InferenceService")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Standard object metadata.")
    spec: InferenceServiceSpec = Field(description="What to serve and how.")
    status: InferenceServiceStatus | None = Field(
        None, description="Observed state, written by the operator."
    )

    @model_validator(mode="after")
    def _name_fits_children(self) -> InferenceService:
        check_name(self.metadata, DNS_1035_LABEL, SERVICE_NAME_MAX)
        return self


# --------------------------------------------------------------------------- ServiceTier spec


class SloSpec(ApiModel):
    ttft_p95_ms: int = Field(
        1000, ge=1, le=600000, description="Target time to first token, 95th percentile (ms)."
    )
    inter_token_latency_p95_ms: int = Field(
        100, ge=1, le=60000, description="Target time between output tokens, 95th percentile (ms)."
    )


class HbmPolicy(ApiModel):
    kv_fraction: float = Field(
        0.9,
        gt=0,
        le=1,
        description="Share of GPU memory left after the weights that holds KV blocks (0..1]; the rest is "
        "activation headroom.",
    )


def _capacity_rules(tier: str) -> dict[str, Any]:
    return rules(
        rule(
            size_le("self.defaultSize", "self.maxSize"),
            f"spec.cache.{tier}.defaultSize must not exceed spec.cache.{tier}.maxSize",
            field_path=".defaultSize",
        )
    )


class _Capacity(ApiModel):
    default_size: Size = Field(
        "0", description="Per-replica size when the service does not ask (bytes; quantity)."
    )
    max_size: Size = Field(
        "0", description="Largest per-replica size a service may ask for (bytes; quantity)."
    )
    eviction: EvictionPolicy = Field(
        "prefix-aware",
        description="`lru`, or `prefix-aware`: evict leaves of prefix chains first, keeping shared prefixes.",
    )
    admission: AdmissionPolicy = Field(
        "always",
        description="Which blocks may enter the tier once it is full (until then every block does): "
        "`always`; `doorkeeper`: only a block seen before (recently, by a bounded frequency sketch), so "
        "one-use blocks do not push out reused ones; `adaptive`: whichever of the two is winning at this "
        "capacity and load, learned from ghost hits.",
    )

    @model_validator(mode="after")
    def _default_le_max(self) -> _Capacity:
        if quantity_fraction(self.default_size) > quantity_fraction(self.max_size):
            raise ValueError(f"defaultSize ({self.default_size}) must not exceed maxSize ({self.max_size})")
        return self


class DramPolicy(_Capacity):
    model_config = ConfigDict(json_schema_extra=_capacity_rules("dram"))


class NvmePolicy(_Capacity):
    model_config = ConfigDict(json_schema_extra=_capacity_rules("nvme"))

    storage_class_name: str | None = Field(
        None,
        max_length=253,
        pattern=DNS_SUBDOMAIN,
        description="StorageClass of the local-NVMe volumes; unset uses the cluster default. Immutable: "
        "claim templates cannot change class.",
        json_schema_extra=immutable(
            "spec.cache.nvme.storageClassName", "existing NVMe volume claims cannot change storage class"
        ),
    )
    survives_restart: bool = Field(
        False,
        description="Keep each replica's NVMe cache across pod restarts (a StatefulSet with a claim per "
        "replica) instead of an ephemeral volume that dies with the pod.",
    )
    admit_after_hits: int = Field(
        1,
        ge=0,
        le=100,
        description="Write a block to NVMe only after it was reused this many times (SSD wear).",
    )


class SharedPolicy(ApiModel):
    enabled: bool = Field(False, description="Services in this tier may use the shared-storage KV tier.")
    storage_class_name: str | None = Field(
        None,
        max_length=253,
        pattern=DNS_SUBDOMAIN,
        description="ReadWriteMany StorageClass for the shared tier; unset uses the cluster default.",
    )
    size_per_service: Size = Field("0", description="Shared-tier capacity per service (bytes; quantity).")


class TierCachePolicy(ApiModel):
    hbm: HbmPolicy = Field(default_factory=HbmPolicy, description="GPU HBM tier.")
    dram: DramPolicy = Field(default_factory=DramPolicy, description="Host-DRAM tier (shared memory).")
    nvme: NvmePolicy = Field(default_factory=NvmePolicy, description="Local-NVMe tier.")
    shared: SharedPolicy = Field(default_factory=SharedPolicy, description="Shared-storage tier.")
    write_mode: WriteMode = Field(
        "write-back",
        description="`write-back`: a block moves down a tier only when evicted from the one above; "
        "`write-through`: every new block is stored in every enabled tier at once.",
    )
    retention_seconds: int | None = Field(
        None,
        ge=1,
        le=31536000,
        description="Drop blocks unused for this long (s); unset keeps them until evicted.",
    )


class TierAutoscalingPolicy(ApiModel):
    model_config = ConfigDict(
        json_schema_extra=rules(
            rule(
                "self.minReplicas <= self.maxReplicas",
                "spec.autoscaling.minReplicas must not exceed spec.autoscaling.maxReplicas",
                field_path=".minReplicas",
            ),
            rule(
                "self.minReplicas > 0 || self.scaleToZero",
                "spec.autoscaling.minReplicas may be 0 only with spec.autoscaling.scaleToZero: true",
                field_path=".minReplicas",
            ),
        )
    )

    target_kv_cache_usage: float = Field(
        0.75, gt=0, le=1, description="Scale out when mean KV-cache usage exceeds this share (0..1]."
    )
    target_prefill_utilization: float = Field(
        0.5,
        gt=0,
        le=1,
        description="Scale out when the mean share of time replicas spend computing prompts exceeds this.",
    )
    tolerance: float = Field(
        0.1, ge=0, lt=1, description="Relative deviation from a target ignored, to avoid flapping (0..1)."
    )
    scale_up_stabilization_seconds: int = Field(
        0, ge=0, le=3600, description="Highest recommendation over this window wins before scaling up (s)."
    )
    scale_down_stabilization_seconds: int = Field(
        300,
        ge=0,
        le=3600,
        description="Highest recommendation over this window wins before scaling down (s).",
    )
    max_scale_up_step: int = Field(4, ge=1, le=MAX_REPLICAS, description="Most replicas added per decision.")
    max_scale_down_step: int = Field(
        1, ge=1, le=MAX_REPLICAS, description="Most replicas removed per decision."
    )
    min_replicas: int = Field(
        1, ge=0, le=MAX_REPLICAS, description="Lowest spec.minReplicas a service in this tier may set (pods)."
    )
    max_replicas: int = Field(
        16,
        ge=1,
        le=MAX_REPLICAS,
        description="Highest spec.maxReplicas a service in this tier may set (pods).",
    )
    scale_to_zero: bool = Field(False, description="Services may scale to zero replicas when idle.")
    scale_to_zero_idle_seconds: int = Field(
        600, ge=30, le=86400, description="Idle time without requests before scaling to zero (s)."
    )

    @model_validator(mode="after")
    def _consistent(self) -> TierAutoscalingPolicy:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"spec.autoscaling.minReplicas ({self.min_replicas}) must not exceed "
                f"spec.autoscaling.maxReplicas ({self.max_replicas})"
            )
        if self.min_replicas == 0 and not self.scale_to_zero:
            raise ValueError(
                "spec.autoscaling.minReplicas may be 0 only with spec.autoscaling.scaleToZero: true"
            )
        return self


class TierLimits(ApiModel):
    model_config = ConfigDict(
        json_schema_extra=rules(
            rule(
                "self.maxGpusPerReplica <= self.maxGpusPerService",
                "spec.limits.maxGpusPerReplica must not exceed spec.limits.maxGpusPerService",
                field_path=".maxGpusPerReplica",
            )
        )
    )

    max_gpus_per_replica: int = Field(8, ge=0, le=16, description="Most GPUs one replica may request (GPUs).")
    max_gpus_per_service: int = Field(
        64, ge=0, le=16000, description="Most GPUs one service may reach at maxReplicas (GPUs)."
    )

    @model_validator(mode="after")
    def _consistent(self) -> TierLimits:
        if self.max_gpus_per_replica > self.max_gpus_per_service:
            raise ValueError("spec.limits.maxGpusPerReplica must not exceed spec.limits.maxGpusPerService")
        return self


class TierRoutingPolicy(ApiModel):
    queue_ttl_seconds: int = Field(
        30,
        ge=1,
        le=3600,
        description="Longest a request may wait in a queue (the router's, then the worker's) before it is "
        "refused with 429 and Retry-After; one that would wait longer is refused at once (s).",
    )
    hold_timeout_seconds: int = Field(
        HOLD_TIMEOUT_S,
        ge=1,
        le=3600,
        description="While the service has no ready replica (scaled to zero, waking up), longest the router "
        "holds a request before refusing it with 503 and Retry-After: at least the tier's pod start-up (s).",
    )
    hold_max_requests: int = Field(
        HOLD_MAX_REQUESTS,
        ge=0,
        le=100000,
        description="Requests the router holds while the service has no ready replica; more are refused at "
        "once with 503 and Retry-After. 0: none are held, a request to a service at zero is refused.",
    )


class ServiceTierSpec(ApiModel):
    """Policy of a tier of service: priority, SLOs, cache per memory tier, autoscaling, limits."""

    description: str = Field("", max_length=1024, description="What this tier is for, for humans.")
    priority: int = Field(
        0,
        ge=-1000000,
        le=1000000000,
        description="Pod priority: value of the PriorityClass `strata-<tier>` the operator manages.",
    )
    slo: SloSpec = Field(
        default_factory=SloSpec, description="Latency targets, which the autoscaler defends."
    )
    cache: TierCachePolicy = Field(
        default_factory=TierCachePolicy, description="KV-cache policy per memory tier."
    )
    autoscaling: TierAutoscalingPolicy = Field(
        default_factory=TierAutoscalingPolicy, description="Autoscaling policy for services of this tier."
    )
    limits: TierLimits = Field(default_factory=TierLimits, description="Per-service resource limits.")
    routing: TierRoutingPolicy = Field(
        default_factory=TierRoutingPolicy,
        description="Requests at the service's router: they carry the tier's priority (a request may ask "
        "for a lower one in the X-Strata-Priority header, down to 0) and wait at most the queue TTL.",
    )


class CacheHours(StatusModel):
    """Capacity held per cache tier (GiB x hours)."""

    dram: float = Field(0, ge=0, description="Host-DRAM tier, all replicas (GiB-hours).")
    nvme: float = Field(0, ge=0, description="Local-NVMe tier, all replicas (GiB-hours).")
    shared: float = Field(0, ge=0, description="Shared tier, per service (GiB-hours).")


class NamespaceUsage(StatusModel):
    namespace: str = Field(max_length=63, description="The tenant's namespace.")
    gpu_seconds: float = Field(0, ge=0, description="Replicas x GPUs x time (GPU-seconds).")
    cache_gi_b_hours: CacheHours = Field(
        default_factory=CacheHours, alias="cacheGiBHours", description="KV-cache capacity held (GiB-hours)."
    )


class TierUsage(StatusModel):
    """Cumulated by the active operator replica about once a minute."""

    since: datetime | None = Field(None, description="When accounting started (RFC 3339).")
    updated_at: datetime | None = Field(None, description="Last update (RFC 3339).")
    gpu_seconds: float = Field(0, ge=0, description="All services of the tier (GPU-seconds).")
    cache_gi_b_hours: CacheHours = Field(
        default_factory=CacheHours, alias="cacheGiBHours", description="All services of the tier (GiB-hours)."
    )
    namespaces: list[NamespaceUsage] = Field(
        default_factory=list,
        max_length=1000,
        description="Per tenant namespace.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["namespace"]},
    )


class ServiceTierStatus(StatusModel):
    observed_generation: int | None = Field(None, ge=0, description="metadata.generation last reconciled.")
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=16,
        description="Ready once the tier's PriorityClass exists.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    priority_class_name: str | None = Field(
        None, max_length=253, description="The PriorityClass of this tier."
    )
    services: int = Field(0, ge=0, description="InferenceServices that use this tier.")
    usage: TierUsage | None = Field(
        None, description="What the tier's services held, cumulated: the cost per tenant and cache tier."
    )


class ServiceTier(ApiModel):
    """A tier of service: priority, SLOs, cache, autoscaling policy and limits."""

    model_config = ConfigDict(extra="ignore")

    api_version: Literal["strata.dev/v1alpha1"] = Field(
        "strata.dev/v1alpha1", description="strata.dev/v1alpha1"
    )
    kind: Literal["ServiceTier"] = Field("ServiceTier", description="ServiceTier")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Standard object metadata.")
    spec: ServiceTierSpec = Field(default_factory=ServiceTierSpec, description="The tier's policy.")

    @model_validator(mode="after")
    def _name_fits_labels(self) -> ServiceTier:
        check_name(self.metadata, DNS_LABEL, TIER_NAME_MAX)
        return self

    status: ServiceTierStatus | None = Field(None, description="Observed state, written by the operator.")


def check_name(metadata: dict[str, Any], pattern: str, max_length: int) -> None:
    """Refuse a ``metadata.name`` the objects derived from it could not carry."""
    name = metadata.get("name")
    if name is None:
        return
    if not isinstance(name, str) or len(name) > max_length or not re.match(pattern, name):
        raise ValueError(
            f"metadata.name {name!r} must match {pattern} and have at most {max_length} characters"
        )


def to_manifest(model: BaseModel) -> dict[str, Any]:
    """The wire form of any API model: camelCase keys, unset optional fields left out."""
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)
