"""Llama (Llama 2, 3, 3.1, 3.2, 3.3 and their fine-tunes): the shared decoder as it is, with a
bias on every attention projection where ``attention_bias`` says so and on the MLP where
``mlp_bias`` does. No sliding window."""

from __future__ import annotations

from strata.worker.models.decoder import Attention, DecoderForCausalLM
from strata.worker.models.hf_config import Architecture

# transformers' LlamaConfig defaults, for keys config.json leaves out.
DEFAULTS = {
    "vocab_size": 32000,
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": None,
    "head_dim": None,
    "hidden_act": "silu",
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "mlp_bias": False,
}


class LlamaForCausalLM(DecoderForCausalLM):
    attention_class = Attention


ARCHITECTURE = Architecture("LlamaForCausalLM", "llama", LlamaForCausalLM, DEFAULTS)
