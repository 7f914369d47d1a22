"""Shared fixtures: one tiny seeded model per session and engines built around it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from strata.worker.config import EngineConfig, ModelConfig, WorkerConfig
from strata.worker.engine.llm_engine import LLMEngine
from strata.worker.kv_connector import KVConnector
from strata.worker.models.layers import causal_attend
from strata.worker.models.presets import write_model

torch.set_num_threads(1)  # the machine is shared; tiny matmuls gain nothing from more threads

EngineFactory = Callable[..., LLMEngine]


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model(tmp_path_factory.mktemp("tiny"), "tiny")


def make_config(model_dir: Path, namespace: str = "default", **engine: Any) -> WorkerConfig:
    engine.setdefault("device", "cpu")
    engine.setdefault("num_gpu_blocks", 256)
    engine.setdefault("block_size", 4)
    engine.setdefault("max_batched_tokens", 64)
    return WorkerConfig(
        model=ModelConfig(name="tiny", path=str(model_dir), max_context_tokens=1024),
        engine=EngineConfig(**engine),
        cache_namespace=namespace,
    )


@pytest.fixture
def make_engine(tiny_dir: Path) -> EngineFactory:
    def build(connector: KVConnector | None = None, namespace: str = "default", **engine: Any) -> LLMEngine:
        return LLMEngine.from_config(make_config(tiny_dir, namespace, **engine), connector)

    return build


def reference_decode(
    engine: LLMEngine, prompt: list[int], steps: int
) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy tokens and logits by full recomputation of the sequence, no cache at all."""
    model, ids, logits = engine.runner.model, list(prompt), []
    with torch.inference_mode():
        for _ in range(steps):
            hidden = model(torch.tensor(ids), torch.arange(len(ids)), causal_attend)
            row = model.logits(hidden[-1:])[0]
            logits.append(row)
            ids.append(int(row.argmax()))
    return ids[len(prompt) :], logits


def prompt_of(n: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n,), generator=gen).tolist()
