"""Strata's KV connector for vLLM: vLLM's prefix cache backed by the pod's KV-tier sidecar.

Loaded by vLLM from ``--kv-transfer-config '{"kv_connector": "StrataConnector",
"kv_connector_module_path": "strata.worker.vllm.connector", "kv_role": "kv_both",
"kv_connector_extra_config": {"config": "/etc/strata/worker.yaml"}}'`` (the operator renders
it), so a vLLM image needs only Strata installed beside vLLM. It reads the same worker config
as the sidecar (socket, cache namespace, model, block size, pinned prefixes).

- Scheduler side (vLLM's engine-core process): asks the sidecar how many leading blocks past
  vLLM's own hit it holds (``lookup``), plans their load into the blocks vLLM allocates, and
  each step lists the blocks the step completes (``plan.SchedulerBlocks``). Requests waiting
  in vLLM's queue are announced to the sidecar (``expect``), which keeps their blocks and
  moves them up to DRAM before they are scheduled.
- Worker side (each GPU's process): before the forward pass, reads the planned blocks from the
  sidecar's slots into vLLM's paged cache; after it, copies the completed blocks out to the
  sidecar (``layout.PagedCache`` in Strata's block layout, batches of ``STAGING_BLOCKS``).
  A block that fails its checksum ends its load there; vLLM recomputes from that block on
  (``kv_load_failure_policy: recompute``). The sidecar being down is a miss, never an error.

vLLM is imported here only: the rest of Strata never needs it.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from strata.worker.config import WorkerConfig
from strata.worker.kv_connector import Tier, chain_hashes
from strata.worker.kvtier.client import TierClient, client_threads
from strata.worker.tokenizer import load_tokenizer
from strata.worker.vllm import plan as plans
from strata.worker.vllm.keys import rank_key, rank_ref, vllm_root
from strata.worker.vllm.layout import CacheGeometry, PagedCache, UnsupportedLayout, paged_cache
from strata.worker.vllm.prom import StrataPromMetrics, StrataStats
from strata.worker.vllm.staging import Staging

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics, KVConnectorStats
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

log = logging.getLogger("strata.worker.vllm.connector")
DEFAULT_CONFIG = "/etc/strata/worker.yaml"
HIT_SOURCES: dict[Tier, CacheHitSource] = {
    "dram": CacheHitSource.HOST,
    "nvme": CacheHitSource.DISK,
    "shared": CacheHitSource.EXTERNAL_UNSPECIFIED,
}


@dataclass
class StrataMetadata(KVConnectorMetadata):  # type: ignore[misc]  # vLLM is untyped here
    plan: plans.StepPlan


class StrataConnector(KVConnectorBase_V1):  # type: ignore[misc]
    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig
    ) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        path = self._kv_transfer_config.get_from_extra_config("config", DEFAULT_CONFIG)
        self.config = WorkerConfig.load(path)
        self.block_size: int = vllm_config.cache_config.block_size
        # The config's device salts the keys, as the router and the relay salt them.
        self.device = self.config.engine.device
        self.geometry, self.off = _geometry(kv_cache_config, self.block_size)
        self.layer_names = list(kv_cache_config.kv_cache_groups[0].layer_names) if not self.off else []
        self.client: TierClient | None = None
        self.requests: dict[str, Request] = {}
        self.blocks = plans.SchedulerBlocks(self.block_size, self._lookup)
        self.expected: dict[str, None] = {}  # announced to the sidecar, in order
        self.cache: PagedCache | None = None
        self.staging: Staging | None = None
        self.rank = _tp_rank() if role == KVConnectorRole.WORKER else 0
        self.load_errors: set[int] = set()
        self.stats = StrataStats()
        self.step_started: float | None = None
        if self.off:
            log.warning("strata connector off: %s", self.off)
        elif role == KVConnectorRole.SCHEDULER:
            self.client = self._client(torch.device("cpu"))

    # ---- scheduler side ----

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        if self.off or _not_by_tokens(request):
            return 0, False
        self.requests[request.request_id] = request
        root = self._root(request)
        return self.blocks.matched(
            request.request_id, root, request.all_token_ids, num_computed_tokens
        ), False

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        if self.off:
            return
        self.blocks.allocated(request.request_id, blocks.get_block_ids()[0], num_external_tokens)
        self._unexpect([request.request_id])

    def get_external_cache_hit_sources(
        self, request: Request, num_external_tokens: int
    ) -> dict[CacheHitSource, int]:
        state = self.blocks.requests.get(request.request_id)
        sources: dict[CacheHitSource, int] = {}
        for tier in state.hit_tiers if state is not None else ():
            source = HIT_SOURCES.get(tier, CacheHitSource.EXTERNAL_UNSPECIFIED)
            sources[source] = sources.get(source, 0) + self.block_size
        if sum(sources.values()) != num_external_tokens:
            return {CacheHitSource.EXTERNAL_UNSPECIFIED: num_external_tokens} if num_external_tokens else {}
        return sources

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        if self.off:
            return StrataMetadata(plans.StepPlan())
        scheduled = [*_new(scheduler_output), *_cached(scheduler_output)]
        known = [s for s in scheduled if s.request_id in self.requests]
        plan = self.blocks.step(known, lambda rid: self.requests[rid].all_token_ids)
        plan.tokens = scheduler_output.total_num_scheduled_tokens
        plan.prefill = any(s.computed_before < self.requests[s.request_id].num_prompt_tokens for s in known)
        return StrataMetadata(plan)

    def on_new_request(self, request: Request) -> None:
        """Look-ahead: the sidecar keeps a queued request's blocks and moves them up."""
        most = self.config.kvtier.lookahead_requests
        if self.off or self.client is None or not most or _not_by_tokens(request):
            return
        if len(self.expected) >= most:
            return
        tokens = request.all_token_ids
        keys = self.blocks.keys(
            request.request_id, self._root(request), tokens, (len(tokens) - 1) // self.block_size
        )
        if keys:
            self.client.expect(request.request_id, keys)
            self.expected[request.request_id] = None

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        self.blocks.finished(request.request_id)
        self.requests.pop(request.request_id, None)
        self._unexpect([request.request_id])
        return False, None

    def _unexpect(self, request_ids: Sequence[str]) -> None:
        gone = [rid for rid in request_ids if self.expected.pop(rid, 0) is None]
        if gone and self.client is not None:
            self.client.unexpect(gone)

    def _lookup(self, keys: Sequence[bytes]) -> list[Tier]:
        return self.client.lookup(keys) if self.client is not None and keys else []

    def _root(self, request: Request) -> bytes:
        lora = request.lora_request.lora_name if request.lora_request is not None else None
        config = self.config
        return vllm_root(
            config.cache_namespace,
            config.model.name,
            self.block_size,
            self.device,
            salt=request.cache_salt,
            lora=lora,
        )

    # ---- worker side ----

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        if self.off or self.geometry is None:
            return
        try:
            self.cache = paged_cache([kv_caches[name] for name in self.layer_names], self.geometry)
        except (UnsupportedLayout, KeyError) as err:
            self.off = str(err)
            log.warning("strata connector off: %s", err)
            return
        self.client = self._client(self.cache.device)
        self.staging = Staging(self.cache, self.client)
        log.info(
            "strata connector on: %d layers, blocks of %d bytes (%s), rank %d",
            len(self.layer_names), self.client.block_bytes, "/".join(self.cache.kinds[:1]), self.rank,
        )  # fmt: skip

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        self.step_started = time.perf_counter()
        if self.staging is None or not self.has_connector_metadata():
            return
        for load in self._plan().loads:
            keys = [rank_key(k, self.rank) for k in load.keys]
            got = self.staging.load(keys, load.block_ids)
            self.load_errors.update(load.block_ids[got:])
        self.stats.add("load_s", time.perf_counter() - self.step_started)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: AttentionMetadata, **kwargs: Any
    ) -> None:
        return  # saved once the whole forward pass is done, in wait_for_save

    def wait_for_save(self) -> None:
        if self.staging is None or not self.has_connector_metadata():
            return
        plan, started = self._plan(), time.perf_counter()
        for save in plan.saves:
            self.staging.save([rank_ref(r, self.rank) for r in save.refs], save.block_ids)
        ended = time.perf_counter()
        self.stats.add("save_s", ended - started)
        if plan.tokens and self.step_started is not None:
            self.stats.add("busy_s", ended - self.step_started)
            if plan.prefill:
                self.stats.add("prefill_busy_s", ended - self.step_started)
        self.step_started = None

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        if self.stats.is_empty():
            return None
        stats, self.stats = self.stats, StrataStats()
        return stats

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> KVConnectorStats | None:
        return StrataStats(data=dict(data)) if data else StrataStats()

    @classmethod
    def build_prom_metrics(
        cls,
        vllm_config: VllmConfig,
        metric_types: dict[type, type],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> KVConnectorPromMetrics | None:
        return StrataPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors, self.load_errors = self.load_errors, set()
        return errors

    def shutdown(self) -> None:
        if self.client is not None:
            self.client.close()

    def _plan(self) -> plans.StepPlan:
        meta = self._get_connector_metadata()
        assert isinstance(meta, StrataMetadata)
        return meta.plan

    def _client(self, device: torch.device) -> TierClient:
        assert self.geometry is not None
        shape = (len(self.layer_names), *self.geometry.per_layer)
        dtype = self._kv_cache_config.kv_cache_groups[0].kv_cache_spec.dtype
        kvtier = self.config.kvtier
        return TierClient(
            kvtier.socket_path, shape, dtype, pins=self._pins(), threads=client_threads(device),
            gpu_hash=kvtier.gpu_checksums,
        )  # fmt: skip

    def _pins(self) -> list[bytes]:
        texts = self.config.kvtier.pinned_prefixes
        if not texts:
            return []
        tokenizer = load_tokenizer(self.config.model.path)
        root = vllm_root(self.config.cache_namespace, self.config.model.name, self.block_size, self.device)
        return [
            rank_key(k, self.rank)
            for t in texts
            for k in chain_hashes(root, tokenizer.encode(t), self.block_size)
        ]


def _geometry(kv_cache_config: KVCacheConfig, block_size: int) -> tuple[CacheGeometry | None, str]:
    """The cache's shape, or why the connector cannot serve this model (the reason logged)."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec

    groups = kv_cache_config.kv_cache_groups
    if len(groups) != 1:
        return None, f"{len(groups)} KV cache groups (a hybrid model); Strata serves one"
    spec = groups[0].kv_cache_spec
    if not isinstance(spec, FullAttentionSpec) or isinstance(spec, MLAAttentionSpec):
        return None, f"KV cache spec {type(spec).__name__}; Strata serves full attention"
    if spec.sliding_window is not None or spec.head_size_v != spec.head_size:
        return None, "sliding-window attention or distinct value heads; Strata serves plain full attention"
    return CacheGeometry(kv_cache_config.num_blocks, block_size, spec.num_kv_heads, spec.head_size), ""


def _new(output: SchedulerOutput) -> list[plans.Scheduled]:
    tokens = output.num_scheduled_tokens
    return [
        plans.Scheduled(r.req_id, r.block_ids[0], True, r.num_computed_tokens, tokens.get(r.req_id, 0))
        for r in output.scheduled_new_reqs
    ]


def _cached(output: SchedulerOutput) -> list[plans.Scheduled]:
    cached, tokens = output.scheduled_cached_reqs, output.num_scheduled_tokens
    out = []
    for i, rid in enumerate(cached.req_ids):
        ids = cached.new_block_ids[i]
        replace = rid in cached.resumed_req_ids
        out.append(
            plans.Scheduled(
                rid, ids[0] if ids else None, replace, cached.num_computed_tokens[i], tokens.get(rid, 0)
            )
        )
    return out


def _not_by_tokens(request: Request) -> bool:
    """Multimodal inputs and prompt embeddings: token ids do not say what the KV holds."""
    return bool(request.mm_features) or request.prompt_embeds is not None


def _tp_rank() -> int:
    try:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

        return int(get_tensor_model_parallel_rank())
    except (AssertionError, RuntimeError):  # no parallel groups set up
        return int(os.environ.get("RANK", "0"))
