"""How many KV blocks the engine gets: the device's budget, capped by the service's HBM budget;
and what it says when the service's figure for a token's KV is not its model's."""

from __future__ import annotations

import logging

import torch

from strata.worker.config import EngineConfig
from strata.worker.engine.llm_engine import LLMEngine, kv_bytes_told_otherwise, num_kv_blocks
from strata.worker.engine.model_runner import block_bytes

CPU = torch.device("cpu")
BLOCK = 4096


def test_a_cpu_engine_gets_its_fixed_budget() -> None:
    assert num_kv_blocks(EngineConfig(cpu_kv_bytes=100 * BLOCK), CPU, BLOCK) == 100


def test_an_hbm_budget_caps_it_and_never_raises_it() -> None:
    assert (
        num_kv_blocks(EngineConfig(cpu_kv_bytes=100 * BLOCK, kv_cache_bytes=10 * BLOCK + 1), CPU, BLOCK) == 10
    )
    assert num_kv_blocks(EngineConfig(cpu_kv_bytes=100 * BLOCK, kv_cache_bytes=10**9), CPU, BLOCK) == 100
    assert num_kv_blocks(EngineConfig(kv_cache_bytes=1), CPU, BLOCK) == 1  # never zero blocks


def test_a_fixed_block_count_wins() -> None:
    assert num_kv_blocks(EngineConfig(num_gpu_blocks=7, kv_cache_bytes=BLOCK), CPU, BLOCK) == 7


def test_the_engine_says_when_the_services_kv_bytes_per_token_are_wrong() -> None:
    assert kv_bytes_told_otherwise(None, 12288) is None  # not given: nothing to check
    assert kv_bytes_told_otherwise(12288, 12288) is None
    larger = kv_bytes_told_otherwise(4096, 12288)
    assert larger is not None and "spec.model.kvBytesPerToken: 4096" in larger and "12288" in larger
    assert "larger than it needs" in larger
    smaller = kv_bytes_told_otherwise(131072, 12288)
    assert smaller is not None and "too small" in smaller


def test_an_engine_told_the_wrong_figure_warns_at_its_start(make_engine, caplog) -> None:
    engine = make_engine()
    per_token = block_bytes(engine.runner.model, engine.block_size, engine.runner.dtype) // engine.block_size
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="strata.worker.engine.llm_engine"):
        config = engine.config.model_copy(
            update={"model": engine.config.model.model_copy(update={"kv_bytes_per_token": per_token + 1})}
        )
        LLMEngine(config, engine.runner.model, engine.tokenizer)
        right = config.model_copy(
            update={"model": engine.config.model.model_copy(update={"kv_bytes_per_token": per_token})}
        )
        LLMEngine(right, engine.runner.model, engine.tokenizer)
    warned = [r for r in caplog.records if getattr(r, "event", None) == "kv_bytes_per_token"]
    assert len(warned) == 1 and warned[0].actual == per_token
    # Not given: the engine says its model's figure, for the user to give.
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="strata.worker.engine.llm_engine"):
        LLMEngine(engine.config, engine.runner.model, engine.tokenizer)
    said = [r for r in caplog.records if getattr(r, "event", None) == "kv_bytes_per_token"]
    assert len(said) == 1 and said[0].levelno == logging.INFO and said[0].told is None
    assert f"{per_token} bytes a token" in said[0].getMessage()
