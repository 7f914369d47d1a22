"""Block bytes between the engine's KV cache and the sidecar's slots, each block hashed along
its copy: into the slots for a save, out of them for a load (checked against the sidecar's
checksums), and, for an engine granted direct I/O, straight to and from the NVMe data file.
Host blocks are copied by address with the compiled copy-and-checksum; a GPU's by DMA into the
page-locked slots, hashed by the GPU where it can (``devicehash``).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from strata.worker.kvtier import protocol
from strata.worker.kvtier.blockcopy import (
    copy_blocks,
    copy_hashing_addresses,
    flat_bytes,
    host_sources,
    save_blocks,
)
from strata.worker.kvtier.blockio import HASH_THREADS, direct_ready, read_blocks, write_blocks
from strata.worker.kvtier.link import SidecarLink

Pair = tuple[torch.Tensor, torch.Tensor]  # (destination, source) of one block copy


class BlockCopies:
    def __init__(self, link: SidecarLink, block_bytes: int, threads: int, gpu_hash: bool) -> None:
        self.link, self.block_bytes = link, block_bytes
        # Copies and checksums of a batch in parallel: memmove, the compiled hash and torch's
        # copies release the GIL. (From a GPU the copy engine copies and these threads hash.)
        self.threads = threads
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="kvtier-client")
        # Blocks on a GPU hashed by the GPU (where Triton can): no host thread reads them.
        self.gpu_hash = gpu_hash
        self.hasher = ThreadPoolExecutor(HASH_THREADS, thread_name_prefix="kvtier-hash")  # direct I/O's
        self.direct_saved = self.direct_loaded = 0  # blocks that went that way
        # Loaded without a checksum to compare: verified by the sidecar as it read them from a
        # lower tier, or saved into DRAM moments before (the sidecar had not sealed them yet).
        self.unverified_blocks = 0

    def direct_ok(self, data: Sequence[torch.Tensor]) -> bool:
        """Whether this save's blocks may be written to NVMe by this process: direct I/O
        granted, and every block in host memory on whole pages."""
        if self.link.direct_fd is None:
            return False
        addresses = host_sources(data, self.block_bytes)
        return addresses is not None and direct_ready(addresses, self.block_bytes)

    def read_direct(self, out: Sequence[torch.Tensor], reply: dict[str, Any]) -> int:
        """Read an answer's NVMe slots into the blocks, each checked as it is read (by the
        descriptor ``direct_io`` passed); how many leading ones are intact."""
        assert self.link.direct_fd is not None, "the sidecar names NVMe slots only to a direct_io client"
        slots: list[int] = reply["slots"]
        expected: list[int | None] = reply["checksums"]
        stride = self.link.nvme_slot_bytes
        reads = [(out[i].data_ptr(), slot * stride) for i, slot in enumerate(slots)]
        assert self.link.io is not None
        sums = read_blocks(self.link.io, self.hasher, self.link.direct_fd, reads, self.block_bytes)
        intact = [got is not None and got == want for got, want in zip(sums, expected, strict=True)]
        count = intact.index(False) if False in intact else len(intact)
        self.direct_loaded += count
        return count

    def copy_out(self, out: Sequence[torch.Tensor], reply: dict[str, Any]) -> int:
        """Copy an answer's blocks out, checking them as they go; how many leading ones are intact."""
        slots: list[int] = reply["slots"]
        expected: list[int | None] = reply["checksums"]
        checked = any(want is not None for want in expected)  # nothing to check: a plain copy
        targets = host_sources(out[: len(slots)], self.block_bytes) if checked else None
        if targets is not None:  # every block in host memory: copied by address
            sums: list[int | None] = list(self.copy_by_address(slots, targets, into_slots=False))
        else:
            pairs = [(flat_bytes(out[i]), self.raw(slot)) for i, slot in enumerate(slots)]
            sums = list(self.copy(pairs, hashed=checked)) or list(expected)
        intact = [want is None or got == want for got, want in zip(sums, expected, strict=True)]
        self.unverified_blocks += expected.count(None)
        return intact.index(False) if False in intact else len(intact)

    def copy_in(
        self, slots: Sequence[int], tensors: Sequence[torch.Tensor], wanted: Sequence[bool]
    ) -> list[int | None]:
        """Copy a save's blocks into their ``slots``; the checksums of every block copied by
        address, else of those the sidecar asked for (``save_from_device``)."""
        sources = host_sources(tensors, self.block_bytes)
        if sources is not None:  # every block in host memory: copied by address
            return list(self.copy_by_address(slots, sources, into_slots=True))
        return self.save_from_device(tensors, slots, wanted)

    def write_direct(self, data: Sequence[torch.Tensor], nvme: list[int | None] | None) -> protocol.Message:
        """Write the blocks the reserve gave NVMe slots (``direct_ok`` blocks) into them,
        each hashed beside its write: the put's fields that commit them."""
        chosen = [(i, slot) for i, slot in enumerate(nvme or []) if slot is not None]
        if not chosen or self.link.direct_fd is None:
            return {}
        stride = self.link.nvme_slot_bytes
        writes = [(data[i].data_ptr(), slot * stride) for i, slot in chosen]
        assert self.link.io is not None
        sums = write_blocks(self.link.io, self.hasher, self.link.direct_fd, writes, self.block_bytes)
        self.direct_saved += len(chosen)
        return {"nvme_slots": [slot for _, slot in chosen], "nvme_checksums": sums}

    def copy(self, pairs: Sequence[Pair], hashed: bool) -> list[int]:
        """Copy a load's pairs out of the slots (device blocks, or host blocks unchecked); with
        ``hashed``, the checksums of the slots (read from) taken along."""
        return copy_blocks(self.pool, pairs, hashed, self.link.page_locked, self.gpu_hash, stream=True)

    def copy_by_address(self, slots: Sequence[int], blocks: Sequence[int], into_slots: bool) -> list[int]:
        """Copy host blocks at the addresses ``blocks`` into ``slots`` (a save) or out of them
        (a load), each hashed along its copy (the checksums of the bytes copied), by address:
        flat views of each block and its slot would cost 7-9 us a block. With streaming stores
        both ways: the engine does not read its saved blocks back from the slots, and the
        sidecar writes them to NVMe by DMA; a load is mostly far more than a cache holds. So a
        cached store would only read every destination line from memory first (a load ran at
        1.04-1.38x the rate of cached stores, docs/kvtier-measurements.md)."""
        assert self.link.slots is not None and self.link.arena is not None
        base, stride = self.link.slots.data_ptr(), self.link.arena.slot_bytes
        size = self.block_bytes
        pairs = [(base + slot * stride, block) for slot, block in zip(slots, blocks, strict=True)]
        copies = [(slot, block, size) if into_slots else (block, slot, size) for slot, block in pairs]
        return copy_hashing_addresses(self.pool, copies, stream=True)

    def save_from_device(
        self, tensors: Sequence[torch.Tensor], slots: Sequence[int], wanted: Sequence[bool]
    ) -> list[int | None]:
        """Copy device blocks into ``slots`` (DMA into the page-locked mapping); the checksums
        of every block, by the GPU, where it hashes them (``gpu_hash``); else of the slots the
        sidecar asked for (its staging ones), None for the others (the sidecar seals them)."""
        pairs = [(self.raw(s), flat_bytes(t)) for s, t in zip(slots, tensors, strict=True)]
        return save_blocks(self.pool, pairs, wanted, self.link.page_locked, self.gpu_hash)

    def raw(self, slot: int) -> torch.Tensor:
        assert self.link.slots is not None and self.link.arena is not None
        start = slot * self.link.arena.slot_bytes
        return self.link.slots[start : start + self.block_bytes]

    def close(self) -> None:
        self.pool.shutdown(wait=False)
        self.hasher.shutdown(wait=False)
