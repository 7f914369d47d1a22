"""The engine's own NVMe block I/O (the engine's side of ``direct``): each block hashed in the
engine's KV cache and written from there into its NVMe slot with ``O_DIRECT`` (the device
reads the cache's pages itself), or read from its slot straight into the cache and hashed
there, by the descriptor the sidecar passed. No staging copy: a plain program's direct I/O of
the same blocks is the measure (docs/kvtier.md).

Direct I/O needs page-aligned buffers of whole pages: the engine's KV cache is allocated so
(``engine.model_runner.allocate_cache``), and ``direct_ready`` says when a save's blocks do.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait

from strata.worker.kv_connector import PAGE
from strata.worker.kvtier.arena import checksum
from strata.worker.kvtier.nvme import read_all, write_all

# Threads hashing beside the direct I/O. At disk speed (5-7 GB/s) the hash (about 25 GB/s a
# thread) needs a quarter of a core, and more threads take cores from the I/O threads' own
# work: a durable 192 MiB save with 1, 2 and 4 of them, side by side (15 tries each, three
# runs, 2 cores), ran at 0.74-0.76x, 0.76-0.80x and 0.75-0.77x of plain direct writes.
HASH_THREADS = 2


def direct_ready(addresses: Sequence[int], size: int) -> bool:
    """Whether blocks of ``size`` bytes at ``addresses`` can be written directly."""
    return size % PAGE == 0 and all(address % PAGE == 0 for address in addresses)


def write_blocks(
    io: ThreadPoolExecutor, hasher: ThreadPoolExecutor, fd: int, writes: Sequence[tuple[int, int]], size: int
) -> list[int]:
    """Write each block of ``size`` bytes at address ``a`` to byte ``o`` of ``fd`` (each
    ``(a, o)`` of ``writes``) on ``io``'s threads (its queue depth), and hash it meanwhile on
    ``hasher``'s (``HASH_THREADS``): the bytes do not change while both read them, so no write
    waits for a hash. The checksums, in order. Returns, or raises the first OSError, only
    once every write has ended: none still runs into a slot the sidecar may give back."""
    sums = [hasher.submit(hash_at, address, size) for address, _ in writes]
    pending = [io.submit(write_all, fd, _view(address, size), offset) for address, offset in writes]
    wait(pending)
    wait(sums)
    for future in pending:
        future.result()
    return [future.result() for future in sums]


def read_blocks(
    io: ThreadPoolExecutor, hasher: ThreadPoolExecutor, fd: int, reads: Sequence[tuple[int, int]], size: int
) -> list[int | None]:
    """Read ``size`` bytes at byte ``o`` of ``fd`` into address ``a`` (each ``(a, o)`` of
    ``reads``) on ``io``'s threads, each block hashed on ``hasher``'s as soon as it is in
    (while the reading thread goes on to its next block); the checksums, None where the file
    ended first. Returns, or raises the first OSError, once every read has ended."""

    def read(address: int, offset: int) -> Future[int] | None:
        return hasher.submit(hash_at, address, size) if read_all(fd, _view(address, size), offset) else None

    pending = [io.submit(read, address, offset) for address, offset in reads]
    wait(pending)
    hashing = [future.result() for future in pending]
    return [future.result() if future is not None else None for future in hashing]


def hash_at(address: int, size: int) -> int:
    """The block checksum (``arena.checksum``) of ``size`` bytes at ``address``."""
    return checksum(_view(address, size))


def _view(address: int, size: int) -> memoryview:
    return memoryview((ctypes.c_char * size).from_address(address)).cast("B")
