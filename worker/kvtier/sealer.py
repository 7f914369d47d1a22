"""Checksums of the blocks saved into DRAM without one, taken in the background: a client
copying from host memory hashes along its copy and sends the checksums (the cheaper way); one
copying from a device does not, its save returns as soon as the copies landed, and the sidecar
hashes those slots afterwards, off the engine's path, without the lock. A checksum is kept
only if its block is still the same entry of the index afterwards: a slot changes hands only
once its block left the index, so what was hashed is what was saved (and the slot accounting
never waits for the sealer).

Until a block is sealed its checksum is None: a read of it is served unverified (there is
nothing yet to verify against, and it was copied in moments ago), and writing it down to NVMe
takes the checksum on the way (``NvmeStore.write``).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager

from strata.worker.kvtier.arena import checksum
from strata.worker.kvtier.background import Loop
from strata.worker.kvtier.tiers import DramTier

BATCH = 64  # blocks sealed per turn of the lock
# Threads hashing a batch (the compiled hash lets go of the GIL): a GPU's copy engine fills
# slots at about 50 GB/s, one thread hashes them at about 10 (on an H200 machine, 96 blocks of
# 2 MiB: 18.9 ms on one thread, 7.7 ms on four, 5.0 on eight).
THREADS = 4


class Sealer:
    def __init__(self, lock: AbstractContextManager[object], dram: DramTier) -> None:
        self.lock = lock
        self.dram = dram
        self._pending: deque[bytes] = deque()
        self._idle = threading.Event()
        self._idle.set()
        self._pool = ThreadPoolExecutor(THREADS, thread_name_prefix="kvtier-sealer")
        self._loop = Loop("sealer", self._seal_batch)

    def add(self, keys: Sequence[bytes]) -> None:
        """Called under the lock with blocks just put into DRAM without a checksum (a host
        client's put brings them all: nothing to do, and no thread is woken for nothing)."""
        if not keys:
            return
        self._pending.extend(keys)
        self._idle.clear()
        self._loop.wake()

    def wait_idle(self, timeout: float) -> bool:
        """Until every block added so far is sealed (tests and benchmarks)."""
        return self._idle.wait(timeout)

    def stop(self) -> None:
        self._loop.stop()
        self._pool.shutdown()

    def _seal_batch(self) -> bool:
        with self.lock:
            batch = [self._pending.popleft() for _ in range(min(BATCH, len(self._pending)))]
            todo = [(k, e) for k in batch if (e := self.dram.index.get(k)) is not None and e.checksum is None]
            if not batch:
                self._idle.set()
                return False
        sums = list(self._pool.map(lambda pair: checksum(self.dram.block(pair[1].slot)), todo))
        with self.lock:
            for (key, entry), crc in zip(todo, sums, strict=True):
                if self.dram.index.get(key) is entry:  # still the same block in the same slot
                    entry.checksum = crc
                    self.dram.record(key, entry)  # a restart may find it from now on
        return True
