"""Warm restart of the DRAM tier: the blocks the slot table lists (``slottable``) go back into
the DRAM index, each only once its bytes match its recorded checksum.

When to verify: not all at start, and not left to the first read. Hashing runs at about
7.5 GB/s on one core, so 256 GiB of DRAM would keep the sidecar from serving for ~35 s if
checked before it answers; and a block entered unchecked would be served unchecked where
``dram.verify_reads`` is off, or written down to NVMe and the shared tier under a checksum its
bytes may not match. So a background pass hashes the recorded blocks, least recently saved or
used first, a batch at a time outside the lock, and admits each batch as it is verified
(re-entering them in that order keeps their eviction order). The sidecar serves meanwhile: a
block a request asks for before the pass reached it is verified then, under the lock (about
0.3 ms for 2 MiB), and admitted at once (``claim``), so no request misses a block that is in
memory. Until then its slot is neither free nor indexed. (Measured here: 4 GiB in about a
second, 3.4-4.3 GB/s, as the fresh mapping's page faults cost about as much as the hash.)

A block whose bytes fail its checksum (torn or overwritten while the sidecar was down) is
never served: its record is cleared, its slot freed, and it is counted in
``strata_kvtier_corrupt_blocks_total{tier="dram"}`` and in ``stats``.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections import OrderedDict
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

from strata.worker.config import KVTierConfig
from strata.worker.kvtier import slottable
from strata.worker.kvtier.arena import SlotArena, checksum
from strata.worker.kvtier.background import Loop
from strata.worker.kvtier.index import Entry
from strata.worker.kvtier.movement import Mover
from strata.worker.kvtier.slottable import Layout, SlotRecord, SlotTable

log = logging.getLogger(__name__)

BATCH = 32  # blocks hashed per turn of the pass (64 MiB of 2 MiB blocks)


@dataclass
class Found:
    """What a start found in the slot table, for ``stats``: ``state`` is ``off``
    (``dram.persistent: false`` or no DRAM tier), ``empty`` (nothing to trust: ``reason``),
    ``running`` (the pass is verifying) or ``done``."""

    state: str = "off"
    reason: str | None = None
    found: int = 0
    recovered: int = 0
    corrupt: int = 0
    dropped: int = 0  # a second record of a key, or a key saved again before the pass got to it
    records: list[SlotRecord] = field(default_factory=list)  # to recover, least recently used first

    def stats(self, pending: int) -> dict[str, object]:
        return {
            "state": self.state,
            "reason": self.reason,
            "found": self.found,
            "recovered": self.recovered,
            "corrupt": self.corrupt,
            "dropped": self.dropped,
            "pending": pending,
        }


def open_table(
    config: KVTierConfig, arena: SlotArena, dram_slots: int, block_bytes: int
) -> tuple[SlotTable | None, Found]:
    """The DRAM tier's slot table beside ``arena`` (None when off) and what it lists."""
    if not config.dram.persistent or not dram_slots:
        slottable.remove(arena.path)
        return None, Found()
    layout = Layout(block_bytes, arena.slot_bytes, dram_slots, os.stat(arena.path).st_ino)
    try:
        table = SlotTable(slottable.table_path(arena.path), layout)
    except OSError as err:  # no room for it beside the slots: serve, without restarts' memory
        reason = f"no room for the slot table: {err}"
        log.warning(
            "dram: %s; DRAM blocks will not survive a restart",
            reason,
            extra={"event": "dram_recovery", "state": "off", "reason": reason},
        )
        slottable.remove(arena.path)
        return None, Found("off", reason)
    if table.mismatch is not None:
        _log_empty(table.mismatch, table.path)
        return table, Found("empty", table.mismatch)
    records, dropped = slottable.recovery_order(table.records())
    for record in dropped:
        table.clear(record.slot)
    found = Found("running" if records else "done", None, len(records) + len(dropped), dropped=len(dropped))
    found.records = records
    log.info(
        "dram: slot table lists %d blocks; verifying them in the background",
        len(records),
        extra={"event": "dram_recovery", "state": found.state, "found": found.found},
    )
    return table, found


def _log_empty(reason: str, path: object) -> None:
    first = reason.startswith("no slot table")
    (log.info if first else log.warning)(
        "dram: starting empty (%s): %s",
        path,
        reason,
        extra={"event": "dram_recovery", "state": "empty", "reason": reason},
    )


class Recovery:
    """The background pass and the claims of requests, over ``found.records``; their slots
    were kept out of the free pool (``DramTier(held=...)``)."""

    def __init__(self, lock: AbstractContextManager[object], mover: Mover, found: Found) -> None:
        self.lock = lock
        self.mover = mover
        self.found = found
        self._pending: OrderedDict[bytes, SlotRecord] = OrderedDict((r.key, r) for r in found.records)
        found.records = []
        self._done = threading.Event()
        self._loop = Loop("recovery", self._step) if self._pending else None
        if self._loop is not None:
            self._loop.wake()

    @property
    def pending(self) -> int:
        return len(self._pending)

    def claim(self, keys: list[bytes] | tuple[bytes, ...]) -> None:
        """Under the lock: verify and admit now any of ``keys`` the pass has not reached."""
        if not self._pending:
            return
        dram = self.mover.dram
        for key in keys:
            record = self._pending.pop(key, None)
            if record is not None:
                self._settle(record, checksum(dram.block(record.slot)) == record.checksum)
        self._finish_if_done()

    def wait_done(self, timeout: float) -> bool:
        """Until every recorded block is verified (admitted or dropped)."""
        return self._done.wait(timeout)

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.stop()

    def _step(self) -> bool:
        """One batch of the pass: hashed without the lock (the slots are held: nothing writes
        them), admitted under it unless a request claimed them meanwhile."""
        with self.lock:
            batch = list(itertools.islice(self._pending.values(), BATCH))
        if not batch:
            return False
        dram = self.mover.dram
        sums = [checksum(dram.block(record.slot)) for record in batch]
        with self.lock:
            for record, crc in zip(batch, sums, strict=True):
                if self._pending.get(record.key) is record:
                    del self._pending[record.key]
                    self._settle(record, crc == record.checksum)
            self._finish_if_done()
            self.mover.publish_usage()
        return True

    def _settle(self, record: SlotRecord, intact: bool) -> None:
        mover = self.mover
        dram = mover.dram
        held = record.key in dram.index or record.key in mover.demoting
        if intact and not held and dram.index.has_room():
            now = time.time()
            pinned = record.key in mover.pinned
            dram.index.add(
                record.key,
                Entry(record.parent, mover.config.priority, pinned, now, record.slot, record.checksum),
            )
            mover.metrics.recovered_blocks.labels("dram").inc()
            self.found.recovered += 1
            return
        if intact:
            self.found.dropped += 1
        else:
            log.warning("dram: recovered block %s failed its checksum; dropped", record.key.hex())
            mover.metrics.corrupt_blocks.labels("dram").inc()
            self.found.corrupt += 1
        dram.give_back(record.slot)  # clears its record first

    def _finish_if_done(self) -> None:
        if self._pending or self.found.state != "running":
            return
        found = self.found
        found.state = "done"
        self._done.set()
        log.info(
            "dram: recovered %d blocks (%d failed their checksum, %d dropped)",
            found.recovered,
            found.corrupt,
            found.dropped,
            extra={"event": "dram_recovery", **found.stats(0)},
        )
