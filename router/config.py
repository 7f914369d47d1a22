"""The router's configuration file schema (``router.yaml``), which the operator renders into the
service's ConfigMap. Parsed once at start-up; every part of the router reads the typed object."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from strata.common.blocks import BLOCK_SIZE
from strata.common.endpoints import SIDECAR_PORT, WORKER_PORT
from strata.common.hold import HOLD_MAX_REQUESTS, HOLD_TIMEOUT_S
from strata.router.weights import DEFAULT_WEIGHTS, TierWeights
from strata.worker.config import dump_yaml


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelConfig(_Strict):
    name: str = Field(min_length=1, description="Served model name; other names get the worker's 404.")
    path: str | None = Field(
        None,
        description="Directory with the model's tokenizer.json / tokenizer_config.json (chat template); "
        "None: the byte tokenizer and plain transcript of the test models.",
    )
    max_context_tokens: int = Field(ge=16, description="Prompt plus generated tokens per request.")
    vocab_size: int | None = Field(None, ge=1, description="Token ids of list prompts must be below it.")


class WorkersConfig(_Strict):
    """Where the workers are: watched Pods (in a cluster) or a fixed list (local runs)."""

    namespace: str | None = Field(None, description="Namespace of the worker Pods; None: the router's own.")
    label_selector: str = Field("", description="Label selector of the service's worker Pods.")
    static: list[str] = Field(
        default_factory=list, description="Fixed worker base URLs (http://host:port); replaces discovery."
    )
    port: int = Field(
        WORKER_PORT, ge=1, le=65535, description="The workers' HTTP port (OpenAI API, /kv/events)."
    )
    step_tokens: int = Field(
        2048, ge=1, description="The workers' max_batched_tokens: prompt tokens one engine step prefills."
    )
    kv_events_port: int | None = Field(
        SIDECAR_PORT,
        ge=1,
        le=65535,
        description="The KV-tier sidecars' metrics port (/kv/events); None: no sidecar.",
    )
    engine: Literal["torch", "vllm"] = Field(
        "torch",
        description="What serves at the workers' port: Strata's worker (its HBM block events at /kv/events) "
        "or vLLM (its KV events relayed by the sidecar at /kv/engine-events; requests validated by vLLM).",
    )
    device: Literal["cpu", "cuda"] = Field(
        "cuda", description="The workers' device: a vLLM engine's block keys are salted with it."
    )


class PriorityConfig(_Strict):
    """Request priority at the door: the tier's, or a header within the tier's bounds."""

    default: int = Field(0, description="Priority of requests that do not ask (the ServiceTier's).")
    min: int = Field(0, description="Lowest priority a request may ask for.")
    max: int = Field(0, description="Highest priority a request may ask for (the ServiceTier's).")
    header: str = Field("X-Strata-Priority", min_length=1)

    @model_validator(mode="after")
    def _ordered(self) -> PriorityConfig:
        if not self.min <= self.default <= self.max:
            raise ValueError(
                f"priority: need min <= default <= max, got {self.min}, {self.default}, {self.max}"
            )
        return self


class QueueConfig(_Strict):
    max_inflight_per_endpoint: int = Field(
        64, ge=1, description="Requests the router keeps in flight per worker; more wait at the router."
    )
    ttl_s: float = Field(
        30.0, gt=0, description="A request that would wait longer gets 429 with Retry-After (the tier's)."
    )
    max_len: int = Field(1024, ge=0, description="Waiting requests beyond this get 429 at once.")


class HoldConfig(_Strict):
    """Scale from zero: requests held while the service has no ready worker."""

    max_requests: int = Field(
        HOLD_MAX_REQUESTS, ge=0, description="Held requests beyond this get 503 at once."
    )
    timeout_s: float = Field(
        float(HOLD_TIMEOUT_S), gt=0, description="A request held longer gets 503 with Retry-After."
    )


class TimeoutsConfig(_Strict):
    connect_s: float = Field(5.0, gt=0, description="Connecting to a worker; past it, the next endpoint.")
    response_s: float = Field(
        600.0,
        gt=0,
        description="Waiting for a worker's response headers (a non-streamed response comes "
        "whole); past it the endpoint is marked down.",
    )
    events_silence_s: float = Field(
        5.0,
        gt=0,
        description="An event stream silent this long (pings come every second) is down, "
        "and so is its endpoint.",
    )


class RoutingConfig(_Strict):
    weights: TierWeights = DEFAULT_WEIGHTS
    balance_weight: float = Field(
        0.1, ge=0, description="Weight of the recent-token record (docs/router.md)."
    )
    load_bound: float | None = Field(1.5, ge=1, description="Bounded-load guard factor; None: off.")
    kv_full: float = Field(0.95, gt=0, le=1, description="KV usage at which an endpoint ranks last.")
    record_blocks: int = Field(
        100_000,
        ge=0,
        description="Blocks remembered per endpoint from the router's own routing, used "
        "when that endpoint's event stream is down.",
    )
    announce_queue: bool = Field(
        True,
        description="Tell each replica's KV-tier sidecar which requests wait here for it (look-ahead): "
        "it keeps their blocks and moves them up to DRAM before they arrive.",
    )
    max_followed_blocks: int | None = Field(
        None,
        ge=0,
        description="Block keys of the replicas' DRAM, NVMe and shared tiers the router follows and "
        "entries of its records, all together (about 160 bytes each); past it new keys are not followed "
        "and records keep fewer. Unset: half the router's container memory limit; no limit: all.",
    )


class RouterConfig(_Strict):
    model: ModelConfig
    block_size: int = Field(BLOCK_SIZE, ge=1, le=1024, description="The workers' KV block size (tokens).")
    cache_namespace: str = Field("default", min_length=1, description="The workers' block-hash salt.")
    host: str = "0.0.0.0"
    port: int = Field(8080, ge=1, le=65535)
    workers: WorkersConfig = WorkersConfig()
    priority: PriorityConfig = PriorityConfig()
    queue: QueueConfig = QueueConfig()
    hold: HoldConfig = HoldConfig()
    timeouts: TimeoutsConfig = TimeoutsConfig()
    routing: RoutingConfig = RoutingConfig()
    policy: Literal["strata", "round-robin"] = Field(
        "strata", description="round-robin: ignore caches and load (for side-by-side measurements)."
    )

    def to_yaml(self) -> str:
        return dump_yaml(self.model_dump(mode="json"))

    @classmethod
    def from_yaml(cls, text: str) -> RouterConfig:
        return cls.model_validate(yaml.safe_load(text) or {})

    @classmethod
    def load(cls, path: str | Path) -> RouterConfig:
        return cls.from_yaml(Path(path).read_text())
