"""Tier bandwidth next to what the machine does without the tiers, measured interleaved: every
repeat runs each pass once (plain copy, DRAM put and get, plain and direct file writes and
reads, NVMe put and get) and each keeps its best, so that load from other jobs on a shared
machine hits all of them alike.

- DRAM put/get through the sidecar process vs a plain copy of the same 2 MiB blocks with as
  many threads as the client copies on (4), by libc ``memmove`` like the client's, between
  private buffers (``memcpy``) and into a shared-memory mapping like the tier's
  (``memcpy_to_shm``: what writing shared memory costs here); ``torch_copy`` is torch's
  ``copy_`` of the same blocks, for reference; ``copy_hash`` the client's fused copy and
  checksum alone (the compiled routine where it built: ``copy_path`` in the JSON says which ran)
  and ``copy_hash_python`` its Python fallback, side by side; ``copy_hash_stream_to_shm`` the
  fused routine as a save runs it, into shared memory with non-temporal stores (glibc's
  ``memmove`` of a 2 MiB block uses cached stores, which read every destination line from
  memory before writing it). A put hashes every block along its copy and
  hands the sidecar the checksums (nothing is left for its sealer). A get reads the chain put
  a repeat earlier: ``dram_get`` checks every block against its checksum as it copies (the
  default); ``dram_unchecked_get`` is a sidecar with ``dram.verify_reads: false``. DRAM holds
  two chains: the one read and the one put.
- A put ends when the sidecar has committed every block (its reply to the last put: for NVMe,
  written, ``fdatasync``-ed and its index record ``fsync``-ed), as the plain file writes end
  with an fsync, and holds every block's checksum (none left for its sealer). (The engine's
  own save returns before that last reply.)
- NVMe write/read through the sidecar (DRAM off, so every block goes to disk and back) vs
  plain file I/O of the same blocks on the same disk with the same block size and queue depth
  (the NVMe tier's 4 I/O threads, one 2 MiB pwrite/pread each): buffered (the page cache, as a
  plain program does it) and direct (``O_DIRECT``, what the device does). Writes end with an
  fsync; reads start with the file's pages dropped from the page cache. Plain writes overwrite
  the same region every repeat. The ``nvme`` tier writes each chain into slots never written
  before (preallocated, so the file system converts their extents on the first write: slower
  here), as a new tier does until it has filled once; ``direct_fresh_write`` writes each
  repeat into a fresh preallocated region likewise, for the like-for-like ratio. The
  ``nvme_full`` tier is the steady state of a cache: full, so each put evicts the oldest
  chain and writes into slots written before, like the plain overwrites.
- The blocks are views of one page-aligned KV cache, as the engine allocates it on the CPU, so
  the client writes the blocks only NVMe takes into their slots itself (``direct_io``: hashed,
  then written with ``O_DIRECT`` from the cache; no staging copy). ``nvme_staged`` is the same
  full tier with a client that does not ask for that (``direct_io=False``): each block copied
  into a staging slot and written by the sidecar, the path before, side by side.
- ``nvme_prefetch``: the look-ahead's prefetch of a chain from NVMe into DRAM slots, by the
  block service itself in this process (no client copy: the blocks land where a later load's
  DRAM hit reads them), against ``direct_read``.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import mmap
import os
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import torch

from bench.kvtier_sidecar import config, drop_page_cache, refs, remove_shm, sidecar
from strata.worker.engine.model_runner import allocate_cache
from strata.worker.kv_connector import BlockRef
from strata.worker.kvtier.arena import SlotArena, checksum
from strata.worker.kvtier.blockcopy import (
    COPY_THREADS,
    copy_hashing_addresses,
    copy_hashing_all,
    copy_hashing_python,
    flat_bytes,
    host_copy,
)
from strata.worker.kvtier.client import TierClient, save_batches
from strata.worker.kvtier.service import KVTierService, Owner, PutBlock

BLOCK_SHAPE = (32, 2, 16, 8, 128)  # a 16-token block of a Llama-3-8B-like model: 2 MiB in bf16
DTYPE = torch.bfloat16
NUM_BLOCKS = 96  # 192 MiB per pass
REPEATS = 9
THREADS = 4  # the client's copy threads, and the NVMe tier's I/O threads (io_threads)
# The steady-state NVMe tier holds two chains: full (filled with more than it holds before the
# passes), every put evicts the oldest chain and writes into slots written before, as a plain
# program's overwrites do; the other NVMe tier writes each chain into slots never written.
FULL_CHAINS = 2
BLOCK_BYTES = math.prod(BLOCK_SHAPE) * DTYPE.itemsize

Pass = Callable[[int], object]  # one pass over all blocks, in repeat r


def interleaved(
    nbytes: int, passes: dict[str, Pass], pids: dict[str, int], repeats: int = REPEATS
) -> dict[str, Any]:
    """GB/s of each pass, best of ``repeats``, the passes taking turns: by the wall clock
    (``_gbps``), and per CPU-second this process and the pass's sidecar (``pids``, by the
    pass's name less its last word) spent on it (``_cpu_gbps``), which a machine shared with
    other jobs disturbs far less. A DRAM put's checksums are taken along its copy: counted."""
    wall = dict.fromkeys(passes, float("inf"))
    cpu = dict.fromkeys(passes, (float("inf"), 0.0))  # (both processes, the sidecar's share)
    for repeat in range(repeats):
        for name, run in passes.items():
            mine = [pid for tier, pid in pids.items() if name.rsplit("_", 1)[0] == tier]
            started, spent, own = time.perf_counter(), cpu_seconds(mine), time.process_time()
            run(repeat)
            wall[name] = min(wall[name], time.perf_counter() - started)
            total = max(cpu_seconds(mine) - spent, 1e-6)
            cpu[name] = min(cpu[name], (total, total - (time.process_time() - own)))
    result = {f"{name}_gbps": round(nbytes / seconds / 1e9, 3) for name, seconds in wall.items()}
    result |= {f"{name}_cpu_gbps": round(nbytes / seconds / 1e9, 3) for name, (seconds, _) in cpu.items()}
    return result | {"cpu_s_per_gb": cpu_per_gb(nbytes, cpu)}


