"""Mistral: Llama's decoder without biases, every layer with the same ``sliding_window``
(null in Mistral 7B v0.2 and later). The engine attends to the whole context, so a window is
served only where it cannot matter: contexts up to its size (hf_config.check_context)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from strata.worker.models.decoder import Attention, DecoderForCausalLM
from strata.worker.models.hf_config import Architecture, read_int

# transformers' MistralConfig defaults, for keys config.json leaves out.
DEFAULTS = {
    "vocab_size": 32000,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": None,
    "hidden_act": "silu",
    "max_position_embeddings": 4096 * 32,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "sliding_window": 4096,
}


def window(values: Mapping[str, Any]) -> int | None:
    """Every layer's (transformers' Mistral ignores ``layer_types``)."""
    return None if values.get("sliding_window") is None else read_int(values, "sliding_window")


class MistralForCausalLM(DecoderForCausalLM):
    attention_class = Attention


ARCHITECTURE = Architecture("MistralForCausalLM", "mistral", MistralForCausalLM, DEFAULTS, window)
