"""Fixtures for the KV-tier tests: configs rooted in short temporary paths (Unix socket paths
are limited to ~100 bytes) and an in-process sidecar."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from strata.common.traces import traces_dir
from strata.worker.config import KVTierConfig, ModelConfig, WorkerConfig
from strata.worker.kvtier.server import Sidecar

MiB = 2**20
# Where the engine tests run the engine: the CPU here; "cuda" on a GPU machine
# (tools/device/check.sh), which proves the tiers' CUDA path.
TEST_DEVICE = os.environ.get("STRATA_TEST_DEVICE", "cpu")
TRACES = traces_dir()


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="kvt-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def kvtier_config(root: Path, **overrides: Any) -> KVTierConfig:
    """DRAM, NVMe and (optionally) shared tiers under ``root``; ``dram``/``nvme``/``shared``
    overrides are merged into the defaults."""
    base: dict[str, Any] = {
        "enabled": True,
        "socket_path": str(root / "kv.sock"),
        "metrics_port": 8001,
        "dram": {"capacity_bytes": 4 * MiB, "shm_path": str(root / "shm" / "kv")},
        "nvme": {
            "capacity_bytes": 8 * MiB,
            "path": str(root / "nvme"),
            "admit_after_hits": 0,
            "persistent": True,
        },
        "shared": {"enabled": False, "path": str(root / "shared"), "capacity_bytes": 16 * MiB},
    }
    for key, value in overrides.items():
        if isinstance(value, dict):
            base[key] = {**base[key], **value}
        else:
            base[key] = value
    return KVTierConfig.model_validate(base)


def worker_config(root: Path, namespace: str = "default", **overrides: Any) -> WorkerConfig:
    return WorkerConfig(
        model=ModelConfig(name="m", path=str(root / "model")),
        kvtier=kvtier_config(root, **overrides),
        cache_namespace=namespace,
    )


@pytest.fixture
def start_sidecar() -> Iterator[Callable[..., Sidecar]]:
    """Start in-process sidecars (metrics off), of a tenant (cache namespace) where one is named;
    all are stopped at teardown."""
    started: list[Sidecar] = []

    def start(config: KVTierConfig, block_bytes: int | None = None, tenant: str = "") -> Sidecar:
        sidecar = Sidecar(config, block_bytes=block_bytes, metrics_port=0, tenant=tenant)
        sidecar.start()
        started.append(sidecar)
        return sidecar

    yield start
    for sidecar in started:
        sidecar.stop()
