"""A real vLLM (its CPU build, ``make vllm-env``) with Strata's connector and a real KV-tier
sidecar, as processes on loopback, launched with the flags the operator renders:

- a prompt computed once is in vLLM's HBM, and the sidecar's relay reports exactly the block
  keys the router computes for it (vLLM's own events, chained as Strata chains them);
- the connector saved its blocks to the sidecar; a restarted engine (HBM empty) loads them from
  DRAM (vLLM counts them as external prefix-cache hits) and answers exactly as the cold run did;
- a block corrupted in the sidecar's memory fails its checksum and is recomputed, never served;
- the connector's step accounting shows in vLLM's /metrics, where the autoscaler reads it.

One engine start per step; vLLM's start dominates (minutes on a loaded machine)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from strata.router.config import ModelConfig, RouterConfig, WorkersConfig
from strata.router.intake import Intake
from strata.stack.vllm import LOCAL_ARGS, ensure_vllm_env, relayed_keys, running_sidecar, running_vllm
from strata.stack.wait import free_port, wait_for
from strata.worker.config import WorkerConfig
from strata.worker.models.presets import write_model

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]
MODEL = "tiny"
BLOCK = 32
EVENTS_S = 60.0
ARGS = LOCAL_ARGS


def worker_config(tmp: Path, model_dir: Path) -> WorkerConfig:
    return WorkerConfig.model_validate(
        {
            "model": {"name": MODEL, "path": str(model_dir), "dtype": "float32", "max_context_tokens": 2048},
            "engine": {"kind": "vllm", "device": "cpu", "block_size": BLOCK, "kv_cache_bytes": 64 << 20},
            "kvtier": {
                "enabled": True,
                "socket_path": str(tmp / "run" / "kvtier.sock"),
                "dram": {"capacity_bytes": 64 << 20, "shm_path": str(tmp / "shm" / "kv.slots")},
                "nvme": {"capacity_bytes": 0},
            },
            "cache_namespace": "tenant-a.uid",
        }
    )


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("vllm")
    env = ensure_vllm_env()
    model_dir = write_model(tmp / "model", "hf-tiny")
    (tmp / "run").mkdir()
    (tmp / "shm").mkdir()
    config = worker_config(tmp, model_dir)
    config_path = tmp / "worker.yaml"
    config_path.write_text(config.to_yaml())
    metrics = free_port()
    with running_sidecar(config_path, metrics, tmp / "sidecar.log"):
        yield {"env": env, "config": config, "config_path": config_path, "metrics": metrics, "tmp": tmp}


def prompt_text() -> str:
    return " ".join(f"word{i % 50}" for i in range(60))  # 409 bytes, one token each: 12 blocks


def complete(url: str, prompt: str) -> dict[str, Any]:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 12, "temperature": 0}
    reply = httpx.post(f"{url}/v1/completions", json=body, timeout=300)
    reply.raise_for_status()
    answer: dict[str, Any] = reply.json()
    return answer


def counter(url: str, name: str) -> float:
    total = 0.0
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def router_keys(config: WorkerConfig, prompt: str) -> list[bytes]:
    router = RouterConfig(
        model=ModelConfig(name=MODEL, path=config.model.path, max_context_tokens=2048),
        block_size=BLOCK,
        cache_namespace=config.cache_namespace,
        workers=WorkersConfig(engine="vllm", device="cpu"),
    )
    body = json.dumps({"model": MODEL, "prompt": prompt}).encode()
    blocks = Intake(router).admit(body, "completion", {}, "r1").prompt.blocks
    return [key for key in blocks if isinstance(key, bytes)]


def test_vllm_serves_from_the_sidecars_dram_after_a_restart_and_the_relay_shows_its_hbm(
    setup: dict[str, Any],
) -> None:
    env, config, path, tmp = setup["env"], setup["config"], setup["config_path"], setup["tmp"]
    sidecar = f"http://127.0.0.1:{setup['metrics']}"
    prompt = prompt_text()
    expected = router_keys(config, prompt)
    assert len(expected) == len(prompt.encode()) // BLOCK == 12
    with running_vllm(env, config, path, free_port(), tmp / "vllm-1.log", *ARGS) as engine:
        cold = complete(engine.url, prompt)
        in_hbm = "the relay to report the prompt's blocks in HBM"
        wait_for(lambda: set(expected) <= relayed_keys(sidecar) or None, EVENTS_S, what=in_hbm)
        again = complete(engine.url, prompt)
        assert counter(engine.url, "vllm:prefix_cache_hits_total") >= 11 * BLOCK
        assert again["choices"][0]["text"] == cold["choices"][0]["text"]
    wait_for(lambda: not relayed_keys(sidecar) or None, EVENTS_S, what="HBM emptied with the engine")
    with running_vllm(env, config, path, free_port(), tmp / "vllm-2.log", *ARGS) as engine:
        warm = complete(engine.url, prompt)
        assert counter(engine.url, "vllm:external_prefix_cache_hits_total") >= 11 * BLOCK
        assert warm["choices"][0]["text"] == cold["choices"][0]["text"]
        busy = counter(engine.url, "strata_worker_engine_busy_seconds_total")
        assert (
            busy > counter(engine.url, "strata_worker_tier_wait_seconds_total") > 0
        )  # the connector's accounting
    scramble(config)  # every DRAM block's bytes, under the sidecar, as a failing DIMM would
    corrupt = counter(sidecar, "strata_kvtier_corrupt_blocks_total")
    with running_vllm(env, config, path, free_port(), tmp / "vllm-3.log", *ARGS) as engine:
        recomputed = complete(engine.url, prompt)
    assert recomputed["choices"][0]["text"] == cold["choices"][0]["text"]  # garbage KV would not answer so
    assert counter(sidecar, "strata_kvtier_corrupt_blocks_total") > corrupt


def scramble(config: WorkerConfig) -> None:
    """Overwrite the DRAM tier's slot file (the sidecar maps it shared: it sees the new bytes)."""
    path = Path(config.kvtier.dram.shm_path)
    size = path.stat().st_size
    with path.open("r+b") as slots:
        slots.write(bytes(range(256)) * (min(size, 64 << 20) // 256))
