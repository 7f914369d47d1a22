"""Copying blocks between engine tensors and shared-memory slots. A load's checksum rides
along the copy: each piece of a block is hashed right after it was copied, while it is still in
the core's cache, so a checked copy reads the slot's memory once instead of twice. (A save is a
plain copy: the sidecar takes the checksum afterwards, off the engine's path.)

On a CUDA device the copy is a DMA from or to the page-locked slot: the host hashes the slot
while the copy engine runs, and one synchronize ends the batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import torch
import xxhash

CHUNK = 256 * 1024  # bytes copied, then hashed, at a time: well inside a core's L2


def flat_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's bytes as a flat uint8 view (a view, never a copy)."""
    if not tensor.is_contiguous():
        raise ValueError("block tensors must be contiguous (the engine's blocks are)")
    return tensor.view(-1).view(torch.uint8)


def copy_hashing(dst: torch.Tensor, src: torch.Tensor, slot: memoryview) -> int:
    """``dst.copy_(src)`` piece by piece; returns the XXH3-64 of ``slot`` (the bytes of
    ``dst`` or ``src`` that live in shared memory), equal to
    :func:`~strata.worker.kvtier.arena.checksum` of the whole slot. ``dst`` and ``src`` are
    flat uint8 host tensors of ``len(slot)`` bytes."""
    digest = xxhash.xxh3_64()
    for start in range(0, len(slot), CHUNK):
        stop = start + CHUNK
        dst[start:stop].copy_(src[start:stop])
        digest.update(slot[start:stop])
    return digest.intdigest()


def copy_blocks(
    pool: ThreadPoolExecutor,
    pairs: Sequence[tuple[torch.Tensor, torch.Tensor]],
    hashed: Sequence[memoryview] | None,
    page_locked: bool,
) -> list[int]:
    """Copy ``dst, src`` pairs (flat uint8 views), all finished on return. With ``hashed``
    (the slots read from, one per pair) returns each one's checksum, taken along: host copies
    run on ``pool`` hashed piece by piece; device copies are queued asynchronously (DMA from
    the page-locked mapping) and the slots hashed on ``pool`` meanwhile."""
    devices = {t.device for pair in pairs for t in pair if t.is_cuda}
    if not devices:
        if hashed is None:
            list(pool.map(lambda pair: pair[0].copy_(pair[1]), pairs))
            return []
        return list(pool.map(lambda i: copy_hashing(*pairs[i], hashed[i]), range(len(pairs))))
    for dst, src in pairs:
        dst.copy_(src, non_blocking=page_locked)
    sums = list(pool.map(xxhash.xxh3_64_intdigest, hashed)) if hashed is not None else []
    _synchronize(devices)
    return sums


def _synchronize(devices: set[torch.device]) -> None:
    for device in devices:
        torch.cuda.synchronize(device)
