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
  checksum (the client hashes only staging slots from a GPU; the sealer hashes the others).
- ``dram_get``: the chain put a repeat earlier loaded back into GPU blocks, each slot checked
  against its checksum (on the client's threads while the DMA runs), against ``h2d``.
- ``d2h_pageable`` / ``h2d_pageable``: the same copies through ordinary (pageable) host
  memory, which is what a connector whose slots were not page-locked would get.

On the CPU the same passes run as host copies, which is what the test does to check them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch

from bench.kvtier_bandwidth import (
    BLOCK_SHAPE,
    DTYPE,
    NUM_BLOCKS,
    REPEATS,
    Pass,
    gbps_ratios,
    interleaved,
    tier_client,
    tier_passes,
    wait_sealed,
)
from bench.kvtier_sidecar import refs
from strata.worker.kvtier.blockcopy import COPY_THREADS, DEVICE_COPY_THREADS
from strata.worker.kvtier.client import TierClient

# The client's thread counts the DRAM passes run with: a CUDA engine's (``dram``), a host
# engine's and more. From a GPU the copy engine copies and these threads hash the slots.
CLIENT_THREADS = (DEVICE_COPY_THREADS, COPY_THREADS, 12)
# (ratio, pass, the pass it is measured against), by wall-clock GB/s
RATIOS = (
    ("dram_put_over_d2h", "dram_put", "d2h"),
    ("dram_get_over_h2d", "dram_get", "h2d"),
    ("dram_save_over_d2h", "dram_save", "d2h"),
    ("dram_save_returned_over_d2h", "dram_save_returned", "d2h"),
    ("d2h_pageable_over_d2h", "d2h_pageable", "d2h"),
    ("h2d_pageable_over_h2d", "h2d_pageable", "h2d"),
)


def device_bandwidth(
    root: Path,
    device: torch.device,
    blocks: int = NUM_BLOCKS,
    repeats: int = REPEATS,
    threads: Sequence[int] = CLIENT_THREADS,
) -> dict[str, Any]:
    """GB/s of each pass (best of ``repeats``) and the ratios, the DRAM tier's passes once per
    client thread count (``dram`` a CUDA engine's count, ``dram_t<n>`` the others, each with
    its own sidecar); raises when a block comes back different from the one saved."""
    source = [torch.randn(BLOCK_SHAPE, device=device).to(DTYPE) for _ in range(blocks)]
    out = [torch.empty_like(b) for b in source]
    pinned = [torch.empty(BLOCK_SHAPE, dtype=DTYPE, pin_memory=device.type == "cuda") for _ in source]
    pageable = [torch.empty(BLOCK_SHAPE, dtype=DTYPE) for _ in source]
    nbytes = blocks * math.prod(BLOCK_SHAPE) * DTYPE.itemsize
    room = 3 * (blocks + 8) * nbytes // blocks  # the chain read, the chain put, the chain saved
    pids: dict[str, int] = {}
    returned: list[float] = []
    with ExitStack() as stack:
        passes = copy_passes(device, source, out, pinned, pageable)
        for count in threads:
            tier = "dram" if count == DEVICE_COPY_THREADS else f"dram_t{count}"
            client, _ = stack.enter_context(tier_client(root, tier, pids, dram=room, threads=count))
            passes |= tier_passes(tier, client, source, out, None, repeats=repeats)
            if count == DEVICE_COPY_THREADS:
                passes["dram_save"] = save_pass(client, source, returned)
        result = interleaved(nbytes, passes, pids, repeats)
    result["dram_save_returned_gbps"] = round(nbytes / min(returned) / 1e9, 3)
    pairs = zip(out, source, strict=True)
    if not all(torch.equal(o.view(torch.int16), b.view(torch.int16)) for o, b in pairs):
        raise RuntimeError("kvtier device bench: blocks came back different")
    result["ratios"] = gbps_ratios(result, ratios(threads))
    return result


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


def ratios(threads: Sequence[int]) -> list[tuple[str, str, str]]:
    """``RATIOS``, and a DRAM put's and get's for each other client thread count."""
    more = [f"dram_t{count}" for count in threads if count != DEVICE_COPY_THREADS]
    return list(RATIOS) + [
        (f"{tier}_{op}_over_{against}", f"{tier}_{op}", against)
        for tier in more
        for op, against in (("put", "d2h"), ("get", "h2d"))
    ]


def copy_passes(
    device: torch.device,
    source: list[torch.Tensor],
    out: list[torch.Tensor],
    pinned: list[torch.Tensor],
    pageable: list[torch.Tensor],
) -> dict[str, Pass]:
    """Torch's copies of the blocks between the device and host memory, without the tiers."""
    return {
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
