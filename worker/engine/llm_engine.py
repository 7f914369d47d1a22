"""The engine: builds the parts from a WorkerConfig and runs the step loop.

One ``step()`` asks the tiers about the requests it may admit, schedules a batch (decisions
only), carries out the tier effects the schedule implies (save HBM evictions, load planned
blocks, announce the queue), runs the model once, publishes newly full blocks in the prefix
cache and samples. The engine is synchronous and not thread-safe: the server drives it from one
thread; tests and benchmarks call ``generate``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import torch

from strata.common.openai.chat_template import ChatTemplate, load_chat_template
from strata.worker import request_limits
from strata.worker.config import EngineConfig, WorkerConfig
from strata.worker.engine.block_manager import BlockManager
from strata.worker.engine.kv_tiers import TierBridge
from strata.worker.engine.model_runner import ModelRunner, block_bytes, block_shape
from strata.worker.engine.prefix_cache import PrefixCache
from strata.worker.engine.sampling import Sampler, token_logprob
from strata.worker.engine.scheduler import ScheduledBatch, Scheduler, SchedulerLimits
from strata.worker.engine.sequence import SamplingParams, Sequence, TokenLogprob
from strata.worker.engine.stats import EngineStats
from strata.worker.kv_connector import KVConnector, chain_hashes, root_hash
from strata.worker.models.decoder import DecoderForCausalLM
from strata.worker.models.errors import ModelLoadError
from strata.worker.models.generation import GenerationDefaults, load_generation_defaults
from strata.worker.models.hf_config import check_context
from strata.worker.models.loader import DTYPES, load_model
from strata.worker.request_limits import RequestError as RequestError  # re-exported
from strata.worker.tokenizer import Tokenizer, load_tokenizer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepOutput:
    seq: Sequence
    new_token_ids: list[int]
    finished: bool
    new_logprobs: list[TokenLogprob] = field(default_factory=list)  # when the request asked


def pick_device(choice: str) -> torch.device:
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(choice)


def apply_cpu_threads(cfg: EngineConfig) -> None:
    """Match torch's thread pool to the CPUs the pod may use: more threads than cores makes
    every small decode matmul wait on oversubscribed cores."""
    if cfg.cpu_threads is not None:
        torch.set_num_threads(cfg.cpu_threads)


def num_kv_blocks(cfg: EngineConfig, device: torch.device, bytes_per_block: int) -> int:
    if cfg.num_gpu_blocks is not None:
        return cfg.num_gpu_blocks
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        budget = int(free * cfg.kv_memory_fraction)
    else:
        budget = cfg.cpu_kv_bytes
    if cfg.kv_cache_bytes is not None:  # the service's HBM budget (spec.cache.hbm)
        budget = min(budget, cfg.kv_cache_bytes)
    return max(1, budget // bytes_per_block)


def kv_bytes_told_otherwise(told: int | None, actual: int) -> str | None:
    """Why the figure the service gave for a token's KV (``told``) is wrong, if it is."""
    if told is None or told == actual:
        return None
    effect = "larger than it needs" if told < actual else "maybe too small (then it indexes less)"
    return (
        f"spec.model.kvBytesPerToken: {told}, but this model's KV takes {actual} bytes a token; "
        f"the KV-tier sidecar's memory, sized by it, is {effect}"
    )


def warn_if_told_otherwise(told: int | None, actual: int) -> None:
    """Says the model's figure where the service gave none (for the user to give it), and warns
    where it gave another."""
    extra = {"event": "kv_bytes_per_token", "told": told, "actual": actual}
    problem = kv_bytes_told_otherwise(told, actual)
    if problem is not None:
        log.warning(problem, extra=extra)
    elif told is None:
        log.info("this model's KV takes %d bytes a token (spec.model.kvBytesPerToken)", actual, extra=extra)


