"""Copying blocks between engine tensors and shared-memory slots, with the checksums of the
slots taken by the copying threads: a load checks each block it copies out; a save hands the
sidecar each block's checksum, so neither the NVMe write path nor the DRAM sealer reads the
slot again. (A save from a device hashes only its staging slots, written down at once; the
sidecar seals its DRAM slots afterwards, off the engine's path.)

Host copies are libc ``memmove`` (through ctypes, which lets go of the GIL): 1.1-1.2x the bytes
per CPU-second of torch's ``copy_`` here. A checked copy is fused with its hash: the compiled
routine (:mod:`~strata.worker.kvtier.native`) copies a block 16 KiB at a time and runs XXH3 over
each piece right after, while it is in L1, so the block is read from memory once and the hash
mostly hides behind the copy's memory stalls; a batch is one call per copying thread. Saves and
loads store past the cache (non-temporal stores): a save's slot is not read soon, a load is
mostly more than a cache holds. Without a
compiler, the same in Python: 256 KiB chunks, each copied by ``memmove`` and fed to a streaming
XXH3 (two GIL handovers per chunk; the hash costs 20-35 % of the copy's CPU there).

On a CUDA device the copy is a DMA from or to the page-locked slot, and the GPU hashes the
blocks itself (:mod:`~strata.worker.kvtier.devicehash`, on a side stream): a save while the copy
engine copies them, a load a part at a time as its copies land. Where the GPU cannot, the host
hashes: a load the slots while the copy engine runs, a save its staging slots each as soon as
its own copy has landed (an event per block); one synchronize ends the batch.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import torch
import xxhash

from strata.worker.kvtier import devicehash
from strata.worker.kvtier.arena import checksum
from strata.worker.kvtier.native import copyhash

# The Python path copies, then hashes, a chunk at a time: small enough to stay in a core's L2
# between the two (2 MiB here), large enough that the two calls per chunk cost little (checked
# DRAM get, 2 MiB blocks, 4 threads, bytes per CPU-second against plain memmove: 64 KiB
# 0.78-0.86, 256 KiB 0.77-0.90, 512 KiB 0.71-0.78, whole block then hash 0.70-0.76).
CHUNK_BYTES = 256 << 10
# The compiled path's pieces stay in L1 (48 KiB here) between copy and hash (96 blocks of 2 MiB,
# 4 threads, CPU-seconds against memmove, two runs: 1 KiB 0.97/0.97, 4 KiB 0.91/0.91, 16 KiB
# 1.02/0.96, 64 KiB 0.90/0.83, 256 KiB 0.89/0.89).
NATIVE_CHUNK_BYTES = 16 << 10
COPY_THREADS = 4  # the client's copying threads (a batch is split into this many shares)
# A CUDA engine's client threads: the copy engine copies and they hash the slots (a load checks
# every block while its DMA runs), about 10 GB/s a thread against a DMA of about 50. On an H200,
# 96 blocks of 2 MiB, side by side in one run, twice: a DRAM load at 0.37x / 0.38x of the copy
# engine's rate with 4 threads, 0.49x / 0.50x with 8, 0.42x / 0.42x with 12.
DEVICE_COPY_THREADS = 8

log = logging.getLogger(__name__)
_gpu_hash_failed = False  # set once the GPU's hash failed here: the host hashes from then on
# A load's blocks are hashed by the GPU in this many parts, each as soon as its copies landed
# (while the copy engine moves the next), so that only the last part's hash follows the copies.
LOAD_HASH_PARTS = 4


def flat_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's bytes as a flat uint8 view (a view, never a copy)."""
    if not tensor.is_contiguous():
        raise ValueError("block tensors must be contiguous (the engine's blocks are)")
    return tensor.view(-1).view(torch.uint8)


