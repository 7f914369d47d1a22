"""The worker's configuration file schema.

The worker owns this schema; the operator renders it into a ConfigMap (as YAML) and mounts it
at ``/etc/strata/worker.yaml``. The engine reads ``model``, ``engine`` and ``server``; the KV-tier
sidecar reads ``kvtier``; both read ``cache_namespace``. Must never import torch: the operator
imports it to render configs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from strata.common.blocks import BLOCK_SIZE
from strata.common.endpoints import SIDECAR_PORT, WORKER_PORT

# After server.drain_timeout_s the requests still running are cut off; the worker (and then the
# KV-tier sidecar) exits within this many seconds more. The pod's grace period covers both.
DRAIN_CUTOFF_S = 10.0
# The workers and routers check requests against this (set from a Secret through the
# InferenceService's spec.pod.env); unset: open. Here, not in the server, so the operator's
# renderers can name it without importing an HTTP server.
API_KEY_ENV = "STRATA_API_KEY"
# libyaml's emitter where PyYAML was built with it: about 4x faster than the pure-Python one, and
# the same text for these configs (tests/operator/test_render.py), so the ConfigMaps' hashes, and
# with them the pods, do not change. Rendering them was 7% of the operator's CPU in a burst.
YAML_DUMPER: type[yaml.SafeDumper] = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def dump_yaml(data: object) -> str:
    """A config file's text: keys in the schema's order."""
    return yaml.dump(data, Dumper=YAML_DUMPER, sort_keys=False)


EvictionPolicy = Literal["lru", "prefix-aware"]
AdmissionPolicy = Literal["always", "doorkeeper", "adaptive"]
WriteMode = Literal["write-through", "write-back"]
Dtype = Literal["float32", "bfloat16", "float16"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelConfig(_Strict):
    name: str = Field(min_length=1, description="Served model name, as clients pass it in `model`.")
    path: str = Field(min_length=1, description="Local directory with config.json and *.safetensors.")
    dtype: Dtype = Field("float32", description="Weights and KV-cache dtype.")
    max_context_tokens: int = Field(4096, ge=16, description="Prompt plus generated tokens per request.")
    kv_bytes_per_token: int | None = Field(
        None,
        ge=1,
        description="What the service says a token's KV takes (spec.model.kvBytesPerToken), which the "
        "operator sized the KV-tier sidecar's memory by; the engine warns when its model's differs.",
    )


class EngineConfig(_Strict):
    kind: Literal["torch", "vllm"] = Field(
        "torch",
        description="`torch`: this worker; `vllm`: a vLLM engine beside the sidecar, loading Strata's "
        "connector (which reads this file) and publishing its KV events for the sidecar to relay.",
    )
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="`auto` picks CUDA when present.")
    block_size: int = Field(BLOCK_SIZE, ge=1, le=1024, description="Tokens per KV-cache block.")
    num_gpu_blocks: int | None = Field(
        None, ge=1, description="KV blocks in device memory; None sizes it from `kv_memory_fraction`."
    )
    kv_memory_fraction: float = Field(
        0.9, gt=0, le=1, description="Share of free device memory (after weights) given to KV blocks."
    )
    kv_cache_bytes: int | None = Field(
        None,
        ge=1,
        description="Cap on the KV memory in device memory (bytes), below what `kv_memory_fraction` "
        "(or `cpu_kv_bytes`) gives; None: no cap.",
    )
    cpu_kv_bytes: int = Field(
        512 * 2**20, ge=1, description="KV memory on the CPU device, where free memory is not meaningful."
    )
    max_num_seqs: int = Field(64, ge=1, description="Most sequences in one batch.")
    max_batched_tokens: int = Field(
        2048, ge=16, description="Token budget per scheduler step (chunked prefill)."
    )
    max_queue_len: int = Field(256, ge=0, description="Waiting requests beyond this are refused with 429.")
    queue_timeout_s: float = Field(
        30.0, gt=0, description="A request still waiting after this long is refused with 429 and Retry-After."
    )
    default_priority: int = Field(0, description="Priority of requests that do not set one (higher first).")
    seed: int = Field(0, description="Seed for sampling.")
    cpu_threads: int | None = Field(
        None, ge=1, description="Torch intra-op threads; the pod's CPU limit (None: torch's default)."
    )


class ServerConfig(_Strict):
    host: str = "0.0.0.0"
    port: int = Field(
        WORKER_PORT, ge=1, le=65535, description="HTTP port: OpenAI API, /health, /ready, /metrics."
    )
    drain_timeout_s: float = Field(
        150.0,
        gt=0,
        description="After SIGTERM, how long accepted requests (queued and streaming) get to finish before "
        "the rest are cut off: engine.queue_timeout_s plus the longest generation. The pod's grace period "
        "must exceed it.",
    )
    ttft_slo_s: float | None = Field(
        None,
        gt=0,
        description="The service tier's TTFT target (s): requests whose first token came within it are "
        "counted in strata_worker_ttft_within_slo_total (SLO attainment).",
    )


class DramTierConfig(_Strict):
    capacity_bytes: int = Field(0, ge=0, description="Bytes of shared memory for warm KV blocks; 0 disables.")
    shm_path: str = Field("/dev/shm/strata-kv", description="File in the pod's memory-backed emptyDir.")
    eviction: EvictionPolicy = "prefix-aware"
    admission: AdmissionPolicy = Field(
        "always", description="Which blocks may enter: `always`, `doorkeeper` (second sighting), `adaptive`."
    )
    verify_reads: bool = Field(
        True,
        description="Check every block read from DRAM against its checksum (on a GPU node the check runs "
        "while the copy engine copies); off: CPU-bound reads run at copy speed, damage in shared memory "
        "goes unnoticed.",
    )
    persistent: bool = Field(
        True,
        description="Record which block each slot holds in a table beside `shm_path`, so that a restarted "
        "sidecar finds the blocks still in shared memory (verified by checksum); off: start empty.",
    )


class NvmeTierConfig(_Strict):
    capacity_bytes: int = Field(
        0, ge=0, description="Bytes on the local NVMe volume for cold KV; 0 disables."
    )
    path: str = Field("/var/cache/strata/nvme", description="Directory on the local NVMe volume.")
    eviction: EvictionPolicy = "prefix-aware"
    admission: AdmissionPolicy = Field(
        "always", description="Which blocks may enter: `always`, `doorkeeper` (second sighting), `adaptive`."
    )
    admit_after_hits: int = Field(
        1, ge=0, description="Write a block to NVMe only once it was seen this many times before (SSD wear)."
    )
    persistent: bool = Field(False, description="Keep and reload the index across sidecar restarts.")
    io_threads: int = Field(4, ge=1, le=64)


class SharedTierConfig(_Strict):
    enabled: bool = False
    path: str = Field("/var/cache/strata/shared", description="Directory on a ReadWriteMany volume.")
    capacity_bytes: int = Field(
        0,
        ge=0,
        description="The shared volume's size: what this worker may write, and what the volume's janitor "
        "keeps every worker's blocks within.",
    )


class KVTierConfig(_Strict):
    enabled: bool = Field(False, description="Run with the KV-tier sidecar; off means HBM-only caching.")
    socket_path: str = Field("/run/strata/kvtier.sock", description="Unix socket of the sidecar's protocol.")
    dram: DramTierConfig = DramTierConfig()
    nvme: NvmeTierConfig = NvmeTierConfig()
    shared: SharedTierConfig = SharedTierConfig()
    write_mode: WriteMode = Field(
        "write-back", description="write-through stores each block down every tier at once."
    )
    retention_s: float | None = Field(None, gt=0, description="Drop blocks unused for this long.")
    priority: int = Field(0, description="Service-tier priority; higher-priority blocks are evicted last.")
    pinned_prefixes: list[str] = Field(
        default_factory=list, description="Prompt prefixes (e.g. system prompts) kept resident in DRAM."
    )
    lookahead_requests: int = Field(
        64, ge=0, le=256, description="Queued requests whose blocks the tiers keep and move up; 0: none."
    )
    metrics_port: int = Field(
        SIDECAR_PORT, ge=1, le=65535, description="Port of the sidecar's /metrics and /health."
    )
    gpu_checksums: bool = Field(
        True,
        description="On a CUDA engine the GPU computes the blocks' checksums (Triton), where it can; "
        "false: the host's threads hash them, as without Triton.",
    )
    memory_bytes: int | None = Field(
        None,
        gt=0,
        description="The sidecar's memory (the DRAM tier's pages included): what its tiers' indexes are "
        "fitted within, the shared tier's first, then NVMe's. Unset: its container's cgroup limit; none: "
        "not fitted.",
    )


def engine_event_endpoints(kvtier: KVTierConfig) -> tuple[str, str]:
    """Where a vLLM engine publishes its KV events and answers replay requests: ZMQ ``ipc://``
    sockets beside the sidecar's own, in the pod's socket directory (vLLM binds them)."""
    run = Path(kvtier.socket_path).parent
    return f"ipc://{run / 'vllm-kv-events.sock'}", f"ipc://{run / 'vllm-kv-replay.sock'}"


class WorkerConfig(_Strict):
    model: ModelConfig
    engine: EngineConfig = EngineConfig()
    server: ServerConfig = ServerConfig()
    kvtier: KVTierConfig = KVTierConfig()
    cache_namespace: str = Field(
        "default",
        min_length=1,
        description="Tenant salt mixed into every block hash, so no tier serves one tenant's KV to another.",
    )

    @model_validator(mode="after")
    def _vllm_device_known(self) -> WorkerConfig:
        if self.engine.kind == "vllm" and self.engine.device == "auto":
            raise ValueError(
                "engine.device: a vllm engine needs cpu or cuda (its block keys are salted with it)"
            )
        return self

    @model_validator(mode="after")
    def _ports_differ(self) -> WorkerConfig:
        if self.kvtier.enabled and self.kvtier.metrics_port == self.server.port:
            raise ValueError("kvtier.metrics_port must differ from server.port")
        return self

    def to_yaml(self) -> str:
        return dump_yaml(self.model_dump(mode="json"))

    @classmethod
    def from_yaml(cls, text: str) -> WorkerConfig:
        return cls.model_validate(yaml.safe_load(text) or {})

    @classmethod
    def load(cls, path: str | Path) -> WorkerConfig:
        return cls.from_yaml(Path(path).read_text())
