"""Greedy decoding through the paged cache equals full recomputation without a cache."""

from __future__ import annotations

import torch

from strata.worker.engine.sequence import SamplingParams, Sequence
from tests.worker.conftest import EngineFactory, prompt_of, reference_decode

GREEDY = SamplingParams(max_tokens=6, ignore_eos=True, keep_logits=True)


def assert_matches_reference(seq: Sequence, engine) -> None:
    tokens, logits = reference_decode(engine, seq.token_ids[: seq.num_prompt_tokens], len(seq.output_ids))
    assert seq.output_ids == tokens
    for got, want in zip(seq.logits, logits, strict=True):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_paged_decode_equals_recomputation(make_engine: EngineFactory) -> None:
    engine = make_engine()
    seq = engine.generate(prompt_of(37, seed=1), GREEDY)
    assert len(seq.output_ids) == 6 and seq.finish_reason == "length"
    assert_matches_reference(seq, engine)


def test_chunked_prefill_equals_recomputation(make_engine: EngineFactory) -> None:
    engine = make_engine(max_batched_tokens=16)  # a 70-token prompt takes five steps
    seq = engine.generate(prompt_of(70, seed=2), GREEDY)
    assert_matches_reference(seq, engine)


def test_prefix_cache_hit_decodes_the_same(make_engine: EngineFactory) -> None:
    engine = make_engine()
    prompt = prompt_of(42, seed=3)
    first = engine.generate(prompt, GREEDY)
    again = engine.generate(prompt, GREEDY)
    assert first.hit_tokens["hbm"] == 0
    assert again.hit_tokens["hbm"] == 40  # all ten full blocks; the last 2 tokens are computed
    assert again.output_ids == first.output_ids
    assert_matches_reference(again, engine)
    # A prompt sharing only a prefix hits that prefix and nothing after it.
    branch = engine.generate(prompt[:20] + prompt_of(15, seed=4), GREEDY)
    assert branch.hit_tokens["hbm"] == 20
    assert_matches_reference(branch, engine)


def test_prompt_that_is_exactly_cached_still_computes_its_last_token(make_engine: EngineFactory) -> None:
    engine = make_engine()
    prompt = prompt_of(16, seed=5)
    engine.generate(prompt, GREEDY)
    again = engine.generate(prompt, GREEDY)
    assert again.hit_tokens["hbm"] == 12
    assert_matches_reference(again, engine)


def test_preemption_and_resume_decode_the_same(make_engine: EngineFactory) -> None:
    # 14 blocks of 4 tokens cannot hold three 20-token prompts growing by 12 tokens each.
    engine = make_engine(num_gpu_blocks=14, max_batched_tokens=64)
    params = SamplingParams(max_tokens=12, ignore_eos=True, keep_logits=True)
    seqs = engine.generate_batch([prompt_of(20, seed=10 + i) for i in range(3)], params)
    assert engine.stats.preemptions > 0
    assert any(s.num_preemptions for s in seqs)
    for seq in seqs:
        tokens, _ = reference_decode(engine, seq.token_ids[: seq.num_prompt_tokens], 12)
        assert seq.output_ids == tokens
    assert engine.blocks.num_free_blocks == engine.blocks.num_blocks


def test_results_do_not_depend_on_the_batch(make_engine: EngineFactory) -> None:
    prompts = [prompt_of(n, seed=20 + n) for n in (9, 23, 31, 4)]
    alone = [make_engine().generate(p, GREEDY) for p in prompts]
    batched = make_engine(max_batched_tokens=32).generate_batch(prompts, GREEDY)
    for a, b in zip(alone, batched, strict=True):
        assert a.output_ids == b.output_ids
        for x, y in zip(a.logits, b.logits, strict=True):
            torch.testing.assert_close(x, y, atol=1e-4, rtol=1e-4)


def test_sampling_with_a_seed_is_reproducible(make_engine: EngineFactory) -> None:
    params = SamplingParams(max_tokens=8, temperature=0.9, top_p=0.9, seed=7, ignore_eos=True)
    a = make_engine().generate(prompt_of(10, seed=30), params)
    engine = make_engine()
    b = engine.generate_batch([prompt_of(10, seed=30), prompt_of(12, seed=31)], params)[0]
    assert a.output_ids == b.output_ids


def test_blocks_are_released_after_requests_finish(make_engine: EngineFactory) -> None:
    engine = make_engine()
    engine.generate_batch([prompt_of(30, seed=40), prompt_of(30, seed=41)], GREEDY)
    assert engine.blocks.usage == 0.0
    assert engine.blocks.num_cached_blocks > 0  # kept for later prefix hits
    assert not engine.has_unfinished()


def test_shared_prefixes_under_memory_pressure_still_decode_exactly(make_engine: EngineFactory) -> None:
    # Requests share prefixes (blocks with several references), the pool is tight (preemption,
    # eviction of cached blocks) and the budget small (chunked prefill mixed with decode).
    engine = make_engine(num_gpu_blocks=24, max_batched_tokens=24, max_num_seqs=4)
    system = prompt_of(24, seed=50)
    prompts = [system + prompt_of(n, seed=60 + n) for n in (3, 9, 14, 20)] + [prompt_of(30, seed=70), system]
    params = SamplingParams(max_tokens=10, ignore_eos=True)
    seqs = [engine.add_request(p, params, priority=i % 3) for i, p in enumerate(prompts)]
    while engine.has_unfinished():
        engine.step()
    assert sum(s.hit_tokens.get("hbm", 0) for s in seqs) > 0 and engine.stats.preemptions > 0
    for seq, prompt in zip(seqs, prompts, strict=True):
        assert seq.output_ids == reference_decode(engine, prompt, 10)[0]
    assert engine.blocks.usage == 0.0
