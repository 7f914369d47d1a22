"""The only owner of device memory: the weights and the paged KV cache.

The cache is one tensor ``[num_blocks, num_layers, 2, block_size, num_kv_heads, head_dim]``, so a
block in the KV-tier contract's layout is ``kv_cache[block_id]``: a contiguous view that is saved
to and loaded from the tiers without any reshaping. On the CPU it starts on a huge page, and a
block of whole pages is then page-aligned too: the KV tiers' NVMe I/O reads and writes it
directly (``O_DIRECT``) with no staging copy.
"""

from __future__ import annotations

import contextlib
import math
import mmap

import torch
from torch import Tensor

from strata.worker.engine.attention import ChunkSpan, DecodeGroup, PagedAttention
from strata.worker.engine.sequence import Sequence
from strata.worker.models.decoder import DecoderForCausalLM

HUGE_PAGE = 2 << 20  # a transparent huge page (x86-64, and arm64 with 4 KiB base pages)


def block_shape(model: DecoderForCausalLM, block_size: int) -> tuple[int, int, int, int, int]:
    c = model.config
    return (c.num_hidden_layers, 2, block_size, c.num_key_value_heads, c.head_dim)


def block_bytes(model: DecoderForCausalLM, block_size: int, dtype: torch.dtype) -> int:
    n = 1
    for d in block_shape(model, block_size):
        n *= d
    return n * torch.empty((), dtype=dtype).element_size()


def allocate_cache(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
    """A zeroed KV cache. On the CPU: in transparent huge pages where the kernel gives them
    (``madvise``), starting on one, so that a block of 2 MiB is one physically contiguous page
    the disk moves in one piece (direct writes of the same blocks ran at 6.3-6.6 GB/s from huge
    pages, 2.9-5.9 from 4 KiB pages, by how scattered those happened to be); at least page-aligned
    (``torch.zeros`` gives 64 bytes), so that the tiers' direct I/O can reach every block."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    memory = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    with contextlib.suppress(AttributeError, OSError):  # no THP here: 4 KiB pages, still aligned
        memory.madvise(mmap.MADV_HUGEPAGE)
    raw = torch.frombuffer(memory, dtype=torch.uint8)  # holds the mapping while it lives
    start = -raw.data_ptr() % HUGE_PAGE
    cache = raw[start : start + nbytes].view(dtype).view(shape)
    cache.zero_()  # every page now, as torch.zeros did: the memory is the engine's from the start
    return cache


class ModelRunner:
    def __init__(self, model: DecoderForCausalLM, num_blocks: int, block_size: int) -> None:
        param = next(model.parameters())
        self.model = model
        self.device, self.dtype = param.device, param.dtype
        self.block_size = block_size
        self.block_shape = block_shape(model, block_size)
        self.kv_cache = allocate_cache((num_blocks, *self.block_shape), self.dtype, self.device)

    def block(self, block_id: int) -> Tensor:
        """Block ``block_id`` in the contract layout: a view, so writes land in the cache."""
        return self.kv_cache[block_id]

    @torch.inference_mode()
    def run(self, items: list[tuple[Sequence, int]]) -> Tensor:
        """Compute ``n`` new tokens of each sequence; logits [k, vocab] (float32) for the k items
        whose chunk reaches the end of their sequence, in item order."""
        tokens: list[int] = []
        positions: list[int] = []
        slot_blocks: list[int] = []
        chunks: list[ChunkSpan] = []
        decode: list[tuple[int, Sequence, int]] = []
        last_rows: list[int] = []
        for seq, n in items:
            start, begin = len(tokens), seq.num_computed_tokens
            tokens += seq.token_ids[begin : begin + n]
            positions += range(begin, begin + n)
            slot_blocks += [seq.block_table[p // self.block_size] for p in range(begin, begin + n)]
            if n == 1:
                decode.append((start, seq, begin + 1))
            else:
                chunks.append(ChunkSpan(start, n, begin + n, self._long(seq.block_table)))
            if begin + n == seq.num_tokens:
                last_rows.append(len(tokens) - 1)
        pos = self._long(positions)
        attend = PagedAttention(
            self.kv_cache, self._long(slot_blocks), pos % self.block_size, chunks, self._decode_group(decode)
        )
        hidden = self.model(self._long(tokens), pos, attend)
        return self.model.logits(hidden[self._long(last_rows)])

    def _decode_group(self, decode: list[tuple[int, Sequence, int]]) -> DecodeGroup | None:
        if not decode:
            return None
        width = max(len(seq.block_table) for _, seq, _ in decode)
        tables = [seq.block_table + [0] * (width - len(seq.block_table)) for _, seq, _ in decode]
        return DecodeGroup(
            rows=self._long([row for row, _, _ in decode]),
            tables=self._long(tables),
            context=self._long([ctx for _, _, ctx in decode]),
        )

    def _long(self, values: list[int] | list[list[int]]) -> Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.device)
