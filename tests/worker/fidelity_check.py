"""The engine's logits against transformers' on one device and dtype, for every checkpoint of
hf_checkpoints.py: over the whole context, and through the paged cache while decoding.

    python -m tests.worker.fidelity_check --device cuda --dtype bfloat16 --out fidelity.json

tools/device/check.sh runs it on a GPU machine; test_fidelity.py runs it here on the CPU in
float32. Exit status 1 when a case is outside the tolerance:
- float32: max abs diff from transformers' logits <= 1e-4;
- bfloat16 (or float16): both are measured against transformers' float32 logits on the CPU.
  The engine's mean abs error is at most 1.5x transformers' own in that dtype (rounding, not a
  bug: in bfloat16 on the CPU the ratio is 0.83-0.99 over the twelve checkpoints, whole context
  and paged decoding), and its max abs diff from transformers' same-dtype logits at most 0.1x
  the logits' standard deviation (0.03-0.06 there).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from strata.worker.config import Dtype, EngineConfig, ModelConfig, WorkerConfig
from strata.worker.engine.llm_engine import LLMEngine
from strata.worker.engine.sequence import SamplingParams
from strata.worker.models.layers import causal_attend
from strata.worker.models.loader import DTYPES, load_model
from tests.worker.hf_checkpoints import CASES, write_checkpoint

FLOAT32_TOLERANCE = 1e-4
ERROR_RATIO = 1.5  # the engine's error against float32, over transformers' own
SPREAD_FRACTION = 0.1  # the engine's diff from transformers' same-dtype logits, over their std
STEPS = 8


def _abs_diff(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.float().cpu() - b.float().cpu()).abs()


def judge(
    ours: torch.Tensor, theirs: torch.Tensor, exact: torch.Tensor, dtype: torch.dtype
) -> dict[str, Any]:
    """``theirs``: transformers' logits in ``dtype``; ``exact``: in float32 on the CPU."""
    direct = float(_abs_diff(ours, theirs).max())
    if dtype == torch.float32:
        return {"max_diff": direct, "ok": direct <= FLOAT32_TOLERANCE}
    error, their_error = float(_abs_diff(ours, exact).mean()), float(_abs_diff(theirs, exact).mean())
    scale = float(exact.float().std())
    ok = error <= ERROR_RATIO * their_error and direct <= SPREAD_FRACTION * scale
    return {"max_diff": direct, "mean_error": error, "their_mean_error": their_error, "std": scale, "ok": ok}


def transformers_logits(model: Any, ids: list[int], device: torch.device) -> torch.Tensor:
    with torch.inference_mode():
        out: torch.Tensor = model(input_ids=torch.tensor([ids], device=device)).logits[0]
    return out


def whole_context(model_dir: Path, device: torch.device, dtype: torch.dtype, ids: list[int]) -> torch.Tensor:
    model = load_model(model_dir, dtype, device)
    with torch.inference_mode():
        tokens = torch.tensor(ids, device=device)
        return model.logits(model(tokens, torch.arange(len(ids), device=device), causal_attend))


def paged(
    model_dir: Path, device: torch.device, dtype: Dtype, prompt: list[int]
) -> tuple[list[int], torch.Tensor]:
    """Greedy tokens and their logits, decoded by the engine through its paged cache."""
    config = WorkerConfig(
        model=ModelConfig(name="m", path=str(model_dir), dtype=dtype, max_context_tokens=256),
        engine=EngineConfig(
            device="cuda" if device.type == "cuda" else "cpu", block_size=16, num_gpu_blocks=64
        ),
    )
    params = SamplingParams(max_tokens=STEPS, ignore_eos=True, keep_logits=True)
    seq = LLMEngine.from_config(config).generate(prompt, params)
    return seq.output_ids, torch.stack(seq.logits)


def check_case(model_dir: Path, device: torch.device, dtype_name: Dtype) -> dict[str, Any]:
    import transformers

    dtype = DTYPES[dtype_name]
    load = transformers.AutoModelForCausalLM.from_pretrained
    exact_model = load(model_dir, dtype=torch.float32).eval()
    their_model: Any = load(model_dir, dtype=dtype)
    their_model = their_model.to(device).eval()
    rng = random.Random(7)
    ids = [rng.randrange(0, 253) for _ in range(256)]
    whole = judge(
        whole_context(model_dir, device, dtype, ids),
        transformers_logits(their_model, ids, device),
        transformers_logits(exact_model, ids, torch.device("cpu")),
        dtype,
    )
    prompt = ids[:40]
    tokens, logits = paged(model_dir, device, dtype_name, prompt)
    rows = slice(len(prompt) - 1, len(prompt) - 1 + STEPS)  # teacher-forced with the engine's tokens
    their = transformers_logits(their_model, prompt + tokens, device)[rows]
    exact = transformers_logits(exact_model, prompt + tokens, torch.device("cpu"))[rows]
    decode = judge(logits, their, exact, dtype)
    return {"whole_context": whole, "paged_decode": decode, "ok": whole["ok"] and decode["ok"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cases", nargs="*", default=[case.name for case in CASES])
    args = parser.parse_args(argv)
    results: dict[str, Any] = {"device": args.device, "dtype": args.dtype, "cases": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for case in (c for c in CASES if c.name in args.cases):
            model_dir = write_checkpoint(case, Path(tmp) / case.name)
            results["cases"][case.name] = check_case(model_dir, torch.device(args.device), args.dtype)
    results["ok"] = all(r["ok"] for r in results["cases"].values())
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    for name, result in results["cases"].items():
        print(f"{name}: whole {result['whole_context']} decode {result['paged_decode']}")
    return 0 if results["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