def ratio(a: float, b: float) -> float:
    """``a / b`` to three places; 0 where nothing was measured against."""
    return round(a / b, 3) if b else 0.0


def gbps_ratios(result: dict[str, Any], table: Iterable[tuple[str, str, str]]) -> dict[str, float]:
    """Each ``(name, pass, against)`` of ``table``: the pass's GB/s over the other's."""
    return {name: ratio(result[f"{of}_gbps"], result[f"{to}_gbps"]) for name, of, to in table}


def cpu_per_gb(nbytes: int, cpu: dict[str, tuple[float, float]]) -> dict[str, dict[str, float]]:
    """CPU-seconds per GB moved, of each pass's best repeat: in all (this process and the
    sidecar) and the sidecar's share, which says where a tier spends beyond its copy."""
    per_gb = 1e9 / nbytes
    return {
        name: {"total": round(total * per_gb, 4), "sidecar": round(max(0.0, sidecar) * per_gb, 4)}
        for name, (total, sidecar) in cpu.items()
    }


def cpu_seconds(pids: list[int]) -> float:
    """CPU time of this process (all threads) and of every thread of ``pids``."""
    total = time.process_time()
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(FileNotFoundError):  # a thread that ended since the listing
                total += int((task / "schedstat").read_text().split()[0]) / 1e9
    return total


