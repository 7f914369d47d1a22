"""The engine against transformers, the reference: tiny random checkpoints that transformers
saved (tests/worker/hf_checkpoints.py: every supported architecture and config layout) give the
same logits in float32 (max abs diff <= 1e-4, over the whole context and through the paged
cache) and the same greedy tokens over the HTTP API: cold, from the HBM prefix cache and after
a load from the KV tiers."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from aiohttp.test_utils import TestClient, TestServer

from strata.worker.config import EngineConfig, ModelConfig, WorkerConfig
from strata.worker.engine.llm_engine import LLMEngine
from strata.worker.engine.sequence import SamplingParams
from strata.worker.models.layers import causal_attend
from strata.worker.models.loader import load_model
from strata.worker.server.app import build_app
from strata.worker.server.engine_loop import EngineLoop
from strata.worker.server.main import build_engine
from tests.kvtier.conftest import kvtier_config, root, start_sidecar
from tests.worker import fidelity_check
from tests.worker.conftest import make_config
from tests.worker.hf_checkpoints import CASES, Case, token_ids, write_checkpoint

__all__ = ["root", "start_sidecar"]  # the KV-tier tests' fixtures, used here
TOLERANCE = 1e-4
STEPS = 8
BLOCK = 4
CASE_IDS = [case.name for case in CASES]


class Reference:
    """One checkpoint, as transformers loads and runs it."""

    def __init__(self, model_dir: Path) -> None:
        import transformers

        self.model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()

    def logits(self, ids: list[int]) -> torch.Tensor:
        with torch.inference_mode():
            out: torch.Tensor = self.model(input_ids=torch.tensor([ids])).logits[0].float()
        return out

    def greedy(self, prompt: list[int], steps: int = STEPS) -> tuple[list[int], torch.Tensor]:
        """Greedy tokens by recomputing the whole sequence each step, and the logits of the last
        run (one row per position)."""
        ids = list(prompt)
        for _ in range(steps):
            ids.append(int(self.logits(ids)[-1].argmax()))
        return ids[len(prompt) :], self.logits(ids)


@pytest.fixture(scope="module")
def checkpoint(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[[Case], tuple[Path, Reference]]]:
    built: dict[str, tuple[Path, Reference]] = {}

    def get(case: Case) -> tuple[Path, Reference]:
        if case.name not in built:
            model_dir = write_checkpoint(case, tmp_path_factory.mktemp(case.name))
            built[case.name] = (model_dir, Reference(model_dir))
        return built[case.name]

    yield get


def prompt(seed: int, n: int = 40) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(0, 253) for _ in range(n)]


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_logits_over_the_whole_context_equal_transformers(case: Case, checkpoint: Any) -> None:
    model_dir, reference = checkpoint(case)
    model = load_model(model_dir, torch.float32, torch.device("cpu"))
    n = model.config.max_position_embeddings  # long-context RoPE and the window's edge included
    ids = prompt(7, n)
    with torch.inference_mode():
        ours = model.logits(model(torch.tensor(ids), torch.arange(n), causal_attend))
    diff = max_diff(ours, reference.logits(ids))
    print(f"{case.name}: {n} positions, max abs logits diff {diff:.2e}")
    assert diff <= TOLERANCE


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_paged_decoding_equals_transformers(case: Case, checkpoint: Any) -> None:
    model_dir, reference = checkpoint(case)
    engine = LLMEngine.from_config(make_config(model_dir, block_size=BLOCK))
    ids = prompt(1)
    seq = engine.generate(ids, SamplingParams(max_tokens=STEPS, ignore_eos=True, keep_logits=True))
    tokens, logits = reference.greedy(ids)
    assert seq.output_ids == tokens
    want = logits[len(ids) - 1 : len(ids) - 1 + STEPS]
    assert max_diff(torch.stack(seq.logits), want) <= TOLERANCE


def tiered_config(model_dir: Path, root: Path) -> WorkerConfig:
    """An HBM cache of 14 blocks: a 48-token request takes 12, so the next one evicts it."""
    return WorkerConfig(
        model=ModelConfig(name="m", path=str(model_dir), max_context_tokens=256),
        engine=EngineConfig(device="cpu", block_size=BLOCK, num_gpu_blocks=14, max_batched_tokens=64),
        kvtier=kvtier_config(root),
    )


async def complete(client: TestClient[Any, Any], ids: list[int]) -> tuple[list[int], list[float], int]:
    """Greedy tokens (read back from their text), their logprobs and the cached prompt tokens."""
    body = {
        "model": "m",
        "prompt": ids,
        "max_tokens": STEPS,
        "temperature": 0,
        "ignore_eos": True,
        "logprobs": 0,
    }
    resp = await client.post("/v1/completions", json=body)
    assert resp.status == 200, await resp.text()
    out = await resp.json()
    logprobs = out["choices"][0]["logprobs"]
    cached = out["usage"]["prompt_tokens_details"]["cached_tokens"]
    return token_ids(logprobs["tokens"]), logprobs["token_logprobs"], cached


def expect(reference: Reference, ids: list[int], got: tuple[list[int], list[float], int]) -> None:
    tokens, logits = reference.greedy(ids)
    assert got[0] == tokens
    rows = torch.log_softmax(logits[len(ids) - 1 : len(ids) - 1 + STEPS], dim=-1)
    want = rows[torch.arange(STEPS), torch.tensor(tokens)]
    assert max_diff(torch.tensor(got[1]), want) <= TOLERANCE


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
async def test_greedy_over_http_equals_transformers_cold_cached_and_from_tiers(
    case: Case, checkpoint: Any, root: Path, start_sidecar: Any
) -> None:
    model_dir, reference = checkpoint(case)
    config = tiered_config(model_dir, root)
    start_sidecar(config.kvtier)
    engine = build_engine(config)
    client = TestClient(TestServer(build_app(EngineLoop(engine))))
    await client.start_server()
    try:
        first, second = prompt(1), prompt(2)
        cold = await complete(client, first)
        hbm = await complete(client, first)
        await complete(client, second)  # evicts the first prompt's blocks to DRAM
        tiers = await complete(client, first)
    finally:
        await client.close()
        engine.close()
    assert cold[2] == 0 and hbm[2] == tiers[2] == 36  # every full block short of the last token
    assert engine.stats.hit_tokens["dram"] > 0, engine.stats.hit_tokens
    for got in (cold, hbm, tiers):
        expect(reference, first, got)


def test_the_device_check_runs_here_in_float32(tmp_path: Path) -> None:
    """tools/device/check.sh runs fidelity_check in bfloat16 on a GPU; here, one checkpoint of each
    architecture in float32 on the CPU, so the script is known to run."""
    cases = ["llama-v5-llama3", "qwen2-legacy-yarn", "qwen3-v5-tied", "mistral-v5-window"]
    out = tmp_path / "fidelity.json"
    assert (
        fidelity_check.main(["--device", "cpu", "--dtype", "float32", "--out", str(out), "--cases", *cases])
        == 0
    )
    results = json.loads(out.read_text())
    assert results["ok"] and sorted(results["cases"]) == sorted(cases)
    assert all(r["whole_context"]["max_diff"] <= TOLERANCE for r in results["cases"].values())


def test_the_device_checks_bfloat16_tolerance() -> None:
    exact = torch.randn(64, 256, generator=torch.Generator().manual_seed(0))
    theirs = exact + 0.01 * torch.randn(64, 256, generator=torch.Generator().manual_seed(1))
    ours = exact + 0.01 * torch.randn(64, 256, generator=torch.Generator().manual_seed(2))
    assert fidelity_check.judge(ours, theirs, exact, torch.bfloat16)["ok"]
    assert not fidelity_check.judge(exact + 0.05, theirs, exact, torch.bfloat16)["ok"]  # 5x their error
    assert not fidelity_check.judge(ours + (exact > 3) * 0.5, theirs, exact, torch.bfloat16)[
        "ok"
    ]  # one spike
    assert not fidelity_check.judge(ours, theirs, exact, torch.float32)["ok"]  # float32: 1e-4
