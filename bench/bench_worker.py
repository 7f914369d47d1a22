"""Worker benchmark: prefill and decode throughput and TTFT for 1k, 4k and 8k-token prompts,
cold versus a prefix-cache hit in HBM, on the ``small`` test model and the device ``auto`` picks.

Cold and hit figures are measured side by side in one run; each is the best of ``REPEATS``
(fresh prompts for cold runs) so a busy shared CPU distorts the ratio less.
"""

from __future__ import annotations

import os
import tempfile
import time
from typing import Any

import torch

from strata.worker import perf
from strata.worker.config import EngineConfig, ModelConfig, WorkerConfig
from strata.worker.engine.llm_engine import LLMEngine
from strata.worker.models.presets import write_model

SIZES = {"1k": 1024, "4k": 4096, "8k": 8192}
REPEATS = 2
DECODE_TOKENS = 64
BATCH = 16


def _engine(model_dir: str) -> LLMEngine:
    config = WorkerConfig(
        model=ModelConfig(name="small", path=model_dir, max_context_tokens=8192 + 2 * DECODE_TOKENS),
        engine=EngineConfig(device="auto", block_size=16, max_batched_tokens=2048, kv_memory_fraction=0.3),
    )
    return LLMEngine.from_config(config)


def _size_figures(engine: LLMEngine, label: str, n: int, seed: int) -> dict[str, float]:
    cold = min(perf.ttft_s(engine, perf.prompt_ids(n, seed=seed + r)) for r in range(REPEATS))
    hot_prompt = perf.prompt_ids(n, seed=seed)  # cached by the first cold run
    hit = min(perf.ttft_s(engine, hot_prompt) for _ in range(REPEATS))
    decode = perf.decode_tok_s(engine, [hot_prompt], DECODE_TOKENS)
    return {"cold": cold, "hit": hit, "prefill": n / cold, "decode": decode}


def run() -> dict[str, Any]:
    started = time.perf_counter()
    load_before = os.getloadavg()[0]  # the CPU is shared: read the figures against the load
    with tempfile.TemporaryDirectory() as model_dir:
        write_model(model_dir, "small")
        engine = _engine(model_dir)
        perf.ttft_s(engine, perf.prompt_ids(512, seed=99))  # warm-up
        figures = {
            label: _size_figures(engine, label, n, seed=100 * i) for i, (label, n) in enumerate(SIZES.items())
        }
        batch = [perf.prompt_ids(1024, seed=500 + i) for i in range(BATCH)]
        batched_decode = perf.decode_tok_s(engine, batch, DECODE_TOKENS)
    params = sum(p.numel() for p in engine.runner.model.parameters())
    pick = lambda key, digits: {k: round(v[key], digits) for k, v in figures.items()}  # noqa: E731
    ratio = {k: round(v["cold"] / v["hit"], 2) for k, v in figures.items()}
    return {
        "device": str(engine.device),
        "device_name": torch.cuda.get_device_name(engine.device) if engine.device.type == "cuda" else "cpu",
        "model": "small (seeded test model, Llama architecture)",
        "model_params": params,
        "torch_threads": torch.get_num_threads(),
        "load_avg_1m": {"before": round(load_before, 2), "after": round(os.getloadavg()[0], 2)},
        "block_size": engine.block_size,
        "max_batched_tokens": engine.config.engine.max_batched_tokens,
        "prefill_tok_s": pick("prefill", 1),
        "decode_tok_s": pick("decode", 1),
        "decode_batch16_1k_tok_s": round(batched_decode, 1),
        "ttft_cold_s": pick("cold", 4),
        "ttft_hbm_hit_s": pick("hit", 4),
        "ttft_cold_over_hbm_hit": ratio,
        "summary": (
            f"{engine.device}: prefill {figures['4k']['prefill']:.0f} tok/s @4k, decode "
            f"{figures['1k']['decode']:.1f} tok/s (1 seq), {batched_decode:.0f} tok/s ({BATCH} seqs); "
            f"TTFT cold/HBM-hit {ratio['1k']}x @1k, {ratio['4k']}x @4k, {ratio['8k']}x @8k"
        ),
        "elapsed_s": round(time.perf_counter() - started, 2),
    }
