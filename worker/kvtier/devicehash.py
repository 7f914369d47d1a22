"""The checksums of blocks in GPU memory, computed by the GPU: XXH3-64, the value the host's
:func:`~strata.worker.kvtier.arena.checksum` gives (:mod:`~strata.worker.kvtier.xxh3parts`).

Why: from a GPU the tier's copies are DMA at the copy engine's rate (about 50 GB/s on an H200),
and hashing the slots on the host (about 10 GB/s a thread) was what bounded a GPU engine's loads
and sealing. The GPU reads its own memory at terabytes a second: a save hashes its blocks where
they are, so even its DRAM slots arrive sealed; a load hashes the blocks once their DMA has
landed, which checks the copy too. No host thread reads a block.

Two Triton kernels: the first reads the blocks, each program summing what 32 of a block's 1 KiB
pieces add to XXH3's eight accumulators (no order needed: additions); the second runs each
block's chain, adding the pieces' sums in order with XXH3's scramble after each (a chain no two
programs can share, but it reads 64 bytes a piece, not 1 KiB) and merges its eight
accumulators into the checksum: the host reads one word a block. With ``TRITON_INTERPRET=1``
the same kernels run on host tensors (how the tests check them without a GPU).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence

import torch

from strata.worker.kvtier import xxh3parts

# 1 KiB pieces summed by a program (an H200, 96 blocks of 2 MiB: 8, 16, 32 pieces 179, 174, 196 GB/s)
PIECES = 32
UNROLL = 8  # pieces' sums loaded at once by a block's chain
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"

try:  # the CUDA builds of torch bring Triton; a host-only worker hashes on the host
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - the project's torch brings it
    triton = None


if triton is not None:

    @triton.jit  # type: ignore[untyped-decorator]
    def _piece_sums_kernel(  # type: ignore[no-untyped-def]
        addresses, tables, sums, whole_blocks, tail_stripes, PIECES: tl.constexpr
    ):
        """Each 1 KiB piece's addition to the accumulators, ``PIECES`` pieces of one block a
        program, into ``sums[block, piece, lane]``: the part of XXH3 that reads the bytes, and
        needs no order. The partial piece after the whole ones counts its ``tail_stripes``."""
        block = tl.load(addresses + tl.program_id(0)).to(tl.pointer_type(tl.uint64))
        pieces = tl.program_id(1) * PIECES + tl.arange(0, PIECES)[:, None, None]
        rows = tl.arange(0, 16)[None, :, None]
        lanes = tl.arange(0, 8)[None, None, :]
        wanted = (pieces < whole_blocks) | ((pieces == whole_blocks) & (rows < tail_stripes))
        # the tables: 16 rows of the stripes' keys, then rows of the initial accumulators, the
        # scramble's keys and the last stripe's keys
        keys = tl.load(tables + rows * 8 + lanes).to(tl.uint64, bitcast=True)
        words = tl.load(block + pieces * 128 + rows * 8 + lanes, mask=wanted, other=0)
        neighbours = tl.load(block + pieces * 128 + rows * 8 + (lanes ^ 1), mask=wanted, other=0)
        keyed = words ^ keys
        added = tl.where(wanted, (keyed & 0xFFFFFFFF) * (keyed >> 32) + neighbours, 0)
        out = sums + (tl.program_id(0) * (whole_blocks + 1) + pieces) * 8 + lanes
        tl.store(
            out, tl.sum(added, axis=1, keep_dims=True).to(tl.int64, bitcast=True), mask=pieces <= whole_blocks
        )

    @triton.jit  # type: ignore[untyped-decorator]
    def _chain_kernel(  # type: ignore[no-untyped-def]
        addresses, tables, sums, out, whole_blocks, last_word, start, UNROLL: tl.constexpr
    ):
        """A block's checksum: its pieces' sums added in order, each whole piece followed by
        the scramble (the chain no two programs can share), then the last stripe's; the eight
        accumulators merged from ``start`` (the length times a prime) and avalanched."""
        block = tl.load(addresses + tl.program_id(0)).to(tl.pointer_type(tl.uint64))
        lanes = tl.arange(0, 8)
        accs = tl.load(tables + 128 + lanes).to(tl.uint64, bitcast=True)
        scramble = tl.load(tables + 136 + lanes).to(tl.uint64, bitcast=True)
        last_keys = tl.load(tables + 144 + lanes).to(tl.uint64, bitcast=True)
        row = sums + tl.program_id(0) * (whole_blocks + 1) * 8 + lanes
        for group in range(whole_blocks // UNROLL):
            for k in tl.static_range(UNROLL):  # the loads do not wait on the chain: in flight together
                accs += tl.load(row + (group * UNROLL + k) * 8).to(tl.uint64, bitcast=True)
                accs = ((accs ^ (accs >> 47)) ^ scramble) * 0x9E3779B1
        for piece in range(whole_blocks // UNROLL * UNROLL, whole_blocks):
            accs += tl.load(row + piece * 8).to(tl.uint64, bitcast=True)
            accs = ((accs ^ (accs >> 47)) ^ scramble) * 0x9E3779B1
        accs += tl.load(row + whole_blocks * 8).to(tl.uint64, bitcast=True)
        keyed = tl.load(block + last_word + lanes) ^ last_keys
        accs += (keyed & 0xFFFFFFFF) * (keyed >> 32) + tl.load(block + last_word + (lanes ^ 1))
        keyed = accs ^ tl.load(tables + 152 + lanes).to(tl.uint64, bitcast=True)
        even, odd = tl.split(tl.reshape(keyed, (4, 2)))
        value = start.to(tl.uint64, bitcast=True) + tl.sum(_fold64(even, odd), axis=0)
        value ^= value >> 37
        value *= 0x165667919E3779F9
        value ^= value >> 32
        tl.store(out + tl.program_id(0), value.to(tl.int64, bitcast=True))

    @triton.jit
    def _fold64(a, b):  # type: ignore[no-untyped-def]
        """XXH3's mul128_fold64: the 128-bit product's halves xor-ed, by 32-bit halves."""
        low_low = (a & 0xFFFFFFFF) * (b & 0xFFFFFFFF)
        high_low = (a >> 32) * (b & 0xFFFFFFFF)
        cross = (low_low >> 32) + (high_low & 0xFFFFFFFF) + (a & 0xFFFFFFFF) * (b >> 32)
        upper = (high_low >> 32) + (cross >> 32) + (a >> 32) * (b >> 32)
        return ((cross << 32) | (low_low & 0xFFFFFFFF)) ^ upper


@functools.cache
def _tables(device: torch.device) -> torch.Tensor:
    """The kernels' constants: stripe keys (128 words), initial accumulators, scramble keys,
    the last stripe's keys and the merge's keys (8 each), as uint64 bits in an int64 tensor on
    ``device``."""
    words = (
        xxh3parts.stripe_keys()
        + list(xxh3parts.INITIAL_ACCS)
        + xxh3parts.scramble_keys()
        + xxh3parts.last_stripe_keys()
        + list(xxh3parts.merge_keys())
    )
    return _as_int64(words).to(device)


def _as_int64(words: Sequence[int]) -> torch.Tensor:
    return torch.tensor([_signed(w) for w in words], dtype=torch.int64)


def _signed(word: int) -> int:
    """A 64-bit word's bits as a signed int64 (how the kernels take it, and bitcast back)."""
    return word - (1 << 64) if word >= 1 << 63 else word


