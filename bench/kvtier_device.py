"""The KV tiers' device path next to what the machine's copy engine does without them, measured
interleaved like ``kvtier_bandwidth`` (each repeat runs every pass once; each keeps its best):

- ``dram_put``: blocks in GPU memory saved to the DRAM tier through the client, the sidecar a
  real process: each block copied by DMA into the sidecar's shared-memory slots (page-locked by
  the client with ``cudaHostRegister``), the put ending when the sidecar has committed every
  block. Against ``d2h``: torch's copy of the same blocks into page-locked host buffers, all
  queued asynchronously and synchronised once, which is the copy engine's own rate.
- ``dram_save``: the same through the client's ``save``, as the engine saves the blocks a step
  evicted: ``dram_save_returned`` is the time until it returned (the DMA landed, the put sent:
  what the engine waits for), ``dram_save`` until the sidecar's sealer has taken every slot's
  checksum.
- ``dram_get``: the chain put a repeat earlier loaded back into GPU blocks, each block checked
  against its checksum, against ``h2d``.
- every pass runs once per client of ``CLIENTS``: ``dram`` a CUDA engine's, whose blocks the GPU
  hashes (the DRAM slots of a save then arrive sealed, and a load checks the blocks where they
  landed); ``dram_host`` and ``dram_host_t4`` hash on the host's threads, 8 and 4 (a save's DRAM
  slots sealed by the sidecar afterwards; a load's slots hashed while the copy engine runs).
- ``gpu_hash``: the GPU's checksums of the blocks alone (:mod:`~strata.worker.kvtier.devicehash`;
  on the CPU it does nothing).
- ``nvme_full_get`` / ``nvme_full_put``: a full NVMe tier's (its steady state) load and save of
  the blocks through a CUDA engine's client, against ``staged_direct_read`` / ``_write``: a
  plain program's direct I/O of the same blocks with the tier's I/O threads (4), each block
  copied by DMA between the GPU and a page-locked staging buffer, as the disk cannot reach the
  GPU's memory.
- ``d2h_pageable`` / ``h2d_pageable``: the same copies through ordinary (pageable) host
  memory, which is what a connector whose slots were not page-locked would get.

On the CPU the same passes run as host copies, which is what the test does to check them.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch

from bench.kvtier_bandwidth import (
    BLOCK_BYTES,
    BLOCK_SHAPE,
    DTYPE,
    FULL_CHAINS,
    NUM_BLOCKS,
    REPEATS,
    THREADS,
    Pass,
    gbps_ratios,
    interleaved,
    staged_passes,
    tier_client,
    tier_passes,
    wait_sealed,
)
from bench.kvtier_sidecar import refs
from strata.worker.kvtier import devicehash
from strata.worker.kvtier.blockcopy import COPY_THREADS, DEVICE_COPY_THREADS, flat_bytes, host_copy
from strata.worker.kvtier.client import TierClient

# The clients the DRAM passes run with, each with its own sidecar: (tier name, client threads,
# whether the GPU hashes the blocks). ``dram`` is a CUDA engine's (the GPU hashes); the others
# hash the slots on the host's threads while the copy engine copies, as before the GPU's hash.
CLIENTS = (
    ("dram", DEVICE_COPY_THREADS, True),
    ("dram_host", DEVICE_COPY_THREADS, False),
    (f"dram_host_t{COPY_THREADS}", COPY_THREADS, False),
)
# (pass, the pass it is measured against), by wall-clock GB/s, for each client's tier
TIER_RATIOS = (("put", "d2h"), ("get", "h2d"), ("save", "d2h"), ("save_returned", "d2h"))
COPY_RATIOS = (
    ("d2h_pageable_over_d2h", "d2h_pageable", "d2h"),
    ("h2d_pageable_over_h2d", "h2d_pageable", "h2d"),
)
# The NVMe tier from the GPU, full (its steady state), against a plain program's direct I/O
# through page-locked staging buffers it copies the blocks to and from (by DMA), as it must.
NVME_RATIOS = (
    ("nvme_full_get_over_staged_direct_read", "nvme_full_get", "staged_direct_read"),
    ("nvme_full_put_over_staged_direct_write", "nvme_full_put", "staged_direct_write"),
)


def device_bandwidth(
    root: Path,
    device: torch.device,
    blocks: int = NUM_BLOCKS,
    repeats: int = REPEATS,
    clients: Sequence[tuple[str, int, bool]] = CLIENTS,
    nvme: bool = True,
) -> dict[str, Any]:
    """GB/s of each pass (best of ``repeats``) and the ratios, the DRAM tier's passes once per
    client of ``clients``, each with its own sidecar, and with ``nvme`` the NVMe tier's (a CUDA
    engine's client); raises when a block comes back different from the one saved."""
    source = [torch.randn(BLOCK_SHAPE, device=device).to(DTYPE) for _ in range(blocks)]
    out = [torch.empty_like(b) for b in source]
    pinned = [torch.empty(BLOCK_SHAPE, dtype=DTYPE, pin_memory=device.type == "cuda") for _ in source]
    pageable = [torch.empty(BLOCK_SHAPE, dtype=DTYPE) for _ in source]
    nbytes = blocks * BLOCK_BYTES
    room = 3 * (blocks + 8) * nbytes // blocks  # the chain read, the chain put, the chain saved
    pids: dict[str, int] = {}
    returned: dict[str, list[float]] = {tier: [] for tier, _, _ in clients}
    with ExitStack() as stack:
        passes = copy_passes(device, source, out, pinned, pageable)
        for tier, threads, gpu_hash in clients:
            connected = tier_client(root, tier, pids, dram=room, threads=threads, gpu_hash=gpu_hash)
            client, _ = stack.enter_context(connected)
            passes |= tier_passes(tier, client, source, out, None, repeats=repeats)
            passes[f"{tier}_save"] = save_pass(client, source, returned[tier])
        if nvme:
            passes |= nvme_passes(root, stack, source, out, pids, repeats)
        result = interleaved(nbytes, passes, pids, repeats)
    for tier, times in returned.items():
        result[f"{tier}_save_returned_gbps"] = round(nbytes / min(times) / 1e9, 3)
    pairs = zip(out, source, strict=True)
    if not all(torch.equal(o.view(torch.int16), b.view(torch.int16)) for o, b in pairs):
        raise RuntimeError("kvtier device bench: blocks came back different")
    more = list(NVME_RATIOS) if nvme else []
    result["ratios"] = gbps_ratios(result, ratios([tier for tier, _, _ in clients]) + more)
    return result


