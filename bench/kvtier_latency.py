"""How long the sidecar keeps other requests waiting while an engine saves or loads: lookups
on a second connection (as a router's look-ahead or a metrics scrape reaches the sidecar
beside the engine), every ``PROBE_GAP_S``.

- ``lookup_latency``: while write-through saves of 96 blocks of 2 MiB run back to back, each
  save waiting for every reply (its blocks durable on NVMe). DRAM holds one chain, NVMe two
  (full: every save evicts). A save's disk writes and syncs run outside the sidecar's lock, so
  a lookup waits for the lock only while a batch is entered or committed.
- ``load_lookup_latency``: while two chains of 96 blocks take turns being loaded from NVMe
  (DRAM holds one chain, so each load reads its chain from the disk, direct I/O). A load's
  reads run with the lock released (``strata.worker.kvtier.promotion``)."""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bench.kvtier_bandwidth import BLOCK_SHAPE, DTYPE, NUM_BLOCKS
from bench.kvtier_sidecar import config, refs, sidecar
from strata.worker.kvtier.client import TierClient

SAVES = 12
PROBE_GAP_S = 0.002  # between lookups: the prober is not a busy loop that steals a core


def lookup_latency(
    root: Path | None = None,
    blocks: int = NUM_BLOCKS,
    shape: tuple[int, ...] = BLOCK_SHAPE,
    saves: int = SAVES,
) -> dict[str, Any]:
    """Lookup latency percentiles (ms) on a second connection during write-through saves."""

    def saving(saver: TierClient, prober: TierClient, data: list[torch.Tensor]) -> list[float]:
        for n in range(3):  # NVMe full from the start
            saver.save_checked(refs(7000 + n, len(data)), data)
        keys = [r.hash for r in refs(7002, 4)]
        return _probe_while(prober, keys, lambda: _save_all(saver, data, saves))

    return _measure(root, blocks, shape, 2, saving)


def load_lookup_latency(
    root: Path | None = None,
    blocks: int = NUM_BLOCKS,
    shape: tuple[int, ...] = BLOCK_SHAPE,
    loads: int = SAVES,
) -> dict[str, Any]:
    """Lookup latency percentiles (ms) on a second connection during loads from NVMe. Both
    chains stay on NVMe (write-through), so a load evicts the other chain from DRAM without
    writing it down, and the loads time reads alone."""

    def loading(loader: TierClient, prober: TierClient, data: list[torch.Tensor]) -> list[float]:
        chains = [[r.hash for r in refs(9000 + n, len(data))] for n in range(2)]
        for n in range(len(chains)):
            loader.save_checked(refs(9000 + n, len(data)), data)
        out = [torch.empty_like(block) for block in data]
        return _probe_while(prober, chains[0][:4], lambda: _load_all(loader, chains, out, loads))

    return _measure(root, blocks, shape, 3, loading)


Measure = Callable[[TierClient, TierClient, list[torch.Tensor]], list[float]]


def _measure(
    root: Path | None, blocks: int, shape: tuple[int, ...], chains: int, measure: Measure
) -> dict[str, Any]:
    """A write-through sidecar whose DRAM holds one chain and NVMe ``chains``; ``measure`` gets
    a client for the work, one for the lookups, and the chain's blocks."""
    data = [torch.randn(shape).to(DTYPE) for _ in range(blocks)]
    block_bytes = data[0].numel() * data[0].element_size()
    room = (len(data) + 8) * block_bytes
    with tempfile.TemporaryDirectory(prefix="kvlat-", dir=root) as tmp:
        settings = config(Path(tmp), "lat", dram=room, nvme=chains * room, write_mode="write-through")
        with sidecar(Path(tmp), settings, block_bytes) as kv:
            worker, prober = (TierClient(kv.socket_path, shape, DTYPE) for _ in range(2))
            try:
                waits = measure(worker, prober, data)
            finally:
                worker.close()
                prober.close()
    return _percentiles(waits)


def _load_all(client: TierClient, chains: list[list[bytes]], out: list[torch.Tensor], loads: int) -> None:
    for n in range(loads):
        if client.load(chains[n % 2], out) != len(out):
            raise RuntimeError("kvtier bench: a load from NVMe came back short")


def _save_all(client: TierClient, data: list[torch.Tensor], saves: int) -> None:
    for n in range(saves):
        if client.save_checked(refs(8000 + n, len(data)), data) != len(data):
            raise RuntimeError("kvtier bench: a write-through save lost blocks")


def _probe_while(prober: TierClient, keys: list[bytes], work: Callable[[], None]) -> list[float]:
    stop, waits = threading.Event(), []

    def probe() -> None:
        while not stop.is_set():
            started = time.perf_counter()
            prober.lookup(keys)
            waits.append(time.perf_counter() - started)
            time.sleep(PROBE_GAP_S)

    thread = threading.Thread(target=probe, name="kvtier-bench-prober")
    thread.start()
    try:
        work()
    finally:
        stop.set()
        thread.join()
    if not waits:
        raise RuntimeError("kvtier bench: no lookup finished while the saves ran")
    return waits


def _percentiles(waits: list[float]) -> dict[str, Any]:
    ordered = sorted(waits)

    def at(share: float) -> float:
        return round(1000 * ordered[min(len(ordered) - 1, int(share * len(ordered)))], 2)

    shares = {"p50_ms": 0.5, "p90_ms": 0.9, "p99_ms": 0.99, "max_ms": 1.0}
    return {"lookups": len(ordered)} | {name: at(share) for name, share in shares.items()}
