"""The pieces every supported decoder is built of: RMSNorm, rotary embedding, the gated MLP, and
the ``Attend`` callable through which a layer reaches the KV cache.

The model knows nothing of paging: every layer hands its queries, keys and values to an
``Attend``, which the engine implements over the paged KV cache (engine/attention.py) and tests
implement as plain causal attention over the whole sequence (``causal_attend``, the no-cache
reference).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# (layer index, q [T, heads, head_dim], k [T, kv_heads, head_dim], v) -> [T, heads, head_dim]
Attend = Callable[[int, Tensor, Tensor, Tensor], Tensor]


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * self.weight.float()).to(x.dtype)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate ``x`` [T, heads, head_dim] by position; the half-split layout HF checkpoints use."""
    half = x.shape[-1] // 2
    x32 = x.float()
    rotated = torch.cat([-x32[..., half:], x32[..., :half]], dim=-1)
    return (x32 * cos[:, None, :] + rotated * sin[:, None, :]).to(x.dtype)


class GatedMLP(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        result: Tensor = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return result


def causal_attend(layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Plain causal attention over one whole sequence: the no-cache reference."""
    del layer
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None],
        k.transpose(0, 1)[None],
        v.transpose(0, 1)[None],
        is_causal=True,
        enable_gqa=True,
    )
    result: Tensor = out[0].transpose(0, 1)
    return result