class LLMEngine:
    def __init__(
        self,
        config: WorkerConfig,
        model: DecoderForCausalLM,
        tokenizer: Tokenizer,
        connector: KVConnector | None = None,
        chat_template: ChatTemplate | None = None,
        generation: GenerationDefaults | None = None,
    ) -> None:
        cfg = config.engine
        self.config = config
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.generation = generation or GenerationDefaults(frozenset(model.config.eos_token_ids))
        self.block_size = cfg.block_size
        weights = next(model.parameters())
        device = weights.device
        self.max_context = min(config.model.max_context_tokens, model.config.max_position_embeddings)
        check_context(model.config, self.max_context)
        per_block = block_bytes(model, cfg.block_size, weights.dtype)
        self.kv_bytes_per_token = per_block // cfg.block_size  # all layers, K and V, in HBM
        warn_if_told_otherwise(config.model.kv_bytes_per_token, self.kv_bytes_per_token)
        num_blocks = num_kv_blocks(cfg, device, per_block)
        self.runner = ModelRunner(model, num_blocks, cfg.block_size)
        self.blocks = BlockManager(num_blocks, cfg.block_size)
        self.stats = EngineStats()
        self.root_hash = root_hash(config.cache_namespace, config.model.name, cfg.block_size)
        self.prefix = PrefixCache(self.blocks, self.root_hash, self.stats)
        write_through = config.kvtier.write_mode == "write-through"
        lookahead = config.kvtier.lookahead_requests
        self.tiers = TierBridge(
            connector, self.blocks, self.runner, self.prefix, write_through, lookahead, self.stats
        )
        limits = SchedulerLimits(
            cfg.max_num_seqs, cfg.max_batched_tokens, cfg.max_queue_len, cfg.queue_timeout_s
        )
        self.scheduler = Scheduler(limits, self.blocks, self.prefix, self.stats)
        self.sampler = Sampler(cfg.seed, device)
        self._seqs: dict[int, Sequence] = {}

    @classmethod
    def from_config(
        cls, config: WorkerConfig, connector: KVConnector | None = None, *, connect_tiers: bool = False
    ) -> LLMEngine:
        """Load the model and build the engine. With ``connect_tiers`` and ``kvtier.enabled``
        (and no ``connector`` given) it connects to the KV-tier sidecar, as the server does."""
        apply_cpu_threads(config.engine)
        device = pick_device(config.engine.device)
        dtype = DTYPES[config.model.dtype]
        model = load_model(config.model.path, dtype, device)
        tokenizer = load_tokenizer(config.model.path)
        generation = load_generation_defaults(config.model.path, tokenizer)
        try:
            chat_template = load_chat_template(config.model.path)
        except ValueError as exc:
            raise ModelLoadError(str(exc)) from exc
        if connector is None and connect_tiers and config.kvtier.enabled:
            from strata.worker.kvtier.client import connect  # only workers with the sidecar need it

            connector = connect(config, block_shape(model, config.engine.block_size), dtype, device)
        return cls(config, model, tokenizer, connector, chat_template, generation)

    @property
    def device(self) -> torch.device:
        return self.runner.device

    @property
    def kv_dtype(self) -> torch.dtype:
        return self.runner.dtype

    @property
    def block_shape(self) -> tuple[int, ...]:
        return self.runner.block_shape

    def block_tensor(self, block_id: int) -> torch.Tensor:
        return self.runner.block(block_id)

    def block_hashes(self, token_ids: list[int]) -> list[bytes]:
        return chain_hashes(self.root_hash, token_ids, self.block_size)

    def add_request(
        self, token_ids: list[int], params: SamplingParams, priority: int | None = None
    ) -> Sequence:
        """Queue a request; raises RequestError for one that can never run, QueueFull when full."""
        self.validate(token_ids, params)
        prio = self.config.engine.default_priority if priority is None else priority
        seq = Sequence(list(token_ids), params, prio)
        self.scheduler.add(seq)
        self._seqs[seq.seq_id] = seq
        self.tiers.sync_queue(self.scheduler.queue(self.tiers.lookahead))  # start moving its blocks up
        return seq

    def validate(self, token_ids: list[int], params: SamplingParams) -> None:
        vocab = self.runner.model.config.vocab_size
        request_limits.check(token_ids, params.max_tokens, self.max_context, vocab)
        if any(not 0 <= t < vocab for t in params.stop_token_ids):
            raise RequestError("stop_token_ids", f"token ids must be in [0, {vocab})")
        if -(-(len(token_ids) + params.max_tokens) // self.block_size) > self.blocks.num_blocks:
            raise RequestError("max_tokens", "request needs more KV blocks than the cache holds")

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def abort(self, seq_id: int) -> None:
        seq = self._seqs.pop(seq_id, None)
        if seq is not None and not seq.is_finished:
            self.scheduler.finish(seq, "abort")
            self.sampler.forget(seq_id)

    def step(self) -> list[StepOutput]:
        started = time.monotonic()
        self.tiers.lookup(self.scheduler.next_admissions())
        batch = self.scheduler.schedule(time.monotonic())
        outputs = [self._forget(seq, []) for seq in batch.rejected]  # the scheduler finished them
        items = self._apply_tier_effects(batch)
        if not items:
            return outputs
        logits = self.runner.run(items)
        computed = self.stats.recomputed_tokens
        row = 0
        for seq, n in items:
            # a decode step feeds back the last sampled token; everything else is (re)computed context
            decode = n == 1 and seq.num_computed_tokens + 1 == seq.num_tokens > seq.num_prompt_tokens
            self.stats.recomputed_tokens += n - int(decode)
            seq.num_computed_tokens += n
            self.tiers.computed(self.prefix.register_computed(seq))
            if seq.num_computed_tokens < seq.num_tokens:
                continue  # a prefill chunk short of the end: no token yet
            outputs.append(self._append(seq, logits[row]))
            row += 1
        # Scheduling (tier loads at admission), saves and the forward pass: the step's wall time.
        elapsed = time.monotonic() - started
        self.stats.busy_seconds += elapsed
        if self.stats.recomputed_tokens > computed:  # a prompt chunk: prefill load (the autoscaler's)
            self.stats.prefill_busy_seconds += elapsed
        return outputs

    def _apply_tier_effects(self, batch: ScheduledBatch) -> list[tuple[Sequence, int]]:
        """Save what HBM evicted (before those blocks are written), load the planned blocks,
        count the admitted requests' hits, tell the tiers what still waits. Sequences whose
        load came up short sit this step out and compute the rest from the next one."""
        self.tiers.save_evictions()
        short = {seq.seq_id for seq in self.tiers.load(batch.loads)}
        for seq in batch.admitted:
            self.prefix.admitted(seq)
        self.tiers.sync_queue(self.scheduler.queue(self.tiers.lookahead))
        return [(seq, n) for seq, n in batch.items if seq.seq_id not in short]

    def _append(self, seq: Sequence, logits: torch.Tensor) -> StepOutput:
        if seq.params.keep_logits:
            seq.logits.append(logits.detach().cpu().clone())
        token = self.sampler.sample(seq.seq_id, logits, seq.params)
        seq.token_ids.append(token)
        new_logprobs = []
        if seq.params.logprobs is not None:
            new_logprobs.append(token_logprob(logits, token, seq.params.logprobs))
            seq.logprobs += new_logprobs
        self.stats.generation_tokens += 1
        reason = self._stop_reason(seq, token)
        if reason is None:
            return StepOutput(seq, [token], False, new_logprobs)
        return self._finish(seq, reason, [token], new_logprobs)

    def _stop_reason(self, seq: Sequence, token: int) -> str | None:
        p = seq.params
        if (token in self.generation.eos_token_ids and not p.ignore_eos) or token in p.stop_token_ids:
            return "stop"
        if len(seq.output_ids) >= p.max_tokens or seq.num_tokens >= self.max_context:
            return "length"
        return None

    def _finish(
        self, seq: Sequence, reason: str, tokens: list[int], logprobs: list[TokenLogprob]
    ) -> StepOutput:
        self.scheduler.finish(seq, reason)
        return self._forget(seq, tokens, logprobs)

    def _forget(
        self, seq: Sequence, tokens: list[int], logprobs: list[TokenLogprob] | None = None
    ) -> StepOutput:
        self.sampler.forget(seq.seq_id)
        self._seqs.pop(seq.seq_id, None)
        return StepOutput(seq, tokens, True, logprobs or [])

    def generate(self, token_ids: list[int], params: SamplingParams, priority: int | None = None) -> Sequence:
        """Run one request to completion (tests and benchmarks); other queued work runs too."""
        return self.generate_batch([token_ids], params, priority)[0]

    def generate_batch(
        self, prompts: list[list[int]], params: SamplingParams, priority: int | None = None
    ) -> list[Sequence]:
        seqs = [self.add_request(p, params, priority) for p in prompts]
        while not all(s.is_finished for s in seqs):
            self.step()
        return seqs

    def evict_cached_blocks(self) -> int:
        """Push every unreferenced cached block out of HBM (to the tiers, when connected)."""
        count = self.blocks.evict_cached()
        self.tiers.save_evictions()
        return count

    def close(self) -> None:
        self.tiers.close()
