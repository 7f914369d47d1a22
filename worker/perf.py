"""Throughput and latency measurements of a live engine, shared by the GPU check and the bench."""

from __future__ import annotations

import random
import time

from strata.worker.engine.llm_engine import LLMEngine
from strata.worker.engine.sequence import SamplingParams


def prompt_ids(n: int, seed: int) -> list[int]:
    """A reproducible prompt of ``n`` byte tokens (valid for any byte-level or larger vocab)."""
    rng = random.Random(seed)
    return [rng.randrange(32, 127) for _ in range(n)]


def ttft_s(engine: LLMEngine, prompt: list[int]) -> float:
    """Time to the first token of a lone request (prefill plus one sample)."""
    started = time.perf_counter()
    engine.generate(prompt, SamplingParams(max_tokens=1, ignore_eos=True))
    return time.perf_counter() - started


def decode_tok_s(engine: LLMEngine, prompts: list[list[int]], tokens: int) -> float:
    """Generated tokens per second once every request has finished its prefill."""
    params = SamplingParams(max_tokens=tokens, ignore_eos=True)
    seqs = [engine.add_request(p, params) for p in prompts]
    while any(not s.output_ids for s in seqs):
        engine.step()
    before = sum(len(s.output_ids) for s in seqs)
    started = time.perf_counter()
    while engine.has_unfinished():
        engine.step()
    elapsed = time.perf_counter() - started
    return (sum(len(s.output_ids) for s in seqs) - before) / elapsed