def host_copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst.copy_(src)`` for flat uint8 host tensors of one length, by ``memmove``."""
    _check_pair(dst, src)
    ctypes.memmove(dst.data_ptr(), src.data_ptr(), dst.numel())


def copy_hashing(dst: torch.Tensor, src: torch.Tensor) -> int:
    """``host_copy(dst, src)`` and the XXH3-64 of the bytes copied (equal to
    :func:`~strata.worker.kvtier.arena.checksum` of either), taken along the copy."""
    routine = copyhash()
    if routine is None:
        return copy_hashing_python(dst, src)
    _check_pair(dst, src)
    return routine.copy_hash(dst.data_ptr(), src.data_ptr(), dst.numel(), NATIVE_CHUNK_BYTES)


def copy_hashing_python(dst: torch.Tensor, src: torch.Tensor) -> int:
    """The fallback: chunk by chunk from ``dst``, each right after its copy, while in cache."""
    _check_pair(dst, src)
    return _copy_hashing_address_python(dst.data_ptr(), src.data_ptr(), dst.numel())


def _copy_hashing_address_python(dst: int, src: int, size: int) -> int:
    state = xxhash.xxh3_64()
    written = memoryview((ctypes.c_char * size).from_address(dst)).cast("B")
    for offset in range(0, size, CHUNK_BYTES):
        piece = min(CHUNK_BYTES, size - offset)
        ctypes.memmove(dst + offset, src + offset, piece)
        state.update(written[offset : offset + piece])
    return state.intdigest()


def copy_hashing_all(
    pool: ThreadPoolExecutor, pairs: Sequence[tuple[torch.Tensor, torch.Tensor]], stream: bool = False
) -> list[int]:
    """:func:`copy_hashing` of every host pair on ``pool``, in order (``stream``: see
    :func:`copy_hashing_addresses`)."""
    for dst, src in pairs:
        _check_pair(dst, src)
    copies = [(dst.data_ptr(), src.data_ptr(), dst.numel()) for dst, src in pairs]
    return copy_hashing_addresses(pool, copies, stream)


def copy_hashing_addresses(
    pool: ThreadPoolExecutor, copies: Sequence[tuple[int, int, int]], stream: bool = False
) -> list[int]:
    """Copy every ``(dst, src, size)`` of host memory on ``pool``, each hashed along its copy;
    the checksums, in order. The caller vouches for the addresses (:func:`host_sources`).
    Compiled: split into ``COPY_THREADS`` shares, each one call (one GIL handover); with
    ``stream``, past the cache: for destinations no core reads soon (a save's slots), or
    more than a cache holds (a load's blocks), where a cached store only adds a memory pass."""
    routine = copyhash()
    if routine is None:
        return list(pool.map(lambda copy: _copy_hashing_address_python(*copy), copies))
    shares = [list(copies[i::COPY_THREADS]) for i in range(min(COPY_THREADS, len(copies)))]
    sums = list(pool.map(lambda share: routine.copy_hash_many(share, NATIVE_CHUNK_BYTES, stream), shares))
    return [sums[i % len(shares)][i // len(shares)] for i in range(len(copies))]


def host_sources(tensors: Sequence[torch.Tensor], size: int) -> list[int] | None:
    """The data addresses of host block tensors of ``size`` bytes each; None when one lives on
    a device (the caller copies by torch then). A save's hot path: a raw address per block
    where flat views of the block and its slot cost 7 us a block (3 % of a 2 MiB block's copy
    and checksum); the checks the views made are made here."""
    addresses: list[int] = []
    for tensor in tensors:
        if tensor.is_cuda:
            return None
        if not tensor.is_contiguous():
            raise ValueError("block tensors must be contiguous (the engine's blocks are)")
        if tensor.numel() * tensor.element_size() != size:
            raise ValueError(f"block copy: {tensor.numel() * tensor.element_size()} bytes into {size}")
        addresses.append(tensor.data_ptr())
    return addresses


def _check_pair(dst: torch.Tensor, src: torch.Tensor) -> None:
    """Raw copies trust the pointers: both flat uint8 host tensors, contiguous, of one length."""
    for t in (dst, src):
        if t.dtype != torch.uint8 or t.dim() != 1 or not t.is_contiguous() or t.is_cuda:
            raise ValueError("block copies take flat contiguous uint8 host tensors (flat_bytes)")
    if dst.numel() != src.numel():
        raise ValueError(f"block copy: {src.numel()} bytes into {dst.numel()}")


def copy_blocks(
    pool: ThreadPoolExecutor,
    pairs: Sequence[tuple[torch.Tensor, torch.Tensor]],
    hashed: bool,
    page_locked: bool,
    gpu_hash: bool = True,
    stream: bool = False,
) -> list[int]:
    """Copy ``dst, src`` pairs (flat uint8 views), all finished on return. With ``hashed``
    returns each source's checksum (the slots read from), taken along: host copies run on
    ``pool``, each hashed chunk by chunk as it is copied (with ``stream``, storing past the
    cache: :func:`copy_hashing_addresses`); device copies are queued
    asynchronously (DMA from the page-locked mapping), then with ``gpu_hash`` the blocks are
    hashed where they landed, by the GPU (:mod:`~strata.worker.kvtier.devicehash`); else (or
    where it cannot) the slots are hashed on ``pool`` meanwhile, by the compiled routine where
    it built (it lets go of the GIL)."""
    devices = {t.device for pair in pairs for t in pair if t.is_cuda}
    if not devices:
        if not hashed:
            list(pool.map(lambda pair: host_copy(*pair), pairs))
            return []
        return copy_hashing_all(pool, pairs, stream)
    if hashed and gpu_hash and _gpu_hashes([dst for dst, _ in pairs]):
        on_device = _load_hashed_by_gpu(pairs, page_locked)
        if on_device is not None:
            return on_device
    for dst, src in pairs:
        dst.copy_(src, non_blocking=page_locked)
    sums = list(pool.map(lambda pair: slot_hash(pair[1]), pairs)) if hashed else []
    _synchronize(devices)
    return sums


def _synchronize(devices: set[torch.device]) -> None:
    for device in devices:
        torch.cuda.synchronize(device)


def save_blocks(
    pool: ThreadPoolExecutor,
    pairs: Sequence[tuple[torch.Tensor, torch.Tensor]],
    wanted: Sequence[bool],
    page_locked: bool,
    gpu_hash: bool = True,
) -> list[int | None]:
    """Copy ``slot, source`` pairs into the slots, all finished on return, with checksums of
    the slots. Host copies hash every slot along the copy (fused, it costs less CPU than the
    sidecar's sealing pass over the slot afterwards, which reads it from memory again). Device
    copies hash only the slots ``wanted`` (the staging ones, written down at once; None for the
    others, which the sidecar seals off the engine's path, so that a save costs the engine no
    more than its DMA): the copies are queued, each followed by an event, and ``pool`` hashes
    a wanted slot as soon as its own copy has landed, while the copy engine moves the next.
    With ``gpu_hash`` (where it can), the GPU hashes every source block instead, on a stream
    of its own while the copies run: every slot comes with its checksum, none by the host."""
    if not any(t.is_cuda for pair in pairs for t in pair):
        return list(copy_hashing_all(pool, pairs))
    if gpu_hash and _gpu_hashes([source for _, source in pairs]):
        return list(_save_hashed_by_gpu(pairs, page_locked))
    landed = []
    for slot, source in pairs:
        slot.copy_(source, non_blocking=page_locked)
        event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        event.record()
        landed.append(event)
    work = zip(landed, pairs, wanted, strict=True)
    sums = list(pool.map(lambda job: _hash_once_landed(job[0], job[1][0], job[2]), work))
    landed[-1].synchronize()  # (events complete in order: every copy has landed)
    return sums


def _load_hashed_by_gpu(
    pairs: Sequence[tuple[torch.Tensor, torch.Tensor]], page_locked: bool
) -> list[int] | None:
    """Copy the slots into the blocks in ``LOAD_HASH_PARTS`` parts; the GPU hashes each part
    on a side stream once its copies have landed, while the copy engine moves the next, so
    only the last part's hash follows the copies. The blocks' checksums, all finished on
    return; None if the GPU's hash failed (the caller copies and hashes again, on the host)."""
    main = torch.cuda.current_stream()
    side = _side_stream(main.device)
    size = -(-len(pairs) // LOAD_HASH_PARTS)
    queued = []
    try:
        for start in range(0, len(pairs), size):
            part = pairs[start : start + size]
            for dst, src in part:
                dst.copy_(src, non_blocking=page_locked)
            side.wait_stream(main)
            with torch.cuda.stream(side):
                queued.append(devicehash.queue([dst for dst, _ in part]))
        with torch.cuda.stream(side):
            return devicehash.words(queued)
    except Exception as err:
        _gpu_hash_fails(err)
        return None


def _save_hashed_by_gpu(pairs: Sequence[tuple[torch.Tensor, torch.Tensor]], page_locked: bool) -> list[int]:
    """The sources' checksums by the GPU, hashed on a side stream while the copy engine copies
    them into the slots; both finished on return (a failed GPU hash: by the host, after)."""
    main = torch.cuda.current_stream()
    side = _side_stream(main.device)
    side.wait_stream(main)  # the blocks as the engine left them
    for slot, source in pairs:
        slot.copy_(source, non_blocking=page_locked)
    with torch.cuda.stream(side):
        sums = _hashed_by_gpu([source for _, source in pairs])
    main.synchronize()
    return sums if sums is not None else [slot_hash(slot) for slot, _ in pairs]


@functools.cache
def _side_stream(device: torch.device) -> torch.cuda.Stream:
    return torch.cuda.Stream(device)  # type: ignore[no-untyped-call]


def _gpu_hashes(blocks: Sequence[torch.Tensor]) -> bool:
    """Whether the GPU hashes these blocks: it can (:func:`devicehash.usable`) and has not failed."""
    return not _gpu_hash_failed and devicehash.usable(blocks)


def _hashed_by_gpu(blocks: Sequence[torch.Tensor]) -> list[int] | None:
    """:func:`devicehash.checksums` of blocks it can hash (checked by the caller), or None if
    it failed (it is then not asked again: the host hashes)."""
    try:
        return devicehash.checksums(blocks, checked=True)
    except Exception as err:  # a kernel that would not build here: the host path still works
        _gpu_hash_fails(err)
        return None


def warm_gpu_hash(device: torch.device, block_bytes: int) -> bool:
    """Build the GPU hash's kernels for blocks of ``block_bytes`` on ``device`` now (Triton
    compiles them on first use, about a second), so that the engine's first save or load does
    not wait for it; whether the GPU will hash such blocks (logged either way)."""
    try:
        blocks = [torch.zeros(block_bytes, dtype=torch.uint8, device=device)]
    except RuntimeError:  # no device to build for after all: the first copy will say why
        blocks = []
    ready = _gpu_hashes(blocks) and _hashed_by_gpu(blocks) is not None
    log.info(
        "kvtier: %s hashes the blocks it saves and loads",
        "the GPU" if ready else "the host",
        extra={"event": "gpu_hash_ready" if ready else "gpu_hash_unavailable", "block_bytes": block_bytes},
    )
    return ready


def _gpu_hash_fails(err: Exception) -> None:
    global _gpu_hash_failed
    _gpu_hash_failed = True
    log.warning(
        "kvtier: hashing blocks on the GPU failed; the host hashes them",
        extra={"event": "gpu_hash_failed", "error": repr(err)},
    )


def _hash_once_landed(event: torch.cuda.Event, slot: torch.Tensor, wanted: bool) -> int | None:
    if not wanted:
        return None
    event.synchronize()
    return slot_hash(slot)


def slot_hash(slot: torch.Tensor) -> int:
    """:func:`~strata.worker.kvtier.arena.checksum` of a flat uint8 host tensor (a slot: writable,
    so by the compiled routine where it built, which lets go of the GIL for the whole block)."""
    _check_pair(slot, slot)
    return checksum(slot.numpy().data)