def usable(blocks: Sequence[torch.Tensor]) -> bool:
    """Whether :func:`checksums` can hash these blocks: Triton there, each block on a CUDA
    device (or any, interpreted), contiguous, 8-byte aligned, of one length over 240 bytes in
    whole words; and XXH3's secret to key them with (``xxh3parts.available``)."""
    if triton is None or not blocks:
        return False
    size = blocks[0].numel() * blocks[0].element_size()
    return (
        all(
            (t.is_cuda or INTERPRETED)
            and t.device == blocks[0].device
            and t.is_contiguous()
            and t.data_ptr() % 8 == 0
            and t.numel() * t.element_size() == size
            for t in blocks
        )
        and (size >= xxh3parts.SMALLEST and size % 8 == 0)
        and xxh3parts.available()  # last: the first call may build the native library
    )


def checksums(blocks: Sequence[torch.Tensor], checked: bool = False) -> list[int]:
    """The XXH3-64 of each block's bytes, computed on its device after the work queued on the
    current stream (a DMA into the blocks, say), in order. :func:`usable` must hold (the
    caller says it ``checked``)."""
    if not checked and not usable(blocks):
        raise ValueError("blocks: the GPU hash takes contiguous, aligned blocks of one length on one device")
    return words([queue(blocks)])


def queue(blocks: Sequence[torch.Tensor]) -> torch.Tensor:
    """Queue the hashing of :func:`usable` blocks on the current stream; their checksums'
    bits, on the device, once it has run (:func:`words`)."""
    device = blocks[0].device
    shape = xxh3parts.layout(blocks[0].numel() * blocks[0].element_size())
    addresses = torch.tensor([t.data_ptr() for t in blocks], dtype=torch.int64).to(device, non_blocking=True)
    out = torch.empty(len(blocks), dtype=torch.int64, device=device)
    sums = torch.empty(len(blocks) * (shape.whole_blocks + 1) * 8, dtype=torch.int64, device=device)
    tables = _tables(device)
    sum_pieces(addresses, tables, sums, shape)
    run_chains(addresses, tables, sums, out, shape)
    return out


def words(queued: Sequence[torch.Tensor]) -> list[int]:
    """The checksums :func:`queue` left, in order, once the current stream has run them."""
    return [w & xxh3parts.MASK64 for w in torch.cat(list(queued)).cpu().tolist()]


def sum_pieces(
    addresses: torch.Tensor, tables: torch.Tensor, sums: torch.Tensor, shape: xxh3parts.Layout
) -> None:
    """Queue the first kernel: every block's pieces' sums into ``sums``."""
    spread = (addresses.numel(), triton.cdiv(shape.whole_blocks + 1, PIECES))
    _piece_sums_kernel[spread](addresses, tables, sums, shape.whole_blocks, shape.tail_stripes, PIECES)


def run_chains(
    addresses: torch.Tensor,
    tables: torch.Tensor,
    sums: torch.Tensor,
    out: torch.Tensor,
    shape: xxh3parts.Layout,
) -> None:
    """Queue the second kernel: every block's checksum into ``out``."""
    start = _signed(xxh3parts.start(shape.length))
    _chain_kernel[(addresses.numel(),)](
        addresses, tables, sums, out, shape.whole_blocks, shape.last_word, start, UNROLL
    )
