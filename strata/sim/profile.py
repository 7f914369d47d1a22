"""The service model of one replica: what an engine step costs, how much KV fits, how fast each
cache tier reads, how long a pod takes to start. Every figure has a source (``sources``), listed
with the reasoning in docs/autoscaling.md.

A step runs one forward pass over everything the scheduler picked (chunked prefill and decode
tokens together, as the worker's continuous batching does)::

    step_s = overhead_s + max(floor_s, prefill compute + decode_seq_s * decode sequences)
             + decode_context_token_s * context tokens the decode sequences read

    prefill compute of a chunk of n new tokens after c computed ones
           = n * prefill_token_s + attention_pair_s * n * (c + n / 2)

``floor_s`` is the memory-bound floor of a forward pass (reading the weights once); prefill is
compute-bound (linear layers per token, attention per token pair); decode reads every context
token's KV once per step. Loading blocks from a cache tier costs ``bytes / read bandwidth`` plus
one ``read_latency_s`` per tier touched, and stalls the step that admits the request, as the
worker's synchronous ``KVConnector.load`` does. A client sees the first token
``request_overhead_s`` after the step that sampled it (the API server's path around the engine).
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from strata.common.blocks import BLOCK_SIZE
from strata.common.tiers import LowerTier

GB = 1e9


class ProfileError(ValueError):
    """A profile that cannot be used; the message names the field."""


class ReadBandwidth(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    dram: float = Field(gt=0, description="GB/s from the DRAM tier into the engine's KV cache.")
    nvme: float = Field(gt=0, description="GB/s from the NVMe tier into the engine's KV cache.")
    shared: float = Field(gt=0, description="GB/s from the shared tier into the engine's KV cache.")

    def of(self, tier: LowerTier) -> float:
        value: float = getattr(self, tier)
        return value


class Profile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    description: str = ""
    kv_bytes_per_token: int = Field(gt=0, description="KV bytes of one token, all layers.")
    kv_cache_bytes: int | None = Field(
        None, gt=0, description="KV memory per replica, fixed (the CPU engine's cpu_kv_bytes)."
    )
    memory_free_bytes: int | None = Field(
        None, gt=0, description="Device memory after the weights; the tier's hbm.kvFraction of it holds KV."
    )
    engine_block_tokens: int = Field(BLOCK_SIZE, ge=1, description="The engine's block size (tokens).")
    max_batched_tokens: int = Field(ge=16, description="Token budget of one step (chunked prefill).")
    max_num_seqs: int = Field(ge=1, description="Most sequences in one batch.")
    max_queue_len: int = Field(256, ge=0, description="Waiting requests beyond this are refused (429).")
    queue_timeout_s: float = Field(30.0, gt=0, description="Waiting longer than this is refused (429).")
    overhead_s: float = Field(ge=0, description="Per step: scheduling, launch, sampling.")
    floor_s: float = Field(ge=0, description="Per step: the memory-bound floor (weights read once).")
    prefill_token_s: float = Field(gt=0, description="Per computed prompt token: linear layers.")
    attention_pair_s: float = Field(ge=0, description="Per (new token, context token) pair in prefill.")
    decode_seq_s: float = Field(ge=0, description="Per sequence in a decode step: compute, sampling.")
    decode_context_token_s: float = Field(ge=0, description="Per context token a decode step reads.")
    request_overhead_s: float = Field(
        0.0,
        ge=0,
        description="Per request, outside the engine: the API path (HTTP, parsing, streaming the first "
        "token back), added to the TTFT a client sees.",
    )
    read_gbps: ReadBandwidth
    read_latency_s: float = Field(0.0, ge=0, description="Per tier read batch (a request's load).")
    startup_s: float = Field(ge=0, description="Pod start: scheduling, model load, warm-up, until Ready.")
    sources: tuple[str, ...] = ()

    def hbm_bytes(self, kv_fraction: float) -> int:
        if self.kv_cache_bytes is not None:
            return self.kv_cache_bytes
        assert self.memory_free_bytes is not None
        return int(self.memory_free_bytes * kv_fraction)

    def prefill_s(self, new_tokens: int, context: int) -> float:
        """Compute of a prefill chunk of ``new_tokens`` after ``context`` computed tokens."""
        pairs = new_tokens * (context + new_tokens / 2)
        return new_tokens * self.prefill_token_s + self.attention_pair_s * pairs

    def step_s(self, prefill_compute_s: float, decode_seqs: int, decode_context: int) -> float:
        compute = prefill_compute_s + self.decode_seq_s * decode_seqs
        return self.overhead_s + max(self.floor_s, compute) + self.decode_context_token_s * decode_context

    def read_s(self, tier: LowerTier, nbytes: int) -> float:
        return self.read_latency_s + nbytes / (self.read_gbps.of(tier) * GB)

    def lone_prefill_s(self, tokens: int, cached: int = 0) -> float:
        """A request alone on an idle replica: its uncached prompt in ``max_batched_tokens``
        chunks (each chunk a step; the last one samples the first token)."""
        total, done = 0.0, cached
        while True:
            chunk = min(self.max_batched_tokens, tokens - done)
            total += self.step_s(self.prefill_s(chunk, done), 0, 0)
            done += chunk
            if done >= tokens:
                return total


def load(path: str | Path) -> Profile:
    source = Path(path)
    try:
        raw = yaml.safe_load(source.read_text())
    except OSError as err:
        raise ProfileError(f"{source}: cannot read: {err.strerror or err}") from err
    except yaml.YAMLError as err:
        raise ProfileError(f"{source}: not YAML: {err}") from err
    try:
        return Profile.model_validate(raw)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "profile"
        raise ProfileError(f"{source}: {where}: {first['msg']}") from err