def bandwidth(root: Path) -> dict[str, Any]:
    cpu = torch.device("cpu")
    cache = allocate_cache((NUM_BLOCKS, *BLOCK_SHAPE), DTYPE, cpu)  # as the engine allocates its own
    cache.copy_(torch.randn(cache.shape).to(DTYPE))
    blocks = list(cache.unbind())
    out = list(allocate_cache((NUM_BLOCKS, *BLOCK_SHAPE), DTYPE, cpu).unbind())
    block_bytes = blocks[0].numel() * blocks[0].element_size()
    nbytes = NUM_BLOCKS * block_bytes
    pids: dict[str, int] = {}
    with ThreadPoolExecutor(THREADS) as pool, ExitStack() as stack:
        room = (NUM_BLOCKS + 8) * block_bytes
        dram, _ = stack.enter_context(tier_client(root, "dram", pids, dram=2 * room))
        unchecked, _ = stack.enter_context(
            tier_client(root, "dram_unchecked", pids, dram=2 * room, verify=False)
        )
        shm = stack.enter_context(shm_blocks(root, len(blocks), block_bytes))
        nvme, data = stack.enter_context(tier_client(root, "nvme", pids, nvme=(REPEATS + 1) * room))
        full, full_data = stack.enter_context(tier_client(root, "nvme_full", pids, nvme=FULL_CHAINS * room))
        staged, staged_data = stack.enter_context(
            tier_client(root, "nvme_staged", pids, nvme=FULL_CHAINS * room, direct_io=False)
        )
        passes = copy_passes(pool, blocks, out, shm)
        passes |= tier_passes("dram", dram, blocks, out, None)  # DRAM: no file to drop
        passes |= tier_passes("dram_unchecked", unchecked, blocks, out, None)
        passes |= file_passes(root, blocks, pool, out)
        passes |= staged_passes(root, blocks, out, pool)
        passes |= tier_passes("nvme", nvme, blocks, out, data)
        passes |= tier_passes("nvme_full", full, blocks, out, full_data, fill=FULL_CHAINS + 1)
        passes |= tier_passes("nvme_staged", staged, blocks, out, staged_data, fill=FULL_CHAINS + 1)
        service = stack.enter_context(in_process_tier(root, "prefetch", dram=room, nvme=3 * room))
        passes |= prefetch_passes(service, blocks)
        result = interleaved(nbytes, passes, pids)
        result["nvme_full_direct_blocks"] = {"saved": full.direct_saved, "loaded": full.direct_loaded}
        if dram.unverified_blocks:  # (NVMe blocks are verified by the sidecar as they are read)
            raise RuntimeError("kvtier bench: DRAM blocks were read before the sidecar sealed them")
    if not all(
        torch.equal(o.view(torch.int16), b.view(torch.int16)) for o, b in zip(out, blocks, strict=True)
    ):
        raise RuntimeError("kvtier bench: blocks came back different")
    return result


def copy_passes(
    pool: ThreadPoolExecutor, blocks: list[torch.Tensor], out: list[torch.Tensor], shm: list[torch.Tensor]
) -> dict[str, Pass]:
    """Plain copies of the blocks by libc ``memmove``, as the client's host copies are (with its
    thread count, on one thread, into shared memory), torch's ``copy_`` for reference, and the
    client's fused copy and checksum (its path, and the Python fallback) without the tiers."""
    to_out = [(flat_bytes(o), flat_bytes(b)) for o, b in zip(out, blocks, strict=True)]
    to_shm = [(flat_bytes(s), flat_bytes(b)) for s, b in zip(shm, blocks, strict=True)]
    streamed = [(d.data_ptr(), s.data_ptr(), d.numel()) for d, s in to_shm]
    return {
        "memcpy": lambda _: list(pool.map(lambda pair: host_copy(*pair), to_out)),
        "memcpy_1thread": lambda _: list(map(lambda pair: host_copy(*pair), to_out)),
        "memcpy_to_shm": lambda _: list(pool.map(lambda pair: host_copy(*pair), to_shm)),
        "torch_copy": lambda _: list(pool.map(lambda pair: pair[0].copy_(pair[1]), to_out)),
        "copy_hash": lambda _: copy_hashing_all(pool, to_out),
        "copy_hash_stream_to_shm": lambda _: copy_hashing_addresses(pool, streamed, stream=True),
        "copy_hash_python": lambda _: list(pool.map(lambda pair: copy_hashing_python(*pair), to_out)),
    }


@contextmanager
def tier_client(
    root: Path,
    name: str,
    pids: dict[str, int],
    dram: int = 0,
    nvme: int = 0,
    verify: bool = True,
    threads: int = COPY_THREADS,
    gpu_hash: bool = True,
    direct_io: bool = True,
) -> Iterator[tuple[TierClient, Path]]:
    """A sidecar with only this tier (its pid into ``pids``), its client (copying and hashing
    on ``threads``; GPU blocks hashed by the GPU with ``gpu_hash``; writing NVMe blocks itself
    with ``direct_io``), and the NVMe data file."""
    block_bytes = BLOCK_BYTES
    settings = config(root, name, dram=dram, nvme=nvme, verify_reads=verify)
    started: list[int] = []
    with sidecar(root, settings, block_bytes, started) as kv:
        pids[name] = started[0]
        client = TierClient(
            kv.socket_path, BLOCK_SHAPE, DTYPE, threads=threads, gpu_hash=gpu_hash, direct_io=direct_io
        )
        try:
            yield client, Path(kv.nvme.path) / "blocks.dat"
        finally:
            client.close()


