"""Qwen3 (dense): Llama's decoder with an RMSNorm over each head's queries and keys before RoPE
(``q_norm``, ``k_norm``), biases where ``attention_bias`` says so, and Qwen2's sliding-window
rules. Its config class defaults ``head_dim`` to 128, not hidden_size / heads."""

from __future__ import annotations

from torch import Tensor

from strata.worker.models import qwen2
from strata.worker.models.decoder import Attention, DecoderForCausalLM
from strata.worker.models.hf_config import Architecture, DecoderConfig
from strata.worker.models.layers import RMSNorm

# transformers' Qwen3Config defaults, for keys config.json leaves out.
DEFAULTS = {**qwen2.DEFAULTS, "head_dim": 128, "attention_bias": False}


class Qwen3Attention(Attention):
    def __init__(self, config: DecoderConfig, layer: int) -> None:
        super().__init__(config, layer)
        self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps)
        self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps)

    def before_rope(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        return self.q_norm(q), self.k_norm(k)


class Qwen3ForCausalLM(DecoderForCausalLM):
    attention_class = Qwen3Attention


ARCHITECTURE = Architecture("Qwen3ForCausalLM", "qwen3", Qwen3ForCausalLM, DEFAULTS, qwen2.window)
