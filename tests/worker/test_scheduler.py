"""Scheduling decisions: priority order, preemption by priority, refusal, timeouts."""

from __future__ import annotations

import time

import pytest

from strata.worker.engine.scheduler import QueueFull, blocks_needed, pick_victim, priority_key, timed_out
from strata.worker.engine.sequence import SamplingParams, Sequence
from tests.worker.conftest import EngineFactory, prompt_of

PARAMS = SamplingParams(max_tokens=4, ignore_eos=True)


def seq(priority: int, arrival: float, outputs: int = 0) -> Sequence:
    s = Sequence([1, 2, 3], PARAMS, priority, arrival_s=arrival)
    s.token_ids += [7] * outputs
    return s


def test_priority_then_arrival_order() -> None:
    a, b, c = seq(0, 1.0), seq(5, 2.0), seq(0, 0.5)
    assert sorted([a, b, c], key=priority_key) == [b, c, a]


def test_victim_is_lowest_priority_latest_arrival() -> None:
    a, b, c = seq(1, 1.0), seq(0, 2.0), seq(0, 3.0)
    assert pick_victim([a, b, c]) is c


def test_blocks_needed_counts_only_new_blocks() -> None:
    s = seq(0, 0.0)
    assert blocks_needed(s, 3, 4) == 1
    s.block_table, s.num_computed_tokens = [0], 3
    assert blocks_needed(s, 1, 4) == 0
    assert blocks_needed(s, 2, 4) == 1


def test_timeout_only_for_requests_that_produced_nothing() -> None:
    assert timed_out(seq(0, 0.0), now=10.0, timeout_s=5.0)
    assert not timed_out(seq(0, 8.0), now=10.0, timeout_s=5.0)
    assert not timed_out(seq(0, 0.0, outputs=2), now=10.0, timeout_s=5.0)  # preempted, resumes


def test_full_queue_refuses(make_engine: EngineFactory) -> None:
    engine = make_engine(max_queue_len=2)
    engine.add_request(prompt_of(5, 1), PARAMS)
    engine.add_request(prompt_of(5, 2), PARAMS)
    with pytest.raises(QueueFull):
        engine.add_request(prompt_of(5, 3), PARAMS)
    assert engine.stats.rejected["queue_full"] == 1


def test_waiting_past_the_timeout_is_refused_not_dropped(make_engine: EngineFactory) -> None:
    engine = make_engine(queue_timeout_s=5.0)
    seq_ = engine.add_request(prompt_of(5, 1), PARAMS)
    seq_.arrival_s = time.monotonic() - 6.0
    outputs = engine.step()
    assert [(o.seq, o.finished) for o in outputs] == [(seq_, True)]
    assert seq_.finish_reason == "queue_timeout"
    assert engine.stats.rejected["queue_timeout"] == 1
    assert not engine.has_unfinished()


def test_higher_priority_request_runs_first(make_engine: EngineFactory) -> None:
    engine = make_engine(max_num_seqs=1)
    low = engine.add_request(prompt_of(8, 1), PARAMS, priority=0)
    high = engine.add_request(prompt_of(8, 2), PARAMS, priority=10)
    engine.step()
    assert high.output_ids and not low.output_ids


def test_higher_priority_arrival_preempts_lower_priority_work(make_engine: EngineFactory) -> None:
    engine = make_engine(num_gpu_blocks=8, max_batched_tokens=64)
    low = engine.add_request(prompt_of(24, 1), SamplingParams(max_tokens=6, ignore_eos=True), priority=0)
    engine.step()
    assert low.output_ids  # running, holding 7 of 8 blocks
    high = engine.add_request(prompt_of(20, 2), PARAMS, priority=5)
    engine.step()
    assert low.num_preemptions == 1 and high.output_ids
    while engine.has_unfinished():
        engine.step()
    assert low.finish_reason == "length" and len(low.output_ids) == 6


def test_equal_priority_does_not_preempt(make_engine: EngineFactory) -> None:
    engine = make_engine(num_gpu_blocks=8, max_batched_tokens=64)
    first = engine.add_request(prompt_of(24, 1), SamplingParams(max_tokens=3, ignore_eos=True))
    engine.step()
    second = engine.add_request(prompt_of(20, 2), PARAMS)
    engine.step()
    assert first.num_preemptions == 0 and not second.output_ids
    while engine.has_unfinished():
        engine.step()
    assert second.finish_reason == "length"


def test_requests_that_can_never_fit_are_refused_up_front(make_engine: EngineFactory) -> None:
    engine = make_engine(num_gpu_blocks=4)
    with pytest.raises(ValueError, match="max_tokens"):
        engine.add_request(prompt_of(10, 1), SamplingParams(max_tokens=10))
    with pytest.raises(ValueError, match="prompt"):
        engine.add_request([], PARAMS)
    with pytest.raises(ValueError, match="prompt"):
        engine.add_request(prompt_of(1024, 1), PARAMS)
