"""config.json, read as transformers reads it, into one frozen ``DecoderConfig``.

A key config.json leaves out takes the default of the architecture's transformers config class
(``Architecture.defaults``); a key the architecture does not read is ignored, as transformers
ignores it. Whatever the engine does not implement is refused here, at load, with a
``ModelLoadError`` naming the key, its value and what is supported: a model is never served
with a setting silently dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from strata.worker.models.errors import ModelLoadError
from strata.worker.models.rope import RopeConfig, read_rope

if TYPE_CHECKING:
    from strata.worker.models.decoder import DecoderForCausalLM

ACTIVATIONS = ("silu", "swish")  # the same function in transformers' ACT2FN
DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class DecoderConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope: RopeConfig = field(default_factory=RopeConfig)
    architecture: str = "LlamaForCausalLM"
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # bias on q, k, v and o (Llama, Qwen3)
    mlp_bias: bool = False  # bias on gate, up and down (Llama)
    sliding_window: int | None = None  # the window of the layers that have one; None: none has
    dtype: str | None = None  # the checkpoint's; the engine runs in model.dtype
    eos_token_ids: tuple[int, ...] = ()


Window = Callable[[Mapping[str, Any]], int | None]


def no_window(values: Mapping[str, Any]) -> int | None:
    del values
    return None


@dataclass(frozen=True)
class Architecture:
    """One supported architecture: its names in config.json, the model class, the defaults of
    transformers' config class for it, and which of its layers use a sliding window."""

    name: str  # in config.json's ``architectures``
    model_type: str
    model: type[DecoderForCausalLM]
    defaults: Mapping[str, Any]
    window: Window = no_window


def refuse(key: str, value: Any, supported: str) -> ModelLoadError:
    return ModelLoadError(f"config.json: {key} {value!r} is not supported ({supported})")


def read_int(values: Mapping[str, Any], key: str) -> int:
    value = values.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise refuse(key, value, "a positive integer")
    return value


def read_bool(values: Mapping[str, Any], key: str) -> bool:
    value = values.get(key, False)
    if not isinstance(value, bool):
        raise refuse(key, value, "true or false")
    return value


def _float(values: Mapping[str, Any], key: str) -> float:
    value = values.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise refuse(key, value, "a positive number")
    return float(value)


def _optional_int(values: Mapping[str, Any], key: str) -> int | None:
    return None if values.get(key) is None else read_int(values, key)


def _heads(values: Mapping[str, Any]) -> tuple[int, int, int]:
    """Attention heads, KV heads (default: as many) and the head size (default: hidden / heads)."""
    heads = read_int(values, "num_attention_heads")
    kv_heads = _optional_int(values, "num_key_value_heads") or heads
    if heads % kv_heads:
        raise refuse("num_key_value_heads", kv_heads, f"a divisor of num_attention_heads {heads}")
    head_dim = _optional_int(values, "head_dim") or read_int(values, "hidden_size") // heads
    if head_dim % 2:
        raise refuse("head_dim", head_dim, "an even number: RoPE rotates pairs")
    return heads, kv_heads, head_dim


def _dtype(values: Mapping[str, Any]) -> str | None:
    key = "dtype" if values.get("dtype") is not None else "torch_dtype"
    value = values.get(key)
    if value is not None and value not in DTYPES:
        raise refuse(key, value, ", ".join(DTYPES))
    return value


def _check_unsupported(values: Mapping[str, Any]) -> None:
    if values.get("hidden_act") not in ACTIVATIONS:
        raise refuse("hidden_act", values.get("hidden_act"), ", ".join(ACTIVATIONS))
    if values.get("quantization_config") is not None:
        raise refuse("quantization_config", values["quantization_config"], "unquantized weights only")


def _eos_ids(value: Any) -> tuple[int, ...]:
    values = value if isinstance(value, list) else [value]
    return tuple(v for v in values if isinstance(v, int) and not isinstance(v, bool))


def _flag(values: Mapping[str, Any], arch: Architecture, key: str) -> bool:
    """A bias switch, where the architecture reads it (transformers' Qwen2 and Mistral do not)."""
    return read_bool(values, key) if key in arch.defaults else False


def parse_config(raw: Mapping[str, Any], arch: Architecture) -> DecoderConfig:
    values = {**arch.defaults, **raw}
    _check_unsupported(values)
    heads, kv_heads, head_dim = _heads(values)
    return DecoderConfig(
        vocab_size=read_int(values, "vocab_size"),
        hidden_size=read_int(values, "hidden_size"),
        intermediate_size=read_int(values, "intermediate_size"),
        num_hidden_layers=read_int(values, "num_hidden_layers"),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=read_int(values, "max_position_embeddings"),
        rms_norm_eps=_float(values, "rms_norm_eps"),
        rope=read_rope(values),
        architecture=arch.name,
        tie_word_embeddings=read_bool(values, "tie_word_embeddings"),
        attention_bias=_flag(values, arch, "attention_bias"),
        mlp_bias=_flag(values, arch, "mlp_bias"),
        sliding_window=arch.window(values),
        dtype=_dtype(values),
        eos_token_ids=_eos_ids(raw.get("eos_token_id")),
    )


def check_context(config: DecoderConfig, max_context: int) -> None:
    """A sliding window changes the output only once a context outgrows it (transformers lets a
    position see the ``sliding_window`` positions up to itself); the engine attends to the whole
    context, so it serves such a model only for contexts within the window."""
    window = config.sliding_window
    if window is not None and max_context > window:
        raise ModelLoadError(
            f"config.json: sliding_window {window} is not supported for a context of {max_context} "
            f"tokens (contexts up to the window: set model.max_context_tokens to at most {window})"
        )