def tier_passes(
    tier: str,
    client: TierClient,
    blocks: list[torch.Tensor],
    out: list[torch.Tensor],
    data: Path | None,
    fill: int = 0,
    repeats: int = REPEATS,
) -> dict[str, Pass]:
    """Each repeat gets the chain put a repeat before (a warm-up chain first), which the
    sidecar has sealed since, then puts a fresh one (so nothing is skipped as already held).
    ``fill`` chains are saved before the warm-up, for a tier full from the start."""
    count = len(blocks)
    for n in range(fill):
        client.save_checked(refs(len(tier) * 1000 + 500 + n, count), blocks)
    chains = [refs(len(tier) * 1000 + r, count) for r in range(repeats + 1)]
    client.save_checked(chains[0], blocks)
    wait_sealed(client)

    def get(repeat: int) -> None:
        if data is not None:
            drop_page_cache(data)
        if client.load([b.hash for b in chains[repeat]], out) != count:
            raise RuntimeError(f"kvtier bench: the {tier} tier lost blocks")

    def put(repeat: int) -> None:
        """Ends when every block is committed (NVMe: written and synced) and checksummed: a
        sealing pass the sidecar ran after the save would be part of its cost."""
        if client.save_checked(chains[repeat + 1], blocks) != count:
            raise RuntimeError(f"kvtier bench: the {tier} tier did not store every block")
        wait_sealed(client)

    return {f"{tier}_get": get, f"{tier}_put": put}


@contextmanager
def in_process_tier(
    root: Path, name: str, dram: int, nvme: int, block_bytes: int = BLOCK_BYTES
) -> Iterator[KVTierService]:
    """The sidecar's block service in this process, write-through (every block on NVMe too):
    its own moves between tiers, timed without a client's copy or a round trip to wait on."""
    settings = config(root, name, dram=dram, nvme=nvme, write_mode="write-through").kvtier
    service = KVTierService(settings)
    service.configure(block_bytes)
    try:
        yield service
    finally:
        service.close()
        remove_shm(Path(settings.dram.shm_path))


def prefetch_passes(service: KVTierService, blocks: list[torch.Tensor]) -> dict[str, Pass]:
    """Look-ahead's prefetch: a chain from NVMe into DRAM slots by the service's own path (one
    parallel read per run, each block checked against its checksum) once a queued request
    announced it, against ``direct_read``.
    DRAM holds one chain: two chains take turns, each prefetch evicting the other (already on
    NVMe: write-through), so every repeat reads every block from the disk."""
    chains = [refs(9000 + n, len(blocks)) for n in range(2)]
    for chain in chains:
        _put_in_process(service, chain, blocks)
    dram, nvme = service.dram, service.nvme
    assert dram is not None and nvme is not None
    data = nvme.store.directory / "blocks.dat"
    owner = Owner()

    def prefetch(repeat: int) -> None:
        """As a queued request's announcement does it: its blocks kept (so the chain's head
        DRAM still held is not evicted for its tail) and moved up, then withdrawn."""
        keys = [b.hash for b in chains[repeat % 2]]
        drop_page_cache(data)
        service.expect(owner, "bench", keys)
        service.wait_for_hints()
        service.unexpect(owner, ["bench"])
        if not all(key in dram.index for key in keys):
            raise RuntimeError("kvtier bench: the prefetch did not bring the whole chain up")

    return {"nvme_prefetch": prefetch}


