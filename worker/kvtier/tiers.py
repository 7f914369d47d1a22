"""The three lower tiers as the sidecar sees them: an index plus the place the bytes live.

Each class keeps its own slot bookkeeping and nothing else; moving blocks between tiers
(promotion, demotion, cascades) is the service's job. None of them is thread-safe: the
service calls them under its lock.
"""

from __future__ import annotations

import errno
import logging
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterator

from strata.worker.kvtier.arena import SlotArena, checksum
from strata.worker.kvtier.index import Entry, TierIndex
from strata.worker.kvtier.nvme import NvmeStore, Record
from strata.worker.kvtier.shared import BlockStore
from strata.worker.kvtier.slottable import SlotTable

log = logging.getLogger(__name__)
_NO_PARENT = b"\0" * 16
FULL_LOG_EVERY_S = 60.0  # a full shared volume is logged at most this often, not per write


class Leases:
    """Slots being read (a client copying out of a DRAM slot; a promotion reading an NVMe slot
    with the lock released): a slot given back while leased is not handed out again until its
    last lease ends. Counted: one slot may be leased by several readers at once."""

    def __init__(self) -> None:
        self._count: Counter[int] = Counter()
        self._deferred: set[int] = set()

    def __len__(self) -> int:
        return len(self._count)

    def take(self, slot: int) -> None:
        self._count[slot] += 1

    def defer(self, slot: int) -> bool:
        """Whether ``slot``, given back, must wait for its leases to end (then ``end`` says so)."""
        if self._count[slot]:
            self._deferred.add(slot)
            return True
        return False

    def end(self, slot: int) -> bool:
        """One lease ends; True when that made a slot given back meanwhile free."""
        if self._count[slot] <= 0:  # not leased (a Counter's lookup adds nothing)
            return False
        self._count[slot] -= 1
        if self._count[slot]:
            return False
        del self._count[slot]
        if slot not in self._deferred:
            return False
        self._deferred.discard(slot)
        return True

    def returning(self) -> int:
        return len(self._deferred)


class DramTier:
    """Blocks in shared-memory slots ``[0, capacity)``; slots above are staging slots that carry
    blocks to and from the lower tiers when DRAM is full or disabled. A leased slot (the engine
    is copying out of it) is not reused until released, even if its block was evicted.

    With a slot ``table`` (``dram.persistent``), a block with its checksum is recorded there
    (``record``) and its record is cleared when its slot is given back, before the slot can be
    handed out again (the order ``slottable`` explains). ``held`` slots (blocks a restart is
    still verifying) are not free until given back."""

    def __init__(
        self,
        arena: SlotArena,
        capacity: int,
        block_bytes: int,
        eviction: str,
        admission: str = "always",
        table: SlotTable | None = None,
        held: Collection[int] = (),
    ) -> None:
        self.arena = arena
        self.block_bytes = block_bytes
        self.capacity = capacity
        self.index = TierIndex(capacity, eviction, admission)
        self.table = table
        held = set(held)
        self._free = [s for s in range(capacity - 1, -1, -1) if s not in held]
        self._staging = list(range(arena.num_slots - 1, capacity - 1, -1))
        self._leases = Leases()

    def take_slot(self, staging: bool) -> int | None:
        pool = self._staging if staging else self._free
        return pool.pop() if pool else None

    def free_slots(self) -> int:
        return len(self._free)

    def free_staging(self) -> int:
        return len(self._staging)

    def returning_slots(self) -> int:
        """Slots freed while leased: free again once their readers release them."""
        return self._leases.returning()

    def record(self, key: bytes, entry: Entry) -> None:
        """Under the lock, once the block's bytes are in its DRAM slot and its checksum is
        known: a restarted sidecar may find it again (about a microsecond)."""
        table, crc, slot = self.table, entry.checksum, entry.slot
        if table is not None and crc is not None and slot < self.capacity:
            parent = entry.parent
            table.commit(slot, key, parent if type(parent) is bytes else _NO_PARENT, crc)

    def used(self, entry: Entry) -> None:
        """A DRAM block was used (read or saved again): most recent at a restart too."""
        if self.table is not None and entry.slot < self.capacity:
            self.table.touch(entry.slot)

    def give_back(self, slot: int) -> None:
        if self.table is not None and slot < self.capacity:
            self.table.clear(slot)  # first: the slot may be handed out from here on
        if not self._leases.defer(slot):
            (self._free if slot < self.capacity else self._staging).append(slot)

    def lease(self, slot: int) -> None:
        self._leases.take(slot)

    def unlease(self, slot: int) -> None:
        if self._leases.end(slot):
            self.give_back(slot)

    def is_staging(self, slot: int) -> bool:
        return slot >= self.capacity

    def block(self, slot: int) -> memoryview:
        return self.arena.view(slot, self.block_bytes)

    def slot(self, slot: int) -> memoryview:
        """The whole page-aligned slot (the block and its padding), as direct I/O wants it."""
        return self.arena.view(slot)


FULL_VOLUME = (errno.ENOSPC, errno.EDQUOT)
NVME_FULL_RETRY_S = 30.0  # a full volume is tried again this long after a write found it full


