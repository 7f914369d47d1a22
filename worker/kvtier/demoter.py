"""The background demoter (write-back with a lower tier): keeps a reserve of free DRAM slots
by demoting the eviction order's next victims to NVMe or the shared tier, with the I/O outside
the service's lock, so that a save needing room finds it at once instead of waiting for the
NVMe writes of its victims.

A demoting block has left the DRAM index but keeps its slot until its write is committed
below, and is served from that slot meanwhile (lookups and reads see it as a DRAM block).
The reserve costs DRAM a small share of its capacity: ``reserve`` slots, between one batch
and a quarter of the tier, about 1/64 of it.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

from strata.worker.kvtier.background import Loop
from strata.worker.kvtier.movement import Mover

RESERVE_SHARE = 64  # keep about 1/64 of DRAM free (checked whenever a request takes slots)


def reserve_slots(capacity: int, batch: int) -> int:
    """Free slots to keep: at least one batch, at most a quarter of the tier."""
    return min(max(batch, capacity // RESERVE_SHARE), capacity // 4)


class Demoter:
    def __init__(self, lock: AbstractContextManager[object], mover: Mover, batch: int) -> None:
        self.lock = lock
        self.mover = mover
        self.batch = batch
        self.reserve = reserve_slots(mover.dram.capacity, batch)
        self._loop = Loop("demoter", self.demote_batch)

    def poke(self) -> None:
        """Called under the lock after slots were taken: wake up if the reserve ran low."""
        if self.mover.dram.free_slots() < self.reserve:
            self._loop.wake()

    def stop(self) -> None:
        self._loop.stop()

    def demote_batch(self) -> bool:
        """Demote up to one batch while the reserve is short; False when nothing was to do."""
        mover = self.mover
        with self.lock:
            short = self.reserve - mover.dram.free_slots() - mover.dram.returning_slots()
            victims = mover.detach_victims(min(short, self.batch)) if short > 0 else []
            if not victims:
                return False
            plan = mover.writer.plan(victims, demoting=True)
        mover.writer.write(plan)  # the bytes stay in the victims' slots until committed
        with self.lock:
            mover.writer.commit(plan)
            mover.finish_demotion(victims)
        return True
