"""Proves the engine on the chosen device (CUDA when present) and reports its speed as JSON.

Writes a seeded test model, checks that paged-cache greedy decoding matches full recomputation on
that device, then measures prefill and decode throughput and TTFT (cold and prefix-cache hit).
Runs on the CPU too, with small sizes, so the script itself is tested where there is no GPU.
"""

from __future__ import annotations

import tempfile
import time
from typing import Any

import torch

from strata.worker import perf
from strata.worker.config import EngineConfig, ModelConfig, WorkerConfig
from strata.worker.engine.llm_engine import LLMEngine, pick_device
from strata.worker.engine.sequence import SamplingParams
from strata.worker.models.layers import causal_attend
from strata.worker.models.presets import write_model


def reference_greedy(engine: LLMEngine, prompt: list[int], steps: int) -> list[int]:
    """Greedy tokens by recomputing the whole sequence each step, without any cache."""
    model, ids = engine.runner.model, list(prompt)
    with torch.inference_mode():
        for _ in range(steps):
            tokens = torch.tensor(ids, device=engine.device)
            hidden = model(tokens, torch.arange(len(ids), device=engine.device), causal_attend)
            ids.append(int(model.logits(hidden[-1:])[0].argmax()))
    return ids[len(prompt) :]


def run(
    device: str = "auto",
    preset: str = "small",
    prompt_tokens: int = 4096,
    batch: int = 16,
    decode_tokens: int = 64,
    dtype: str = "float32",
) -> dict[str, Any]:
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as model_dir:
        write_model(model_dir, preset)
        engine_cfg = EngineConfig(device=pick_device(device).type, kv_memory_fraction=0.3)
        max_context = max(prompt_tokens + decode_tokens + 16, 256)
        config = WorkerConfig(
            model=ModelConfig(name=preset, path=model_dir, dtype=dtype, max_context_tokens=max_context),
            engine=engine_cfg,
        )
        engine = LLMEngine.from_config(config)
        check = perf.prompt_ids(100, seed=1)
        paged = engine.generate(check, SamplingParams(max_tokens=8, ignore_eos=True)).output_ids
        matches = paged == reference_greedy(engine, check, 8)
        prompt = perf.prompt_ids(prompt_tokens, seed=2)
        perf.ttft_s(engine, perf.prompt_ids(min(prompt_tokens, 512), seed=3))  # warm-up
        cold = perf.ttft_s(engine, prompt)
        hit = perf.ttft_s(engine, prompt)
        decode = perf.decode_tok_s(
            engine, [perf.prompt_ids(128, seed=10 + i) for i in range(batch)], decode_tokens
        )
    return {
        "device": str(engine.device),
        "device_name": torch.cuda.get_device_name(engine.device) if engine.device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "preset": preset,
        "dtype": dtype,
        "paged_matches_reference": matches,
        "prompt_tokens": prompt_tokens,
        "prefill_tok_s": round(prompt_tokens / cold, 1),
        "ttft_cold_s": round(cold, 4),
        "ttft_hbm_hit_s": round(hit, 4),
        "decode_batch": batch,
        "decode_tok_s": round(decode, 1),
        "elapsed_s": round(time.perf_counter() - started, 2),
    }
