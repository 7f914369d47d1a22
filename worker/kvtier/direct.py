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
from collections.abc import Sequence

from strata.worker.kv_connector import PAGE
from strata.worker.kvtier.nvme import Record
from strata.worker.kvtier.tiers import NvmeTier, SharedTier


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
