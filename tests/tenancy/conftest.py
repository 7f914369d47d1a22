"""Two tenants' KV-tier sidecars on one machine and one shared volume, as two namespaces' pods
on one node and one volume would be: each its own socket and memory, both the same volume."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from strata.worker.config import WorkerConfig
from strata.worker.kvtier.server import Sidecar
from tests.kvtier import conftest as kvtier
from tests.kvtier.conftest import MiB, worker_config

TENANT_A, TENANT_B = (
    "team-a.0b5e7c1e-1111-4222-8333-444455556666",
    "team-b.7d0f9a2c-5555-4666-8777-888899990000",
)
start_sidecar = kvtier.start_sidecar  # the kvtier tests' fixture, for these tests too
BLOCK_BYTES = 2 * 2 * 16 * 2 * 32 * 4  # the tests' float32 blocks (SHAPE)
StartTenant = Callable[[str, str], WorkerConfig]


@pytest.fixture
def volume() -> Iterator[Path]:
    """A short path (Unix socket paths are limited to ~100 bytes) holding both pods' directories
    and the one shared volume they both mount."""
    path = Path(tempfile.mkdtemp(prefix="wall-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def start_tenant(volume: Path, start_sidecar: Callable[..., Sidecar]) -> StartTenant:
    """Start the sidecar of ``tenant`` (a cache namespace) in pod directory ``pod``: its own DRAM
    tier and socket, no NVMe, the shared tier on ``volume/shared``, every block written through."""

    def start(pod: str, tenant: str) -> WorkerConfig:
        overrides = {
            "write_mode": "write-through",
            "dram": {"capacity_bytes": 2 * MiB},
            "nvme": {"capacity_bytes": 0},
            "shared": {"enabled": True, "path": str(volume / "shared")},
        }
        config = worker_config(volume / pod, tenant, **overrides)
        start_sidecar(config.kvtier, BLOCK_BYTES, tenant)
        return config

    return start
