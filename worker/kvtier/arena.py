"""Fixed-size block slots in a shared-memory file, mapped by both the sidecar and the engine.

Block bytes cross the process boundary only here: the engine copies a block into (or out of)
a slot, and the sidecar reads and writes the same pages, so no block ever travels through the
socket or a Python object. Slots are page-aligned so that NVMe I/O from them can be direct.

The file's memory is allocated when the sidecar creates it, and both sides map it with its page
tables filled in, so that no copy on the data path pays for page faults or zeroing (and a pod
short of memory fails at start, not in the middle of a save).
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import xxhash

PAGE = 4096


def slot_bytes_for(block_bytes: int) -> int:
    """A slot holds one block, rounded up to a whole page."""
    if block_bytes <= 0:
        raise ValueError(f"block_bytes: must be > 0, got {block_bytes}")
    return -(-block_bytes // PAGE) * PAGE


def checksum(data: memoryview | bytes) -> int:
    """XXH3-64: several times faster than crc32 (the checksum is on every block's path in and
    out), and enough to catch torn and corrupted blocks (it is not meant against an adversary)."""
    return xxhash.xxh3_64_intdigest(data)


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
                os.posix_fallocate(fd, 0, size)
            elif os.fstat(fd).st_size < size:
                raise ValueError(f"shm_path: {self.path} holds fewer than {num_slots} slots")
            self.mmap = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
        finally:
            os.close(fd)
        self.buffer = memoryview(self.mmap)

    def view(self, slot: int, length: int | None = None) -> memoryview:
        if not 0 <= slot < self.num_slots:
            raise IndexError(f"slot {slot} out of range [0, {self.num_slots})")
        start = slot * self.slot_bytes
        return self.buffer[start : start + (self.slot_bytes if length is None else length)]

    def close(self) -> None:
        self.buffer.release()
        self.mmap.close()
