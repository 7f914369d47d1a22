"""One request's state inside the engine: its tokens, progress, blocks and outcome."""

from __future__ import annotations

import enum
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

from strata.worker.kv_connector import Tier, block_hash

_ids = itertools.count()


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 0.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0: every token
    seed: int | None = None
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    logprobs: int | None = None  # None: none; k: the sampled token's and the k most likely
    keep_logits: bool = False  # keep each step's logits (tests compare them to a reference)


@dataclass(frozen=True)
class TokenLogprob:
    """Log-probabilities under the model's own distribution (before temperature or top-p)."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]  # the most likely tokens, best first


@dataclass(eq=False)
class Sequence:
    """``num_computed_tokens`` counts tokens whose KV is in the cache; the engine schedules the
    rest (a prompt chunk, or the last sampled token), so prefill, decode and resume after
    preemption are the same operation."""

    token_ids: list[int]
    params: SamplingParams
    priority: int = 0
    seq_id: int = field(default_factory=lambda: next(_ids))
    arrival_s: float = field(default_factory=time.monotonic)
    status: SeqStatus = SeqStatus.WAITING
    num_prompt_tokens: int = 0
    num_computed_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    num_registered_blocks: int = 0  # leading blocks already offered to the prefix cache
    block_hashes: list[bytes] = field(default_factory=list)  # chain of the full blocks so far
    finish_reason: str | None = None
    num_preemptions: int = 0
    admitted: bool = False  # counted in prompt/prefix-hit statistics once
    hit_tokens: dict[Tier, int] = field(default_factory=dict)
    logits: list[Any] = field(default_factory=list)  # torch tensors; this module stays torch-free
    logprobs: list[TokenLogprob] = field(default_factory=list)  # per output token, when asked

    def __post_init__(self) -> None:
        if not self.num_prompt_tokens:
            self.num_prompt_tokens = len(self.token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def is_finished(self) -> bool:
        return self.status is SeqStatus.FINISHED

    def block_tokens(self, index: int, block_size: int) -> list[int]:
        return self.token_ids[index * block_size : (index + 1) * block_size]

    def full_block_hashes(self, root: bytes, block_size: int) -> list[bytes]:
        """Chained hashes of every full block, extended incrementally as tokens arrive."""
        for i in range(len(self.block_hashes), self.num_tokens // block_size):
            parent = self.block_hashes[i - 1] if i else root
            self.block_hashes.append(block_hash(parent, self.block_tokens(i, block_size)))
        return self.block_hashes

    def reset_for_recompute(self) -> None:
        """Recompute-style preemption: the KV is dropped; prompt and output so far are kept."""
        self.block_table = []
        self.num_computed_tokens = 0
        self.num_registered_blocks = 0
        self.status = SeqStatus.WAITING
        self.num_preemptions += 1
