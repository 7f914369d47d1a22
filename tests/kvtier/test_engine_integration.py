"""The engine with the sidecar behind it: blocks pushed out of a deliberately tiny HBM cache
come back from DRAM, NVMe or the shared tier, and decoding from them equals decoding by
recomputation (same tokens, same logits). On the CPU here; on CUDA with STRATA_TEST_DEVICE=cuda
(tools/device/check.sh), the tiers' GPU path."""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any

import pytest
import torch

from strata.worker.config import EngineConfig, ModelConfig, WorkerConfig
from strata.worker.engine.llm_engine import LLMEngine
from strata.worker.engine.sequence import SamplingParams
from strata.worker.kv_connector import Tier
from strata.worker.kvtier import pagelock
from strata.worker.kvtier.client import TierClient
from strata.worker.models.presets import write_model
from strata.worker.server.main import build_engine

from .conftest import TEST_DEVICE, kvtier_config

PARAMS = SamplingParams(max_tokens=6, ignore_eos=True, keep_logits=True)
TIERS: dict[str, dict[str, Any]] = {
    "dram": {},
    "nvme": {"dram": {"capacity_bytes": 0}},
    "shared": {"dram": {"capacity_bytes": 0}, "nvme": {"capacity_bytes": 0}, "shared": {"enabled": True}},
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model(tmp_path_factory.mktemp("model"), "tiny")


def engine_config(model_dir: Path, root: Path, **kvtier: Any) -> WorkerConfig:
    return WorkerConfig(
        model=ModelConfig(name="tiny", path=str(model_dir)),
        # 14 blocks of 16 tokens: one 200-token request fits, a second one evicts the first.
        engine=EngineConfig(device=TEST_DEVICE, block_size=16, num_gpu_blocks=14),
        kvtier=kvtier_config(root, **kvtier),
    )


def prompt(seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 250) for _ in range(200)]


@pytest.mark.parametrize("tier", list(TIERS))
def test_decoding_from_a_lower_tier_equals_recomputation(model_dir, root, start_sidecar, tier):
    decodes_like_recomputation(engine_config(model_dir, root, **TIERS[tier]), start_sidecar, tier)


def test_decoding_from_dram_slots_in_memory_equals_recomputation(model_dir, root, start_sidecar, caplog):
    """The slots on a memory file system, as the chart mounts them (the other tests keep them in
    a file under /tmp). On CUDA the client page-locks them, so loads and saves are DMA."""
    shm = Path("/dev/shm") / f"{root.name}-kv"
    try:
        with caplog.at_level(logging.WARNING, logger=pagelock.log.name):
            config = engine_config(model_dir, root, dram={"shm_path": str(shm)})
            decodes_like_recomputation(config, start_sidecar, "dram")
        assert "cudaHostRegister" not in caplog.text
    finally:
        for path in shm.parent.glob(f"{shm.name}*"):  # the slots, their table, the sighting counts
            path.unlink()


def decodes_like_recomputation(config: WorkerConfig, start_sidecar: Any, tier: Tier) -> None:
    reference = LLMEngine.from_config(config).generate(prompt(1), PARAMS)

    start_sidecar(config.kvtier)
    engine = build_engine(config)  # the worker's start-up path: connects when kvtier.enabled
    engine.generate(prompt(1), PARAMS)
    engine.generate(prompt(2), PARAMS)  # evicts the first prompt's blocks from HBM
    again = engine.generate(prompt(1), PARAMS)

    # (200 - 1) // 16 = 12 blocks hit; HBM keeps at most the one block the second prompt left.
    assert sum(again.hit_tokens.values()) == 192, again.hit_tokens
    assert again.hit_tokens.get(tier, 0) >= 11 * 16, again.hit_tokens
    assert set(again.hit_tokens) <= {"hbm", tier}
    assert again.output_ids == reference.output_ids
    for got, want in zip(again.logits, reference.logits, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    if tier == "nvme" and TEST_DEVICE == "cpu":  # the engine's cache on pages: its own NVMe I/O
        client = engine.tiers.connector
        assert isinstance(client, TierClient) and client.direct_saved and client.direct_loaded


def test_engine_without_a_sidecar_recomputes(model_dir, root):
    config = engine_config(model_dir, root)
    reference = LLMEngine.from_config(config).generate(prompt(1), PARAMS)
    engine = build_engine(config)  # the sidecar is not running
    engine.generate(prompt(1), PARAMS)
    engine.generate(prompt(2), PARAMS)
    again = engine.generate(prompt(1), PARAMS)
    assert set(again.hit_tokens) <= {"hbm"}  # nothing from the absent tiers
    assert again.output_ids == reference.output_ids
