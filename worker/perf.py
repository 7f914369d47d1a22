"""Throughput and latency measurements of a live engine, shared by the GPU check and the bench.

Every loop here ends, whatever the machine: when its requests have produced what it measures,
when the engine ends one early (a request that outlives the engine's queue timeout is rejected
and never produces a token), on an error from the engine, or at a bound of engine steps that a
healthy run never reaches. Anything but success raises :class:`MeasurementError` saying which."""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable

from strata.worker.engine.llm_engine import LLMEngine
from strata.worker.engine.sequence import SamplingParams, Sequence

STEP_BOUND_FACTOR = 4  # a healthy run needs at most 1/4 of the bound, preemptions included
STEP_BOUND_SLACK = 64


class MeasurementError(RuntimeError):
    """A measurement loop ended before its requests produced what it measures."""


def prompt_ids(n: int, seed: int) -> list[int]:
    """A reproducible prompt of ``n`` byte tokens (valid for any byte-level or larger vocab)."""
    rng = random.Random(seed)
    return [rng.randrange(32, 127) for _ in range(n)]


def step_bound(engine: LLMEngine, prompts: list[list[int]], max_tokens: int) -> int:
    """Engine steps the requests may take: their prefill in chunks of the step's token budget,
    then one step per generated token, several times over (the count is machine-independent)."""
    prefill = -(-sum(len(p) for p in prompts) // engine.config.engine.max_batched_tokens)
    return STEP_BOUND_FACTOR * (prefill + max_tokens) + STEP_BOUND_SLACK


def run_until(
    engine: LLMEngine, seqs: list[Sequence], done: Callable[[Sequence], bool], bound: int, what: str
) -> int:
    """Step the engine until ``done`` holds for every request; returns the steps taken. Raises
    MeasurementError when a request ends without it or after ``bound`` steps (the requests are
    aborted first, so the engine stays usable)."""
    steps = 0
    while not all(done(s) for s in seqs):
        ended = [s for s in seqs if s.is_finished and not done(s)]
        if ended or steps >= bound:
            why = _why(what, seqs, ended, done, bound)
            _abort(engine, seqs)
            raise MeasurementError(why)
        engine.step()
        steps += 1
    return steps


def _why(
    what: str, seqs: list[Sequence], ended: list[Sequence], done: Callable[[Sequence], bool], bound: int
) -> str:
    if ended:
        reasons = Counter(s.finish_reason or "unknown" for s in ended)
        listed = ", ".join(f"{n} {reason}" for reason, n in sorted(reasons.items()))
        return f"{what}: {len(ended)} of {len(seqs)} requests ended early by the engine ({listed})"
    finished = sum(1 for s in seqs if done(s))
    return f"{what}: only {finished} of {len(seqs)} requests done after {bound} engine steps"


def _abort(engine: LLMEngine, seqs: list[Sequence]) -> None:
    for seq in seqs:
        engine.abort(seq.seq_id)


def _first_token(seq: Sequence) -> bool:
    return bool(seq.output_ids)


def _completed(seq: Sequence) -> bool:
    return seq.finish_reason in ("length", "stop")


def ttft_s(engine: LLMEngine, prompt: list[int]) -> float:
    """Time to the first token of a lone request (prefill plus one sample)."""
    params = SamplingParams(max_tokens=1, ignore_eos=True)
    started = time.perf_counter()
    seq = engine.add_request(prompt, params)
    run_until(engine, [seq], _completed, step_bound(engine, [prompt], 1), "time to first token")
    return time.perf_counter() - started


def decode_tok_s(engine: LLMEngine, prompts: list[list[int]], tokens: int) -> float:
    """Generated tokens per second once every request has finished its prefill."""
    params = SamplingParams(max_tokens=tokens, ignore_eos=True)
    seqs = [engine.add_request(p, params) for p in prompts]
    bound = step_bound(engine, prompts, tokens)
    what = f"decode of {len(prompts)} requests"
    run_until(engine, seqs, _first_token, bound, f"{what}, waiting for every first token")
    before = sum(len(s.output_ids) for s in seqs)
    started = time.perf_counter()
    run_until(engine, seqs, _completed, bound, f"{what}, decoding")
    elapsed = time.perf_counter() - started
    return (sum(len(s.output_ids) for s in seqs) - before) / elapsed
