"""Qwen2 and Qwen2.5: Llama's decoder with a bias on the q, k and v projections (never on o,
whatever ``attention_bias`` says: transformers' Qwen2 does not read it). A sliding window is
used only with ``use_sliding_window``, by the layers ``layer_types`` (or ``max_window_layers``)
marks; served for contexts up to its size (hf_config.check_context)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from strata.worker.models.decoder import Attention, DecoderForCausalLM
from strata.worker.models.hf_config import Architecture, DecoderConfig, read_bool, read_int, refuse

# transformers' Qwen2Config defaults, for keys config.json leaves out.
DEFAULTS = {
    "vocab_size": 151936,
    "hidden_size": 4096,
    "intermediate_size": 22016,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "head_dim": None,
    "hidden_act": "silu",
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "use_sliding_window": False,
    "sliding_window": 4096,
    "max_window_layers": 28,
    "layer_types": None,
}
LAYER_TYPES = ("full_attention", "sliding_attention")


def _layer_types(values: Mapping[str, Any], sliding: bool) -> list[str]:
    layers = read_int(values, "num_hidden_layers")
    types = values.get("layer_types")
    if types is None:
        first = read_int(values, "max_window_layers")
        return [LAYER_TYPES[int(sliding and i >= first)] for i in range(layers)]
    if not isinstance(types, list) or len(types) != layers or not set(types) <= set(LAYER_TYPES):
        raise refuse("layer_types", types, f"a list of {layers} of {', '.join(LAYER_TYPES)}")
    return types


def window(values: Mapping[str, Any]) -> int | None:
    """The window of the sliding layers, as transformers' Qwen2Config and Qwen3Config set it."""
    size = values.get("sliding_window") if read_bool(values, "use_sliding_window") else None
    types = _layer_types(values, size is not None)
    if size is None or "sliding_attention" not in types:
        return None
    return read_int(values, "sliding_window")


class Qwen2Attention(Attention):
    def __init__(self, config: DecoderConfig, layer: int) -> None:
        super().__init__(config, layer, qkv_bias=True, o_bias=False)


class Qwen2ForCausalLM(DecoderForCausalLM):
    attention_class = Qwen2Attention


ARCHITECTURE = Architecture("Qwen2ForCausalLM", "qwen2", Qwen2ForCausalLM, DEFAULTS, window)