class NvmeTier:
    """Blocks in the slots of a preallocated file, indexed in memory and in the store's log.

    A write that finds the volume full (ENOSPC, EDQUOT: the log grows, or someone else filled
    the volume) stops the tier admitting blocks for ``NVME_FULL_RETRY_S``; then one batch tries
    again. Reads go on: the blocks there are as good as before."""

    def __init__(
        self,
        store: NvmeStore,
        persistent: bool,
        eviction: str,
        admission: str = "always",
        expires: bool = True,
    ) -> None:
        self.store = store
        self.index = TierIndex(store.num_slots, eviction, admission, expires)
        recovered = store.recover(persistent)
        count, now = len(recovered), time.time()
        used = bytearray(store.num_slots)
        # Oldest first (the log's order: the first to go again), each record let go as its
        # entry is made, so that a restart holds little more than the index it builds.
        for key in list(recovered):
            r = recovered.pop(key)
            self.index.add(key, Entry(r.parent, r.priority, False, now, r.slot, r.checksum))
            used[r.slot] = 1
        self._free = [s for s in range(store.num_slots - 1, -1, -1) if not used[s]]
        self._leases = Leases()  # slots a promotion reads with the lock released
        self.full_until = 0.0  # time.monotonic() until which a full volume admits nothing
        self.full_reason = ""
        if count:
            log.info("nvme: recovered %d blocks", count)

    def admits_writes(self, now: float) -> bool:
        return now >= self.full_until

    def write_failed(self, err: OSError, now: float) -> bool:
        """A failed write: True (and no admissions for a while) when the volume is full."""
        if err.errno not in FULL_VOLUME:
            return False
        if self.admits_writes(now):
            log.warning(
                "nvme: volume full, admitting no blocks for %.0f s (reads go on): %s", NVME_FULL_RETRY_S, err
            )
        self.full_until, self.full_reason = now + NVME_FULL_RETRY_S, str(err)
        return True

    def write_succeeded(self) -> None:
        if self.full_reason:
            log.info("nvme: writes succeed again; admitting blocks")
        self.full_until, self.full_reason = 0.0, ""

    def take_slot(self) -> int | None:
        return self._free.pop() if self._free else None

    def give_back(self, slot: int) -> None:
        if not self._leases.defer(slot):
            self._free.append(slot)

    def lease(self, slot: int) -> None:
        """A promotion reads this slot without the lock: not rewritten until ``unlease``."""
        self._leases.take(slot)

    def unlease(self, slot: int) -> None:
        if self._leases.end(slot):
            self._free.append(slot)

    def records(self) -> Iterator[Record]:
        """Each held block's log record, made as it is asked for (call with the lock held)."""
        for key in self.index:
            entry = self.index.get(key)
            assert entry is not None and isinstance(key, bytes) and isinstance(entry.parent, bytes)
            yield Record(key, entry.parent, entry.slot, entry.priority, entry.checksum)


class SharedTier:
    """A :class:`BlockStore` that may be unreachable. After an error it is skipped for
    ``backoff_s`` (reads miss, writes are dropped), so a dead volume costs one error, not one
    per block. A full volume is not a dead one (``write_failed``). The index holds only the
    blocks this worker wrote, to bound what it writes; the volume's janitor (``janitor``) keeps
    every worker's blocks together within the volume's size."""

    def __init__(
        self,
        store: BlockStore,
        capacity: int,
        backoff_s: float = 5.0,
        on_full: Callable[[], None] | None = None,
    ) -> None:
        self.store = store
        self.index = TierIndex(capacity, "lru", expires=False)  # retention leaves the volume alone
        self.backoff_s = backoff_s
        self.on_full = on_full  # the volume's janitor, told when a write finds it full
        self._down_until = 0.0
        self._full_logged = -FULL_LOG_EVERY_S

    @property
    def healthy(self) -> bool:
        return time.monotonic() >= self._down_until

    def mark_down(self, err: Exception) -> None:
        log.warning("shared tier unreachable, skipping it for %.0fs: %s", self.backoff_s, err)
        self._down_until = time.monotonic() + self.backoff_s

    def write_failed(self, err: OSError) -> None:
        """A full volume (ENOSPC, EDQUOT) drops this write and calls for a sweep, but reads go
        on: the blocks there are as good as before. Any other error takes the tier down."""
        if err.errno not in (errno.ENOSPC, errno.EDQUOT):
            self.mark_down(err)
            return
        now = time.monotonic()
        if now >= self._full_logged + FULL_LOG_EVERY_S:
            self._full_logged = now
            log.warning("shared tier full, dropping writes until the janitor makes room: %s", err)
        if self.on_full is not None:
            self.on_full()

    def contains(self, key: bytes) -> bool:
        if not self.healthy:
            return False
        try:
            found = self.store.contains(key)
        except OSError as err:
            self.mark_down(err)
            return False
        if not found and key in self.index:  # the volume's janitor removed it: write it again
            self.index.remove(key)
        return found

    def forget(self, key: bytes) -> None:
        """A block found corrupt (and deleted by the store): no longer this worker's."""
        if key in self.index:
            self.index.remove(key)


def verify(data: memoryview, expected: int) -> bool:
    return checksum(data) == expected
