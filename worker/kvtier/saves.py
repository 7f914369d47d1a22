"""Blocks in from the engine: a slot for each (``reserve``), then their commit (``put``).

A block DRAM admits gets a DRAM slot; one it refuses, a staging slot when a lower tier may
store it (or, for an engine granted direct I/O, an NVMe slot to write itself: ``direct``). A
put enters DRAM's blocks at once and queues the staging blocks' writes to the committer thread,
which writes, syncs and logs them outside the lock, then frees their staging slots.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass

from strata.worker.kvtier import direct
from strata.worker.kvtier.direct import DirectIO
from strata.worker.kvtier.index import Entry
from strata.worker.kvtier.leases import Owner
from strata.worker.kvtier.movement import Mover
from strata.worker.kvtier.state import ServiceState
from strata.worker.kvtier.writedown import WritePlan

log = logging.getLogger(__name__)
Block = tuple[bytes, Entry]
STAGING_WAIT_S = 120.0  # a reserve waits at most this long for in-flight puts' staging slots


@dataclass(frozen=True)
class PutBlock:
    key: bytes
    parent: bytes
    slot: int
    checksum: int | None = None  # the client's, of the slot's bytes; None: taken in the background


class Saves:
    def __init__(self, state: ServiceState, direct_io: DirectIO) -> None:
        self.state, self.direct_io = state, direct_io

    def reserve(
        self, owner: Owner, keys: Sequence[bytes], parents: Sequence[bytes | None] | None = None
    ) -> list[int | None]:
        """A slot per key to copy the block into, or None where the tiers already hold it (or
        none would take it). A block DRAM admits gets a DRAM slot; one it refuses gets a
        staging slot when a lower tier may store it. Reserved slots belong to ``owner`` until
        ``put``."""
        return self.reserve_direct(owner, keys, parents, direct=False)[0]

    def reserve_direct(
        self, owner: Owner, keys: Sequence[bytes], parents: Sequence[bytes | None] | None, direct: bool
    ) -> tuple[list[int | None], list[int | None]]:
        """``reserve``; with ``direct`` (an owner granted ``direct_io``), a block DRAM refuses
        gets an NVMe slot for the engine to write itself (second list) where NVMe admits it,
        instead of a staging slot; one NVMe refuses, a staging slot for the shared tier."""
        state = self.state
        parents = parents if parents is not None else [None] * len(keys)
        if len(parents) != len(keys):
            raise ValueError("parents: must have one entry per key")
        if direct and not owner.direct_io:
            raise ValueError("direct: this connection was not granted direct_io")
        with state.lock:
            mover = state.require()
            dram = mover.dram
            now = time.time()
            to_dram: list[bytes] = []
            to_staging: set[bytes] = set()
            to_nvme: dict[bytes, Entry] = {}
            state.claim(keys)
            for key, parent in zip(keys, parents, strict=True):
                mover.saw(key)
                if (held := dram.index.get(key) or mover.demoting.get(key)) is not None:
                    dram.index.touch(key, now)
                    dram.used(held)
                elif dram.capacity and key not in to_dram and dram.index.admits(key, parent):
                    to_dram.append(key)
                elif direct and state.nvme is not None and key not in state.nvme.index:
                    to_nvme.setdefault(key, Entry(parent, state.config.priority, False, now))
                elif self._lower_tier_takes(key):
                    to_staging.add(key)
            slots = mover.dram_slots(len(to_dram)) if to_dram else []
            taken = self.direct_io.take(owner, to_nvme)
            to_staging |= self.direct_io.refused_for_shared(owner, [k for k in to_nvme if k not in taken])
            self._await_staging(len(to_staging) + len(to_dram) - len(slots))
            state.poke_demoter()
            given: dict[bytes, int | None] = dict(zip(to_dram, slots, strict=False))
            given |= {key: None for key in [*to_dram[len(slots) :], *to_staging]}
            slots_given = [self._assign(owner, key, given) for key in keys]
            owner.nvme_refused -= {key for key, slot in zip(keys, slots_given, strict=True) if slot is None}
            return slots_given, [taken.pop(key, None) for key in keys]

    def _await_staging(self, needed: int) -> None:
        """While staging puts are being committed, wait (lock released, bounded) until
        ``needed`` staging slots are free: their slots come back within a batch's write, and a
        reserve answered without them would drop blocks the lower tiers should store."""
        dram = self.state.require().dram
        deadline = time.monotonic() + STAGING_WAIT_S
        while self.state.writing and dram.free_staging() < needed:
            left = deadline - time.monotonic()
            if left <= 0:
                log.warning("kvtier: no staging slots came back in %.0f s", STAGING_WAIT_S)
                return
            self.state.room.wait(left)

    def _assign(self, owner: Owner, key: bytes, given: dict[bytes, int | None]) -> int | None:
        if key not in given:
            return None
        slot = given.pop(key)
        if slot is None:
            slot = self.state.require().dram.take_slot(staging=True)
        if slot is not None:
            owner.reserved.add(slot)
        return slot

    def is_staging(self, slot: int) -> bool:
        """A staging slot: its block is written down (or dropped) at its put."""
        return self.state.require().dram.is_staging(slot)

    def _lower_tier_takes(self, key: bytes) -> bool:
        state = self.state
        if state.nvme is not None and key not in state.nvme.index:
            return True
        return state.shared is not None and key not in state.shared.index

    def put(self, owner: Owner, blocks: Sequence[PutBlock], written: Sequence[tuple[int, int]] = ()) -> int:
        """:meth:`put_async`, waiting until its blocks are committed."""
        return self.put_async(owner, blocks, written).result()

    def put_async(
        self, owner: Owner, blocks: Sequence[PutBlock], written: Sequence[tuple[int, int]] = ()
    ) -> Future[int]:
        """Commit blocks the engine copied into its reserved slots; the future resolves to how
        many were kept. Checksums are of the bytes in the slots: the client's (hashed right
        after its copy, while in cache) or, where it sent none, taken here. DRAM blocks are
        committed before this returns; staging blocks' NVMe writes, and with write-through the
        DRAM blocks' too, are queued here and committed (written, synced, logged: durable) by
        the committer thread, which then frees their staging slots and resolves the future. So
        the next batch's writes queue on the device while this one is synced, the connection
        reads its next request meanwhile, and the lock is not held while the disk writes.
        ``written``: (NVMe slot, checksum) of each block the engine wrote into a slot its
        reserve gave it (``reserve_direct``), committed by the committer likewise."""
        state = self.state
        started = time.perf_counter()
        with state.lock:
            mover = state.require()
            if state.closed:
                raise RuntimeError("sidecar stopping: put refused")
            by_engine = direct.written(owner.direct, written)
            try:
                stored, staged = self._enter(owner, blocks)
            except ValueError:  # the engine's slots are no use now: free again
                mover.writer.abandon(by_engine)
                raise
            refused = owner.nvme_refused & {key for key, _ in staged}
            owner.nvme_refused -= refused
            if state.sealer is not None:
                state.sealer.add([k for k, e in stored if e.checksum is None])
            state.metrics.written_bytes.labels("dram").inc(len(stored) * state.block_bytes)
            state.metrics.write_seconds.labels("dram").observe(time.perf_counter() - started)
            through = stored if state.config.write_mode == "write-through" else []
            count = len(stored) + len(staged) + len(by_engine)
            down = [(k, e) for k, e in staged if mover.dram.is_staging(e.slot)] + through
            plan = mover.writer.plan(down, False, refused)
            plan.engine = by_engine  # synced and logged with the sidecar's own writes
            mover.publish_usage()
            if not staged and not plan.nvme and not plan.shared and not plan.engine:
                return _done(count)
            # Written from their DRAM slots outside the lock: a slot evicted meanwhile is not
            # handed out again until the write is committed (the lease defers its return).
            leased = [e.slot for _, e in through]
            for slot in leased:
                mover.dram.lease(slot)
            mover.writer.start(plan)
            state.writing += 1
            staging = [e.slot for _, e in staged]
            return state.committer.submit(self._commit_put, mover, plan, staging, leased, count)

    def _enter(self, owner: Owner, blocks: Sequence[PutBlock]) -> tuple[list[Block], list[Block]]:
        """The blocks of a put as (key, entry): those entering DRAM (added to its index here)
        and those only passing through (staging slots, or DRAM already holding the key)."""
        dram = self.state.require().dram
        now = time.time()
        stored: list[Block] = []
        staged: list[Block] = []
        # A block's parent is mostly the block before it in the same put: its entries (in every
        # tier it reaches) keep that key object rather than an equal copy, 49 bytes a block.
        keys = {block.key: block.key for block in blocks}
        for block in blocks:
            if block.slot not in owner.reserved:
                raise ValueError(f"blocks: slot {block.slot} is not reserved by this connection")
            owner.reserved.discard(block.slot)
            parent = keys.get(block.parent, block.parent)
            entry = Entry(parent, self.state.config.priority, block.key in self.state.pinned, now, block.slot)
            entry.checksum = block.checksum
            if dram.is_staging(block.slot) or block.key in dram.index:
                staged.append((block.key, entry))
            else:
                dram.index.add(block.key, entry)
                dram.record(block.key, entry)  # with the client's checksum; else the sealer's
                stored.append((block.key, entry))
        return stored, staged

    def _commit_put(
        self, mover: Mover, plan: WritePlan, slots: list[int], leased: list[int], count: int
    ) -> int:
        """On the committer thread: wait for a put's queued writes, sync them and the blocks
        the engine wrote (one ``fdatasync``), then (under the lock) enter them into the lower
        tiers, free the put's staging slots and end the leases on the DRAM slots written
        through."""
        try:
            mover.writer.finish(plan)
        finally:
            with self.state.lock:
                mover.writer.commit(plan)
                for slot in slots:
                    mover.dram.give_back(slot)
                for slot in leased:
                    mover.dram.unlease(slot)
                self.state.writing -= 1
                mover.publish_usage()
                self.state.room.notify_all()
        return count


def _done(count: int) -> Future[int]:
    """A put with nothing left to write down: already committed."""
    future: Future[int] = Future()
    future.set_result(count)
    return future
