"""An engine's own NVMe block I/O (the protocol's ``direct_io``): the sidecar's side.

Where NVMe is below DRAM (with a shared tier below it only in write-back mode), a block DRAM
does not take would be copied by the engine into a staging slot and written by the sidecar
from there. That copy is a whole extra
pass over memory, competing with the disk's DMA: a full tier wrote at 0.71x of plain direct
writes with it (docs/kvtier-measurements.md). Instead the sidecar hands the engine its data
file (opened ``O_DIRECT``, passed over the socket with ``SCM_RIGHTS``: no volume to mount in
the engine's container), names NVMe slots in its answer to a reserve, and the engine hashes
each block and writes it from its KV cache into its slot. The put then carries the checksums;
the sidecar syncs the file, logs the records and indexes the blocks as for its own writes.

What stays with the sidecar: which blocks NVMe admits and which slots they take (under its
lock, evicting as it would for its own writes), durability (``fdatasync`` before the log
record), and the index. A slot given to an engine is in no index until its put commits; a
connection that ends first gives its slots back (``abandon``): whatever it wrote there is in
no record, and a later block written there replaces it. A block is read back only against
the checksum its put recorded, so bytes an engine wrote late or wrong are never served.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence

from strata.worker.kv_connector import PAGE
from strata.worker.kvtier.index import Entry
from strata.worker.kvtier.leases import Owner
from strata.worker.kvtier.loads import Loads
from strata.worker.kvtier.nvme import Record
from strata.worker.kvtier.state import ServiceState
from strata.worker.kvtier.tiers import NvmeTier, SharedTier

log = logging.getLogger(__name__)


def refusal(nvme: NvmeTier | None, shared: SharedTier | None, write_mode: str) -> str | None:
    """Why this sidecar does not offer direct I/O, or None when it does. (In write-back mode a
    block NVMe admits does not go to the shared tier when written: only the blocks NVMe
    refuses do, and those still pass through staging slots.)"""
    if nvme is None:
        return "the NVMe tier is off"
    if nvme.store.direct_fd is None:
        return "the NVMe tier's file system does not take O_DIRECT"
    if nvme.store.block_bytes % PAGE:
        return f"blocks of {nvme.store.block_bytes} bytes are not whole {PAGE}-byte pages"
    if shared is not None and write_mode == "write-through":
        return "a shared tier in write-through mode takes every block from shared memory"
    return None


def written(held: dict[int, Record], blocks: Sequence[tuple[int, int]]) -> list[Record]:
    """The records of the blocks an engine wrote into NVMe slots it held (``held``, by slot:
    taken from it), each ``(slot, checksum)`` of ``blocks`` with its checksum. Checked whole
    first: a bad put takes nothing."""
    slots = [slot for slot, _ in blocks]
    if len(set(slots)) != len(slots):
        raise ValueError("nvme_slots: a slot appears twice")
    for slot in slots:
        if slot not in held:
            raise ValueError(f"nvme_slots: slot {slot} is not reserved by this connection")
    return [dataclasses.replace(held.pop(slot), checksum=crc) for slot, crc in blocks]


class DirectIO:
    """The service's side of ``direct_io``: offering it, the NVMe slots an engine reads
    (``get_direct``) and writes (``take``) itself."""

    def __init__(self, state: ServiceState, loads: Loads) -> None:
        self.state, self.loads = state, loads

    def say(self) -> None:
        """Once, as the tiers are built: whether engines may read and write NVMe blocks
        themselves, and if not why (an admin wondering why ``direct_written_bytes`` stays at 0
        finds it here). Nothing where there is no NVMe tier: nothing to stage either."""
        state = self.state
        if state.nvme is None:
            return
        why = refusal(state.nvme, state.shared, state.config.write_mode)
        offer = "may read and write their NVMe blocks themselves" if why is None else "stage NVMe blocks"
        log.info(
            "kvtier: engines %s (direct_io)%s",
            offer,
            f": {why}" if why else "",
            extra={"event": "direct_io_offer", "offered": why is None, "reason": why},
        )

    def offered(self) -> bool:
        return refusal(self.state.nvme, self.state.shared, self.state.config.write_mode) is None

    def grant(self, owner: Owner) -> tuple[int, int]:
        """Let ``owner``'s engine write the blocks NVMe takes into their slots itself (see
        ``direct``): the NVMe data file's ``O_DIRECT`` descriptor (the caller passes it on, and
        keeps it open) and the slot size. Refused, naming why (``direct.refusal``): no NVMe
        tier, no ``O_DIRECT``, blocks not whole pages, a shared tier written through."""
        state = self.state
        with state.lock:
            state.require()
            why = refusal(state.nvme, state.shared, state.config.write_mode)
            if why is not None:
                raise ValueError(f"direct_io: not offered: {why}")
            assert state.nvme is not None and state.nvme.store.direct_fd is not None
            owner.direct_io = True
            log.info(
                "kvtier: a client reads and writes its NVMe blocks itself (direct_io)",
                extra={"event": "direct_io", "slot_bytes": state.nvme.store.slot_bytes},
            )
            return state.nvme.store.direct_fd, state.nvme.store.slot_bytes

    def get_direct(self, owner: Owner, keys: Sequence[bytes]) -> list[tuple[int, int | None]] | None:
        """``get`` for an engine granted ``direct_io`` by a sidecar without a DRAM tier (where
        every block read would only pass through a staging slot): the NVMe slots and checksums
        of the leading blocks NVMe holds, leased to ``owner`` until ``release`` names them, for
        the engine to read into its KV cache itself. None where that does not apply (a DRAM
        tier would keep what is read; the first block is not on NVMe, so perhaps on the shared
        tier): ``get`` then."""
        state = self.state
        with state.lock:
            mover = state.require()
            nvme = mover.nvme
            if not owner.direct_io or mover.dram.capacity or nvme is None or not keys:
                return None
            if keys[0] not in nvme.index:
                return None
            self.loads.drop_ahead(owner)
            state.claim(keys)
            now, found = time.time(), list[tuple[int, int | None]]()
            for key in keys:
                mover.saw(key)
            for key in keys:
                entry = nvme.index.get(key)
                if entry is None or entry.checksum is None:
                    break
                nvme.index.record_hit(key, entry.parent)
                nvme.index.touch(key, now)
                nvme.lease(entry.slot)  # not rewritten while the engine reads it, even if evicted
                owner.nvme_leases.append(entry.slot)
                found.append((entry.slot, entry.checksum))
            state.metrics.read_bytes.labels("nvme").inc(len(found) * state.block_bytes)
            state.metrics.direct_read_bytes.labels("nvme").inc(len(found) * state.block_bytes)
            return found

    def take(self, owner: Owner, blocks: dict[bytes, Entry]) -> dict[bytes, int]:
        """NVMe slots for the engine to write ``blocks`` into, by key: those the tier admits
        and has room for."""
        if not blocks:
            return {}
        records = [r for r in self.state.require().writer.take_direct(list(blocks.items())) if r is not None]
        owner.direct |= {record.slot: record for record in records}
        return {record.key: record.slot for record in records}

    def refused_for_shared(self, owner: Owner, keys: list[bytes]) -> set[bytes]:
        """Of the blocks NVMe did not take at a direct reserve, those the shared tier may store:
        staged for it, and not offered to NVMe again at their put (``Writer.plan``)."""
        shared = self.state.shared
        staged = {key for key in keys if shared is not None and key not in shared.index}
        owner.nvme_refused |= staged
        return staged