def nvme_passes(
    root: Path,
    stack: ExitStack,
    source: list[torch.Tensor],
    out: list[torch.Tensor],
    pids: dict[str, int],
    repeats: int,
) -> dict[str, Pass]:
    """A full NVMe tier's get and put of the blocks through a CUDA engine's client (the GPU
    hashing them; reads with the file's pages dropped), and the plain staged direct I/O they
    are measured against (``kvtier_bandwidth.staged_passes``, its copies by torch)."""
    room = (len(source) + 8) * BLOCK_BYTES
    connected = tier_client(root, "nvme_full", pids, nvme=FULL_CHAINS * room, threads=DEVICE_COPY_THREADS)
    client, data = stack.enter_context(connected)
    passes = tier_passes("nvme_full", client, source, out, data, fill=FULL_CHAINS + 1, repeats=repeats)
    pool = stack.enter_context(ThreadPoolExecutor(THREADS))
    copy = _torch_copy if source[0].is_cuda else host_copy
    return passes | staged_passes(root, source, out, pool, copy)


def _torch_copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    dst.copy_(src)  # between the GPU and page-locked memory: a DMA, finished on return


def save_pass(client: TierClient, source: list[torch.Tensor], returned: list[float]) -> Pass:
    """The engine's save, as it runs after a step: ``returned`` gets the time until ``save``
    returned (the blocks' DMA landed and the put is sent, the engine's cost); the pass goes on
    until the sidecar has sealed the slots (``dram_save``, the time until every checksum is
    held, comparable to ``dram_put``)."""

    def run(repeat: int) -> None:
        chain = refs(7000 + repeat, len(source))
        started = time.perf_counter()
        client.save(chain, source)
        returned.append(time.perf_counter() - started)
        wait_sealed(client)

    return run


def ratios(tiers: Sequence[str]) -> list[tuple[str, str, str]]:
    """(ratio, pass, against) of each tier's passes, and of the pageable copies."""
    return [
        (f"{tier}_{op}_over_{against}", f"{tier}_{op}", against)
        for tier in tiers
        for op, against in TIER_RATIOS
    ] + list(COPY_RATIOS)


def copy_passes(
    device: torch.device,
    source: list[torch.Tensor],
    out: list[torch.Tensor],
    pinned: list[torch.Tensor],
    pageable: list[torch.Tensor],
) -> dict[str, Pass]:
    """Torch's copies of the blocks between the device and host memory, without the tiers."""
    return {
        "gpu_hash": _hashes(source),
        "d2h": _copies(device, zip(pinned, source, strict=True)),
        "h2d": _copies(device, zip(out, pinned, strict=True)),
        "d2h_pageable": _copies(device, zip(pageable, source, strict=True)),
        "h2d_pageable": _copies(device, zip(out, pageable, strict=True)),
    }


def _copies(device: torch.device, pairs: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> Pass:
    """One pass: every copy queued (asynchronous where the host side is page-locked), then one
    synchronisation, as a batch of block moves runs on the copy engine."""
    listed = list(pairs)

    def run(_: int) -> None:
        for dst, src in listed:
            dst.copy_(src, non_blocking=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    return run


def _hashes(source: list[torch.Tensor]) -> Pass:
    """One pass of the GPU's checksums of every block (nothing on the CPU)."""
    blocks = [flat_bytes(b) for b in source]
    usable = devicehash.usable(blocks)  # checked once: the pass times the hashing alone

    def run(_: int) -> None:
        if usable:
            devicehash.checksums(blocks, checked=True)

    return run