def _put_in_process(service: KVTierService, chain: list[BlockRef], blocks: list[torch.Tensor]) -> None:
    """Save ``chain`` with ``blocks``' bytes, a batch at a time, as a client's puts do."""
    assert service.dram is not None
    owner = Owner()
    for start, stop in save_batches(len(chain), max(1, service.staging_slots // 3)):
        refs_, sources = chain[start:stop], blocks[start:stop]
        slots = service.reserve(owner, [r.hash for r in refs_], [r.parent for r in refs_])
        puts = []
        for ref, source, slot in zip(refs_, sources, slots, strict=True):
            if slot is None:
                raise RuntimeError("kvtier bench: no slot for a block of the prefetch chain")
            target = service.dram.block(slot)
            target[:] = source.view(torch.uint8).reshape(-1).numpy().tobytes()
            puts.append(PutBlock(ref.hash, ref.parent, slot, checksum(target)))
        if service.put(owner, puts) != len(puts):
            raise RuntimeError("kvtier bench: the in-process tier did not store the chain")


@contextmanager
def shm_blocks(root: Path, count: int, block_bytes: int) -> Iterator[list[torch.Tensor]]:
    """Block-sized tensors over a shared-memory mapping, as the tier's slots are."""
    arena = SlotArena(f"/dev/shm/strata-bench-{os.getpid()}-memcpy", block_bytes, count, create=True)
    whole = torch.frombuffer(arena.mmap, dtype=torch.uint8)
    try:
        yield [
            whole[i * block_bytes : (i + 1) * block_bytes].view(DTYPE).view(BLOCK_SHAPE) for i in range(count)
        ]
    finally:
        del whole
        arena.path.unlink(missing_ok=True)


def wait_sealed(client: TierClient, timeout_s: float = 300) -> None:
    """Until the sidecar holds every block's checksum. Polled every millisecond: a pass of 192
    MiB from a GPU lasts a few, and a coarser poll was most of what it measured (at 50 ms a
    put of GPU blocks read 3.4 GB/s whatever the sealer did)."""
    deadline = time.monotonic() + timeout_s
    while (stats := client.stats()) is None or stats.get("unsealed"):
        if time.monotonic() > deadline:
            raise RuntimeError(f"kvtier bench: the sidecar did not seal the blocks in {timeout_s} s")
        time.sleep(0.001)


def file_passes(
    root: Path, blocks: list[torch.Tensor], pool: ThreadPoolExecutor, out: list[torch.Tensor] | None = None
) -> dict[str, Pass]:
    """Plain file I/O of the blocks' bytes: from and into buffers of its own (an anonymous
    mapping), buffered and direct; with ``out``, also direct I/O straight from ``blocks`` and
    into ``out`` (``direct_write_blocks``, ``direct_read_blocks``: what a plain program does
    with the engine's own memory, where the engine's direct I/O runs)."""
    size = blocks[0].numel() * blocks[0].element_size()
    aligned = mmap.mmap(-1, size * len(blocks))  # direct I/O needs page-aligned buffers
    for i, block in enumerate(blocks):
        aligned[i * size : (i + 1) * size] = block.view(torch.uint8).reshape(-1).numpy().tobytes()
    sources = [memoryview(aligned)[i * size : (i + 1) * size] for i in range(len(blocks))]
    reads = mmap.mmap(-1, size * len(blocks))
    targets = [memoryview(reads)[i * size : (i + 1) * size] for i in range(len(blocks))]
    passes: dict[str, Pass] = {}
    for mode, flags in (("file", 0), ("direct", os.O_DIRECT)):
        path = _preallocated(root / f"plain-{mode}.dat", size * len(blocks))
        passes[f"{mode}_write"] = _file_pass(path, flags, sources, pool, os.pwritev, size)
        passes[f"{mode}_read"] = _file_pass(path, flags, targets, pool, os.preadv, size)
    fresh = _preallocated(root / "plain-direct-fresh.dat", REPEATS * size * len(blocks))
    passes["direct_fresh_write"] = _file_pass(fresh, os.O_DIRECT, sources, pool, os.pwritev, size, True)
    if out is not None:
        path = _preallocated(root / "plain-direct-blocks.dat", size * len(blocks))
        own, into = _views(blocks, size), _views(out, size)
        passes["direct_write_blocks"] = _file_pass(path, os.O_DIRECT, own, pool, os.pwritev, size)
        passes["direct_read_blocks"] = _file_pass(path, os.O_DIRECT, into, pool, os.preadv, size)
    return passes


def _views(tensors: list[torch.Tensor], size: int) -> list[memoryview]:
    """The bytes of host tensors, as buffers plain I/O takes (page-aligned: ``allocate_cache``)."""
    return [memoryview((ctypes.c_char * size).from_address(t.data_ptr())).cast("B") for t in tensors]


def staged_passes(
    root: Path,
    blocks: list[torch.Tensor],
    out: list[torch.Tensor],
    pool: ThreadPoolExecutor,
    copy: Callable[[torch.Tensor, torch.Tensor], object] = host_copy,
) -> dict[str, Pass]:
    """Direct file I/O through page-aligned staging buffers, as a plain program must do it when
    its blocks live where the disk cannot reach them (a GPU's memory, another process's): each
    I/O thread copies its block into its buffer (``copy``: by ``memmove``; from a GPU, a DMA
    into page-locked buffers) and writes it, or reads it and copies it out. The tier's NVMe
    path is this, with its checksums and protocol on top."""
    size = blocks[0].numel() * blocks[0].element_size()
    whole, view = _staging(size * len(blocks), pinned=blocks[0].is_cuda)
    slots = [(view[i * size : (i + 1) * size], whole[i * size : (i + 1) * size]) for i in range(len(blocks))]
    sources, targets = [flat_bytes(b) for b in blocks], [flat_bytes(o) for o in out]
    path = _preallocated(root / "plain-staged.dat", size * len(blocks))

    def write(fd: int, i: int, _: int) -> int:
        copy(slots[i][1], sources[i])
        return os.pwritev(fd, [slots[i][0]], i * size)

    def read(fd: int, i: int, _: int) -> int:
        done = os.preadv(fd, [slots[i][0]], i * size)
        copy(targets[i], slots[i][1])
        return done

    count = len(blocks)
    return {  # written before read, each repeat
        "staged_direct_write": _io_pass(path, os.O_DIRECT, pool, write, count, size, writing=True),
        "staged_direct_read": _io_pass(path, os.O_DIRECT, pool, read, count, size, writing=False),
    }


def _staging(nbytes: int, pinned: bool) -> tuple[torch.Tensor, memoryview]:
    """Page-aligned staging buffers (direct I/O needs them), as a tensor and its bytes: an
    anonymous mapping, or page-locked memory from the CUDA driver (DMA to and from the GPU)."""
    if not pinned:
        staging = mmap.mmap(-1, nbytes)
        return torch.frombuffer(staging, dtype=torch.uint8), memoryview(staging)
    whole = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    if whole.data_ptr() % mmap.PAGESIZE:
        raise RuntimeError("kvtier bench: page-locked staging buffers are not page-aligned")
    return whole, whole.numpy().data


def _preallocated(path: Path, nbytes: int) -> Path:
    with open(path, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, nbytes)
    return path


def _file_pass(
    path: Path,
    flags: int,
    buffers: list[memoryview],
    pool: ThreadPoolExecutor,
    io: Callable[..., int],
    size: int,
    fresh: bool = False,
) -> Pass:
    """One pass over ``path``: the same region every repeat, or (``fresh``) repeat r's own."""

    def one(fd: int, i: int, repeat: int) -> int:
        base = repeat * len(buffers) * size if fresh else 0
        return io(fd, [buffers[i]], base + i * size)

    return _io_pass(path, flags, pool, one, len(buffers), size, writing=io is os.pwritev)


def _io_pass(
    path: Path,
    flags: int,
    pool: ThreadPoolExecutor,
    one: Callable[[int, int, int], int],
    count: int,
    size: int,
    writing: bool,
) -> Pass:
    """A pass of ``count`` blocks of ``size`` bytes on the pool's threads, ``one(fd, i,
    repeat)`` each; reads start with the file's pages dropped, writes end with an fsync."""

    def run(repeat: int) -> None:
        if not writing:
            drop_page_cache(path)
        fd = os.open(path, os.O_RDWR | flags)
        try:
            if any(n != size for n in pool.map(lambda i: one(fd, i, repeat), range(count))):
                raise RuntimeError(f"kvtier bench: short {'write' if writing else 'read'} on {path}")
            if writing:
                os.fsync(fd)
        finally:
            os.close(fd)

    return run
