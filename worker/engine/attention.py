"""Attention over the paged KV cache, for one step's flat batch of tokens.

Each layer first writes the step's new keys and values into their cache slots, then reads each
sequence's context back through its block table. Prefill chunks attend one sequence at a time
(their query lengths differ); single-token steps are gathered into one padded, masked call.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor


@dataclass(frozen=True)
class ChunkSpan:
    start: int  # first row in the step's flat token batch
    length: int  # new tokens
    context: int  # tokens attended to, new ones included
    table: Tensor  # the sequence's block ids, long


@dataclass(frozen=True)
class DecodeGroup:
    rows: Tensor  # rows of the flat batch, one per sequence
    tables: Tensor  # [B, max_blocks] block ids, padded with 0
    context: Tensor  # [B] tokens attended to


class PagedAttention:
    """Implements the model's ``Attend`` over ``kv_cache`` [blocks, layers, 2, block, kv_heads, dim]."""

    def __init__(
        self,
        kv_cache: Tensor,
        slot_blocks: Tensor,
        slot_offsets: Tensor,
        chunks: list[ChunkSpan],
        decode: DecodeGroup | None,
    ) -> None:
        self.kv_cache = kv_cache
        self.slot_blocks = slot_blocks
        self.slot_offsets = slot_offsets
        self.chunks = chunks
        self.decode = decode

    def __call__(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        k_cache, v_cache = self.kv_cache[:, layer, 0], self.kv_cache[:, layer, 1]
        k_cache[self.slot_blocks, self.slot_offsets] = k
        v_cache[self.slot_blocks, self.slot_offsets] = v
        out = torch.empty_like(q)
        for span in self.chunks:
            rows = slice(span.start, span.start + span.length)
            keys = k_cache[span.table].flatten(0, 1)[: span.context]
            values = v_cache[span.table].flatten(0, 1)[: span.context]
            out[rows] = _chunk_attention(q[rows], keys, values)
        if self.decode is not None:
            out[self.decode.rows] = _decode_attention(q[self.decode.rows], k_cache, v_cache, self.decode)
        return out


def _chunk_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """q [n, H, D] are the last n positions of a context whose keys are k, v [ctx, KVH, D]."""
    n, ctx = q.shape[0], k.shape[0]
    mask = None
    if n != ctx:  # SDPA's is_causal aligns top-left; a later chunk needs bottom-right alignment
        mask = torch.arange(ctx, device=q.device)[None, :] <= torch.arange(n, device=q.device)[:, None] + (
            ctx - n
        )
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None],
        k.transpose(0, 1)[None],
        v.transpose(0, 1)[None],
        attn_mask=mask,
        is_causal=mask is None,
        enable_gqa=True,
    )
    return out[0].transpose(0, 1)


def _decode_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, group: DecodeGroup) -> Tensor:
    """q [B, H, D], one new token per sequence, each attending to its own context."""
    keys = k_cache[group.tables].flatten(1, 2).transpose(1, 2)  # [B, KVH, S, D]
    values = v_cache[group.tables].flatten(1, 2).transpose(1, 2)
    span = torch.arange(keys.shape[2], device=q.device)
    mask = (span[None, :] < group.context[:, None])[:, None, None, :]  # [B, 1, 1, S]
    out = F.scaled_dot_product_attention(q[:, :, None, :], keys, values, attn_mask=mask, enable_gqa=True)
    return out[:, :, 0, :]
