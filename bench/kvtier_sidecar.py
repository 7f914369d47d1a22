"""Plumbing of the KV-tier benchmark: sidecar processes, configs, page-cache drops, block keys."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from strata.common.blocks import BLOCK_SIZE
from strata.worker.config import EngineConfig, KVTierConfig, ModelConfig, WorkerConfig, WriteMode
from strata.worker.kv_connector import BlockRef
from strata.worker.kvtier.sightings import dram_sightings_path
from strata.worker.kvtier.slottable import table_path


def config(
    root: Path,
    name: str,
    dram: int,
    nvme: int,
    block_size: int = BLOCK_SIZE,
    verify_reads: bool = True,
    write_mode: WriteMode = "write-back",
) -> WorkerConfig:
    shm = f"/dev/shm/strata-bench-{os.getpid()}-{name}"
    kvtier = KVTierConfig(
        enabled=True,
        socket_path=str(root / f"{name}.sock"),
        dram={"capacity_bytes": dram, "shm_path": shm, "verify_reads": verify_reads},
        nvme={"capacity_bytes": nvme, "path": str(root / f"{name}-nvme"), "admit_after_hits": 0},
        write_mode=write_mode,
    )
    return WorkerConfig(
        model=ModelConfig(name="small", path=str(root / "model"), max_context_tokens=32768),
        engine=EngineConfig(device="cpu", block_size=block_size, max_batched_tokens=2048),
        kvtier=kvtier,
    )


@contextmanager
def sidecar(
    root: Path, config: WorkerConfig, block_bytes: int | None = None, pids: list[int] | None = None
) -> Iterator[KVTierConfig]:
    """A sidecar process; with ``block_bytes`` its tiers are sized before it serves; its pid is
    added to ``pids``."""
    path = root / f"{Path(config.kvtier.socket_path).stem}.yaml"
    path.write_text(config.to_yaml())
    sock = Path(config.kvtier.socket_path)
    args = ["serve", "--config", str(path), "--metrics-port", "0", "--log-level", "WARNING"]
    args += ["--block-bytes", str(block_bytes)] if block_bytes else []
    proc = subprocess.Popen([sys.executable, "-m", "strata", "kvtier", *args])
    if pids is not None:
        pids.append(proc.pid)
    try:
        deadline = time.monotonic() + 60
        while not sock.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("kvtier sidecar did not start")
            time.sleep(0.05)
        yield config.kvtier
    finally:
        stop(proc, Path(config.kvtier.dram.shm_path))


def stop(proc: subprocess.Popen[bytes], shm: Path) -> None:
    """SIGTERM, then SIGKILL if it has not exited in 120 s (a loaded machine); the shared memory
    goes either way: a wait that timed out used to leave the sidecar and its 570 MB segment."""
    try:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    finally:
        remove_shm(shm)


def remove_shm(shm: Path) -> None:
    """A DRAM tier's shared-memory file and the slot table and sighting counts beside it, gone."""
    for path in (shm, table_path(shm), dram_sightings_path(shm)):
        path.unlink(missing_ok=True)


def drop_page_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def refs(prefix: int, count: int) -> list[BlockRef]:
    keys = [(prefix << 64 | i).to_bytes(16, "big") for i in range(count)]
    return [BlockRef(k, keys[i - 1] if i else b"\0" * 16, i) for i, k in enumerate(keys)]
