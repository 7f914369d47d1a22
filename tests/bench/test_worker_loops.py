"""The worker benchmark's loops end, whatever the engine does, and say what happened: on a slow
machine its batched requests outlived the engine's queue timeout and a loop spun forever."""

from __future__ import annotations

import pytest
import torch

from bench import bench_worker
from strata.worker import perf
from strata.worker.engine.sequence import SamplingParams
from strata.worker.models.presets import write_model

torch.set_num_threads(1)  # the machine is shared; the tiny model gains nothing from more threads
SIZES = {"1k": 1024}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(write_model(tmp_path_factory.mktemp("tiny"), "tiny"))


def test_every_loop_ends_when_the_engine_rejects_its_requests(model_dir: str) -> None:
    engine = bench_worker.engine_for(model_dir, "tiny", queue_timeout_s=1e-9)  # nothing can wait
    measured = bench_worker.measure(engine, SIZES, batch=16)
    assert set(measured["incomplete"]) == {"ttft_cold_1k", "ttft_hit_1k", "decode_1k", "decode_batch16"}
    for message in measured["incomplete"].values():
        assert "ended early by the engine" in message and "queue_timeout" in message, message
    assert "16 of 16 requests" in measured["incomplete"]["decode_batch16"]
    assert measured["batched_decode"] is None and measured["sizes"]["1k"]["cold"] is None
    assert not engine.has_unfinished()  # the loops left nothing queued behind them


def test_the_same_loops_measure_when_nothing_is_rejected(model_dir: str) -> None:
    engine = bench_worker.engine_for(model_dir, "tiny")
    measured = bench_worker.measure(engine, SIZES, batch=4)
    assert measured["incomplete"] == {}
    figures = measured["sizes"]["1k"]
    assert figures["cold"] > 0 and figures["hit"] > 0 and figures["decode"] > 0
    assert measured["batched_decode"] > 0


def test_a_loop_past_its_step_bound_ends_and_says_so(model_dir: str) -> None:
    engine = bench_worker.engine_for(model_dir, "tiny")
    seq = engine.add_request(perf.prompt_ids(1024, seed=1), SamplingParams(max_tokens=8, ignore_eos=True))
    with pytest.raises(perf.MeasurementError, match="only 0 of 1 requests done after 2 engine steps"):
        perf.run_until(engine, [seq], lambda s: s.is_finished, bound=2, what="decode")
    assert not engine.has_unfinished()
