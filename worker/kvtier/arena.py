"""Fixed-size block slots in a shared-memory file, mapped by both the sidecar and the engine.

Block bytes cross the process boundary only here: the engine copies a block into (or out of)
a slot, and the sidecar reads and writes the same pages, so no block ever travels through the
socket or a Python object. Slots are page-aligned so that NVMe I/O from them can be direct.

The sidecar allocates the file's memory in the background right after creating it
(``preallocate``), so that copies on the data path do not pay for allocating and zeroing pages.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import threading
from pathlib import Path

import xxhash

from strata.worker.kvtier.native import copyhash

log = logging.getLogger(__name__)


def checksum(data: memoryview | bytes) -> int:
    """XXH3-64: several times faster than crc32 (the checksum is on every block's path in and
    out), and enough to catch torn and corrupted blocks (it is not meant against an adversary).
    Over writable memory (a slot, a read buffer) by the compiled routine where it built, which
    lets go of the GIL for the whole block, so the sealer's and the NVMe tier's threads hash in
    parallel; else by xxhash (bytes, read-only views: the same value)."""
    routine = copyhash()
    if routine is None or not isinstance(data, memoryview) or data.readonly or not data.nbytes:
        return xxhash.xxh3_64_intdigest(data)
    anchor = ctypes.c_char.from_buffer(data)  # held while hashing: the mapping cannot close meanwhile
    return routine.hash(ctypes.addressof(anchor), data.nbytes)


class SlotArena:
    """``num_slots`` slots of ``slot_bytes`` in the file at ``path``."""

    def __init__(self, path: str | Path, slot_bytes: int, num_slots: int, create: bool) -> None:
        if num_slots <= 0:
            raise ValueError(f"num_slots: must be > 0, got {num_slots}")
        self.path = Path(path)
        self.slot_bytes = slot_bytes
        self.num_slots = num_slots
        size = slot_bytes * num_slots
        if create:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        flags = os.O_RDWR | (os.O_CREAT if create else 0)
        fd = os.open(self.path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, size)
            elif os.fstat(fd).st_size < size:
                raise ValueError(f"shm_path: {self.path} holds fewer than {num_slots} slots")
            self.mmap = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.buffer = memoryview(self.mmap)
        self.preallocated = threading.Event()  # set once ``preallocate`` has run (or failed)

    def preallocate(self) -> None:
        """Allocate every page of the file now (seconds for tens of GiB: run it in the
        background). A memory-backed volume too small shows up here, as a logged warning."""
        try:
            fd = os.open(self.path, os.O_RDWR)
            try:
                os.posix_fallocate(fd, 0, self.slot_bytes * self.num_slots)
            finally:
                os.close(fd)
        except OSError as err:
            log.warning("kvtier: cannot preallocate %s (%s); pages are allocated as used", self.path, err)
        finally:
            self.preallocated.set()

    def view(self, slot: int, length: int | None = None) -> memoryview:
        if not 0 <= slot < self.num_slots:
            raise IndexError(f"slot {slot} out of range [0, {self.num_slots})")
        start = slot * self.slot_bytes
        return self.buffer[start : start + (self.slot_bytes if length is None else length)]

    def close(self) -> None:
        self.buffer.release()
        self.mmap.close()
