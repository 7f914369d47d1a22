"""InferenceService + ServiceTier -> ServicePlan: every decision about one service, pure.

Errors are :class:`SpecRejected` with a condition reason and a message naming the field, so the
reconciler can report them without touching the running workload."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from pydantic import ValidationError

from strata.common.endpoints import ROUTER_PORT, SIDECAR_PORT, WORKER_PORT
from strata.common.kvbudget import KVTIER_STAGING_BYTES, asked_blocks, needed_bytes
from strata.common.routermemory import memory_to_follow
from strata.operator import names
from strata.operator.api import (
    InferenceService,
    PodOverrides,
    ServiceTier,
    check_against_tier,
    parse_milli,
    parse_size,
)
from strata.operator.plan import ModelSource, NvmePlan, OwnerRef, PodPlan, ServicePlan, SharedPlan
from strata.operator.replicas import desired_replicas
from strata.operator.tenancy import cache_namespace
from strata.router.config import HoldConfig, PriorityConfig, QueueConfig, RouterConfig, WorkersConfig
from strata.router.config import ModelConfig as RouterModel
from strata.worker.config import (
    DramTierConfig,
    EngineConfig,
    KVTierConfig,
    ModelConfig,
    NvmeTierConfig,
    ServerConfig,
    SharedTierConfig,
    WorkerConfig,
)
from strata.worker.tokenizer import BYTE_VOCAB_SIZE

MODEL_DIR = "/models"
# How long a draining worker waits for its longest generation, on top of its queue timeout: a
# long answer (thousands of tokens) on a busy GPU. The pod's grace period is derived from it.
GENERATION_BUDGET_S = 120.0
MIB = 2**20
# The KV-tier sidecar's memory beside the DRAM tier's and the staging slots' pages: the
# interpreter, connections, and the admission policies' sketches (at most 64 MiB each).
SIDECAR_MEMORY_OVERHEAD_BYTES = 512 * 2**20
# Its NVMe and shared tiers' indexes take about 1 KiB a block: this covers blocks of 1 MiB or more
# (an 8B model's are 2 MiB at 16 tokens a block; 1 TiB of lower tiers gets 1 GiB). With smaller
# blocks the sidecar fits those tiers within its memory and says so (strata/common/kvbudget.py).
LOWER_TIER_BYTES_PER_INDEX_BYTE = 1024

REASON_INVALID_SPEC = "InvalidSpec"
REASON_TIER_NOT_FOUND = "TierNotFound"
REASON_INVALID_TIER = "InvalidTier"
REASON_TIER_LIMITS = "TierLimitsExceeded"


class SpecRejected(Exception):
    """The service cannot be rendered as written; ``reason`` becomes the Accepted condition's."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class ResolveInput:
    """What resolve reads: the raw objects as the API server returned them."""

    service: Mapping[str, Any]
    tier: Mapping[str, Any] | None
    namespace_uid: str
    # False where the namespace's Pod Security level refuses hostPath volumes (``tenancy``).
    host_path_allowed: bool = True


def parse_service(body: Mapping[str, Any]) -> InferenceService:
    try:
        return InferenceService.model_validate(dict(body))
    except ValidationError as exc:
        raise SpecRejected(REASON_INVALID_SPEC, _first_error("spec", exc)) from None


def parse_tier(body: Mapping[str, Any]) -> ServiceTier:
    name = body.get("metadata", {}).get("name", "?")
    try:
        return ServiceTier.model_validate(dict(body))
    except ValidationError as exc:
        raise SpecRejected(REASON_INVALID_TIER, f"ServiceTier {name}: {_first_error('spec', exc)}") from None


def resolve(given: ResolveInput) -> ServicePlan:
    isvc = parse_service(given.service)
    meta = isvc.metadata
    if given.tier is None:
        raise SpecRejected(REASON_TIER_NOT_FOUND, f"spec.tier: ServiceTier {isvc.spec.tier!r} does not exist")
    tier = parse_tier(given.tier)
    violations = check_against_tier(isvc.spec, tier.spec, isvc.spec.tier)
    if violations:
        raise SpecRejected(REASON_TIER_LIMITS, "; ".join(str(v) for v in violations))
    plan = _plan(isvc, tier, meta, cache_namespace(meta["namespace"], given.namespace_uid))
    return plan if given.host_path_allowed else replace(plan, host_path_allowed=False)


