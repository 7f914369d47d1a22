"""A Llama-architecture decoder (RMSNorm, rotary embeddings, grouped-query attention, SwiGLU).

Parameter names follow Hugging Face's ``LlamaForCausalLM`` so that a real Llama checkpoint loads
unchanged. The model knows nothing of paging: every layer hands its queries, keys and values to
an ``Attend`` callable, which the engine implements over the paged KV cache and tests implement as
plain causal attention over the whole sequence (the no-cache reference).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# (layer index, q [T, heads, head_dim], k [T, kv_heads, head_dim], v) -> [T, heads, head_dim]
Attend = Callable[[int, Tensor, Tensor, Tensor], Tensor]


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    rope_scaling: dict[str, Any] | None = None  # Llama 3.1+ ("rope_type": "llama3")
    head_dim: int = 0  # 0: hidden_size // num_attention_heads

    def __post_init__(self) -> None:
        if not self.head_dim:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> LlamaConfig:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in raw.items() if k in known}
        values.setdefault("num_key_value_heads", raw["num_attention_heads"])
        if values.get("head_dim") is None:
            values.pop("head_dim", None)
        eos = values.get("eos_token_id")
        if isinstance(eos, list):  # Llama 3 lists several; the first is the end of a turn
            values["eos_token_id"] = eos[0] if eos else None
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **asdict(self)}


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * self.weight.float()).to(x.dtype)


def rope_tables(config: LlamaConfig, device: torch.device) -> tuple[Tensor, Tensor]:
    """cos and sin for every position, [max_positions, head_dim], in float32."""
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, device=device).float() / dim))
    scaling = config.rope_scaling or {}
    if scaling.get("rope_type", scaling.get("type")) == "llama3":
        inv_freq = llama3_inv_freq(inv_freq, scaling)
    t = torch.arange(config.max_position_embeddings, device=device).float()
    angles = torch.outer(t, inv_freq)
    emb = torch.cat([angles, angles], dim=-1)
    return emb.cos(), emb.sin()


def llama3_inv_freq(inv_freq: Tensor, scaling: dict[str, Any]) -> Tensor:
    """Llama 3.1's long-context frequencies: low frequencies slowed by ``factor``, high ones
    kept, a smooth blend between (as in Hugging Face's ``_compute_llama3_parameters``)."""
    factor = float(scaling["factor"])
    low, high = float(scaling.get("low_freq_factor", 1.0)), float(scaling.get("high_freq_factor", 4.0))
    original = float(scaling["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > original / low, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= original / high) & (wavelen <= original / low)
    return torch.where(medium, blended, scaled)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate ``x`` [T, heads, head_dim] by position; the half-split layout HF checkpoints use."""
    half = x.shape[-1] // 2
    x32 = x.float()
    rotated = torch.cat([-x32[..., half:], x32[..., :half]], dim=-1)
    return (x32 * cos[:, None, :] + rotated * sin[:, None, :]).to(x.dtype)


class LlamaAttention(nn.Module):
    def __init__(self, config: LlamaConfig, layer: int) -> None:
        super().__init__()
        hd, h, kvh = config.head_dim, config.num_attention_heads, config.num_key_value_heads
        self.layer, self.heads, self.kv_heads, self.head_dim = layer, h, kvh, hd
        self.q_proj = nn.Linear(config.hidden_size, h * hd, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, kvh * hd, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, kvh * hd, bias=False)
        self.o_proj = nn.Linear(h * hd, config.hidden_size, bias=False)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, attend: Attend) -> Tensor:
        t = x.shape[0]
        q = apply_rope(self.q_proj(x).view(t, self.heads, self.head_dim), cos, sin)
        k = apply_rope(self.k_proj(x).view(t, self.kv_heads, self.head_dim), cos, sin)
        v = self.v_proj(x).view(t, self.kv_heads, self.head_dim)
        out = attend(self.layer, q, k, v)
        result: Tensor = self.o_proj(out.reshape(t, self.heads * self.head_dim))
        return result


class LlamaMLP(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        result: Tensor = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return result


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: LlamaConfig, layer: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LlamaAttention(config, layer)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = LlamaMLP(config)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, attend: Attend) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, attend)
        out: Tensor = x + self.mlp(self.post_attention_layernorm(x))
        return out


class LlamaBackbone(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    """Hidden states for a flat run of tokens (any mix of sequences; ``attend`` keeps them apart)."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaBackbone(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self._rope: tuple[Tensor, Tensor] | None = None

    def forward(self, token_ids: Tensor, positions: Tensor, attend: Attend) -> Tensor:
        if self._rope is None or self._rope[0].device != token_ids.device:
            self._rope = rope_tables(self.config, token_ids.device)
        cos, sin = self._rope[0][positions], self._rope[1][positions]
        x = self.model.embed_tokens(token_ids)
        for layer in self.model.layers:
            x = layer(x, cos, sin, attend)
        result: Tensor = self.model.norm(x)
        return result

    def logits(self, hidden: Tensor) -> Tensor:
        logits: Tensor = self.lm_head(hidden)
        return logits.float()


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
