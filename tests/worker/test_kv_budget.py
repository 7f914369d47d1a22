"""How many KV blocks the engine gets: the device's budget, capped by the service's HBM budget."""

from __future__ import annotations

import torch

from strata.worker.config import EngineConfig
from strata.worker.engine.llm_engine import num_kv_blocks

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