def _plan(isvc: InferenceService, tier: ServiceTier, meta: Mapping[str, Any], salt: str) -> ServicePlan:
    spec, policy = isvc.spec, tier.spec.cache
    dram = parse_size(spec.cache.dram if spec.cache.dram is not None else policy.dram.default_size)
    nvme_size = parse_size(spec.cache.nvme if spec.cache.nvme is not None else policy.nvme.default_size)
    nvme = (
        NvmePlan(nvme_size, policy.nvme.storage_class_name, policy.nvme.survives_restart)
        if nvme_size
        else None
    )
    shared = (
        SharedPlan(
            names.shared_claim_name(meta["name"]),
            parse_size(policy.shared.size_per_service),
            policy.shared.storage_class_name,
        )
        if spec.cache.shared
        else None
    )
    try:
        worker = _worker_config(isvc, tier, dram, nvme_size, salt)
        router = _router_config(isvc, tier, worker)
    except ValidationError as exc:
        raise SpecRejected(REASON_INVALID_SPEC, _first_error("worker config", exc)) from None
    return ServicePlan(
        name=meta["name"],
        namespace=meta["namespace"],
        owner=OwnerRef(names.API_VERSION, names.ISVC_KIND, meta["name"], meta["uid"]),
        tier=spec.tier,
        priority_class=names.priority_class_name(spec.tier),
        replicas=desired_replicas(spec.replicas, spec.min_replicas, spec.max_replicas),
        min_replicas=spec.min_replicas,
        gpus=spec.resources.gpus,
        gpu_product=spec.resources.gpu_product,
        cpu=spec.resources.cpu,
        memory=spec.resources.memory,
        dram_bytes=dram,
        nvme=nvme,
        shared=shared,
        model_source=_model_source(isvc),
        image=spec.engine.image,
        worker=worker,
        router=router,
        pod=pod_plan(spec.pod),
        engine_args=tuple(spec.engine.vllm.args) if spec.engine.vllm is not None else (),
        router_memory_bytes=router_memory_bytes(worker, router, kv_block_bytes(isvc), spec.max_replicas),
    )


def pod_plan(pod: PodOverrides | None) -> PodPlan:
    """``spec.pod`` as manifest fragments, exactly as the tenant wrote them (minus nulls)."""
    if pod is None:
        return PodPlan()

    def items(values: list[Any] | None) -> tuple[dict[str, Any], ...]:
        return tuple(v.model_dump(by_alias=True, exclude_none=True) for v in values or [])

    return PodPlan(
        env=items(pod.env),
        env_from=items(pod.env_from),
        image_pull_secrets=items(pod.image_pull_secrets),
        service_account_name=pod.service_account_name,
        annotations=dict(pod.annotations or {}),
        labels=dict(pod.labels or {}),
        node_selector=dict(pod.node_selector or {}),
        affinity=pod.affinity.model_dump(by_alias=True, exclude_none=True) if pod.affinity else None,
        tolerations=items(pod.tolerations),
    )


def _model_source(isvc: InferenceService) -> ModelSource:
    source = isvc.spec.model.source
    if source.pvc is not None:
        return ModelSource("pvc", claim_name=source.pvc.claim_name, sub_path=source.pvc.path or None)
    if source.uri is not None:
        return ModelSource("uri", uri=source.uri)
    return ModelSource("builtin", uri=f"builtin://{source.builtin}")


def engine_device(isvc: InferenceService) -> Literal["cpu", "cuda"]:
    """0 GPUs runs the engine on the CPU (tests, demos); a vLLM engine's block keys say which."""
    return "cuda" if isvc.spec.resources.gpus > 0 else "cpu"


def model_path(isvc: InferenceService) -> str:
    # A PVC's sub-path is mounted at MODEL_DIR itself; fetched models get a directory of their own.
    return MODEL_DIR if isvc.spec.model.source.pvc is not None else f"{MODEL_DIR}/model"


def sidecar_memory_bytes(kvtier: KVTierConfig, block_bytes: int | None) -> int:
    """The KV-tier sidecar's memory (its container's request and limit, and what it fits its
    indexes within): the DRAM tier's and the staging slots' pages and a fixed overhead; with the
    model's ``block_bytes`` known, at least what its every block's index takes (``needed_bytes``),
    else 1 KiB for each MiB of the lower tiers."""
    dram, nvme = kvtier.dram.capacity_bytes, kvtier.nvme.capacity_bytes
    shared = kvtier.shared.capacity_bytes if kvtier.shared.enabled else 0
    least = dram + KVTIER_STAGING_BYTES + SIDECAR_MEMORY_OVERHEAD_BYTES
    if block_bytes is None:
        return least + (nvme + shared) // LOWER_TIER_BYTES_PER_INDEX_BYTE
    return max(least, needed_bytes(kvtier, block_bytes))


