"""The decoder every supported architecture shares (RMSNorm, RoPE, grouped-query attention,
SwiGLU); an architecture's module (llama.py, qwen2.py, ...) picks its attention.

Parameter names follow Hugging Face's ``*ForCausalLM`` classes, so a checkpoint loads unchanged.
The model runs a flat batch of tokens (any mix of sequences) and reaches the KV cache only
through the ``Attend`` callable it is handed (layers.py).
"""

from __future__ import annotations

from typing import ClassVar

from torch import Tensor, nn

from strata.worker.models.hf_config import DecoderConfig
from strata.worker.models.layers import Attend, GatedMLP, RMSNorm, apply_rope
from strata.worker.models.rope import rope_tables


class Attention(nn.Module):
    """q/k/v/o projections, RoPE, and the cache through ``attend``. Every projection has a bias
    where ``attention_bias`` says so, unless ``qkv_bias``/``o_bias`` say otherwise; subclasses
    may transform q and k before RoPE."""

    def __init__(
        self, config: DecoderConfig, layer: int, qkv_bias: bool | None = None, o_bias: bool | None = None
    ) -> None:
        super().__init__()
        hd, h, kvh = config.head_dim, config.num_attention_heads, config.num_key_value_heads
        self.layer, self.heads, self.kv_heads, self.head_dim = layer, h, kvh, hd
        qkv = config.attention_bias if qkv_bias is None else qkv_bias
        o = config.attention_bias if o_bias is None else o_bias
        self.q_proj = nn.Linear(config.hidden_size, h * hd, bias=qkv)
        self.k_proj = nn.Linear(config.hidden_size, kvh * hd, bias=qkv)
        self.v_proj = nn.Linear(config.hidden_size, kvh * hd, bias=qkv)
        self.o_proj = nn.Linear(h * hd, config.hidden_size, bias=o)

    def before_rope(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        return q, k

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, attend: Attend) -> Tensor:
        t = x.shape[0]
        q = self.q_proj(x).view(t, self.heads, self.head_dim)
        k = self.k_proj(x).view(t, self.kv_heads, self.head_dim)
        q, k = self.before_rope(q, k)
        v = self.v_proj(x).view(t, self.kv_heads, self.head_dim)
        out = attend(self.layer, apply_rope(q, cos, sin), apply_rope(k, cos, sin), v)
        result: Tensor = self.o_proj(out.reshape(t, self.heads * self.head_dim))
        return result


class DecoderLayer(nn.Module):
    def __init__(self, config: DecoderConfig, attention: Attention) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = attention
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = GatedMLP(config.hidden_size, config.intermediate_size, config.mlp_bias)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, attend: Attend) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, attend)
        out: Tensor = x + self.mlp(self.post_attention_layernorm(x))
        return out


class Backbone(nn.Module):
    def __init__(self, config: DecoderConfig, layers: list[DecoderLayer]) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class DecoderForCausalLM(nn.Module):
    """Hidden states for a flat run of tokens (any mix of sequences; ``attend`` keeps them apart).
    An architecture's subclass names its ``attention_class``."""

    attention_class: ClassVar[type[Attention]] = Attention

    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.config = config
        attention = self.attention_class
        layers = [DecoderLayer(config, attention(config, i)) for i in range(config.num_hidden_layers)]
        self.model = Backbone(config, layers)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self._rope: tuple[Tensor, Tensor] | None = None

    def forward(self, token_ids: Tensor, positions: Tensor, attend: Attend) -> Tensor:
        if self._rope is None or self._rope[0].device != token_ids.device:
            c = self.config
            self._rope = rope_tables(c.rope, c.head_dim, c.max_position_embeddings, token_ids.device)
        cos, sin = self._rope[0][positions], self._rope[1][positions]
        x = self.model.embed_tokens(token_ids)
        for layer in self.model.layers:
            x = layer(x, cos, sin, attend)
        result: Tensor = self.model.norm(x)
        return result

    def logits(self, hidden: Tensor) -> Tensor:
        logits: Tensor = self.lm_head(hidden)
        return logits.float()