def _worker_config(
    isvc: InferenceService, tier: ServiceTier, dram: int, nvme: int, salt: str
) -> WorkerConfig:
    spec, policy = isvc.spec, tier.spec.cache
    engine = EngineConfig(
        kind=spec.engine.kind,
        device=engine_device(isvc),
        block_size=spec.engine.block_size,
        kv_memory_fraction=policy.hbm.kv_fraction,
        kv_cache_bytes=parse_size(spec.cache.hbm) if spec.cache.hbm is not None else None,
        max_num_seqs=spec.engine.max_num_seqs,
        max_batched_tokens=spec.engine.max_batched_tokens,
        queue_timeout_s=float(tier.spec.routing.queue_ttl_seconds),
        # As many torch threads as CPUs granted: oversubscribed threads slow decode severalfold.
        cpu_threads=max(1, parse_milli(spec.resources.cpu) // 1000),
    )
    return WorkerConfig(
        model=ModelConfig(
            name=spec.model.name,
            path=model_path(isvc),
            dtype=spec.model.dtype,
            max_context_tokens=spec.model.max_context_tokens,
            kv_bytes_per_token=spec.model.kv_bytes_per_token,
        ),
        engine=engine,
        server=ServerConfig(
            port=WORKER_PORT,
            drain_timeout_s=engine.queue_timeout_s + GENERATION_BUDGET_S,
            ttft_slo_s=tier.spec.slo.ttft_p95_ms / 1000,
        ),
        kvtier=_kvtier_config(isvc, tier, dram, nvme),
        cache_namespace=salt,
    )


def _kvtier_config(isvc: InferenceService, tier: ServiceTier, dram: int, nvme: int) -> KVTierConfig:
    spec, policy = isvc.spec, tier.spec.cache
    shared_bytes = parse_size(policy.shared.size_per_service) if spec.cache.shared else 0
    kvtier = KVTierConfig(
        enabled=bool(dram or nvme or spec.cache.shared),
        dram=DramTierConfig(
            capacity_bytes=dram, eviction=policy.dram.eviction, admission=policy.dram.admission
        ),
        nvme=NvmeTierConfig(
            capacity_bytes=nvme,
            eviction=policy.nvme.eviction,
            admission=policy.nvme.admission,
            admit_after_hits=policy.nvme.admit_after_hits,
            persistent=policy.nvme.survives_restart,
        ),
        shared=SharedTierConfig(enabled=spec.cache.shared, capacity_bytes=shared_bytes),
        write_mode=policy.write_mode,
        retention_s=float(policy.retention_seconds) if policy.retention_seconds else None,
        priority=tier.spec.priority,
        metrics_port=SIDECAR_PORT,
        pinned_prefixes=list(spec.cache.pinned_prefixes or []),
    )
    return kvtier.model_copy(update={"memory_bytes": sidecar_memory_bytes(kvtier, kv_block_bytes(isvc))})


def kv_block_bytes(isvc: InferenceService) -> int | None:
    """A KV block's bytes, where the service gave its model's bytes per token."""
    per_token = isvc.spec.model.kv_bytes_per_token
    return per_token * isvc.spec.engine.block_size if per_token is not None else None


def router_memory_bytes(
    worker: WorkerConfig, router: RouterConfig, block_bytes: int | None, replicas: int
) -> int | None:
    """The routers' memory limit under which they follow every DRAM, NVMe and shared block key of
    ``replicas`` replicas and keep their records whole (``memory_to_follow``); None where the
    block size is unknown (the chart's limit, and the routers follow what fits in it)."""
    if block_bytes is None or not worker.kvtier.enabled:
        return None
    asked = asked_blocks(worker.kvtier, block_bytes)
    per_replica = asked.dram + asked.nvme + router.routing.record_blocks
    return -(-memory_to_follow(replicas * per_replica + asked.shared) // MIB) * MIB  # whole MiB


def _router_config(isvc: InferenceService, tier: ServiceTier, worker: WorkerConfig) -> RouterConfig:
    """What the router must know to validate, hash and route exactly as these workers do."""
    spec, tier_spec = isvc.spec, tier.spec
    # builtin test models need no files for Strata's worker (the byte tokenizer); vLLM reads the
    # tokenizer files every model has, and so must the router, to tokenize as it does
    vllm = spec.engine.kind == "vllm"
    bytes_only = spec.model.source.builtin is not None and not vllm
    return RouterConfig(
        model=RouterModel(
            name=spec.model.name,
            path=None if bytes_only else worker.model.path,
            max_context_tokens=spec.model.max_context_tokens,
            vocab_size=BYTE_VOCAB_SIZE if bytes_only else None,
        ),
        block_size=worker.engine.block_size,
        cache_namespace=worker.cache_namespace,
        port=ROUTER_PORT,
        workers=WorkersConfig(
            label_selector=names.label_selector(names.selector_labels(isvc.metadata["name"])),
            port=worker.server.port,
            step_tokens=worker.engine.max_batched_tokens,
            kv_events_port=worker.kvtier.metrics_port if worker.kvtier.enabled or vllm else None,
            engine=spec.engine.kind,
            device=engine_device(isvc),
        ),
        # a request may lower its priority within the tier (to 0), never raise it above the tier's
        priority=PriorityConfig(
            default=tier_spec.priority, min=min(0, tier_spec.priority), max=tier_spec.priority
        ),
        queue=QueueConfig(
            max_inflight_per_endpoint=worker.engine.max_num_seqs,
            ttl_s=float(tier_spec.routing.queue_ttl_seconds),
        ),
        hold=HoldConfig(
            max_requests=tier_spec.routing.hold_max_requests,
            timeout_s=float(tier_spec.routing.hold_timeout_seconds),
        ),
    )


def _first_error(prefix: str, exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or prefix
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{where}: {err['msg']}{more}"
