"""Rotary position embeddings: what config.json says of them, and the cos/sin tables.

Checkpoints state RoPE in two layouts: transformers 5 writes one ``rope_parameters`` block
(``rope_type``, ``rope_theta`` and the scaling's own keys), earlier versions a top-level
``rope_theta`` beside a ``rope_scaling`` block (whose type may be spelled ``type``). Both are read
into one ``RopeConfig``, with transformers' precedence: ``rope_scaling`` over ``rope_parameters``,
a value inside the block over the top-level one. Every formula follows transformers'
``modeling_rope_utils`` (the reference the fidelity tests compare against); a type the engine
does not implement is refused by name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from strata.worker.models.errors import ModelLoadError

DEFAULT_THETA = 10000.0
SUPPORTED = ("default", "linear", "dynamic", "llama3", "yarn")


@dataclass(frozen=True)
class RopeConfig:
    rope_type: str = "default"
    theta: float = DEFAULT_THETA
    factor: float = 1.0
    original_max_position_embeddings: int = 0  # llama3, yarn: the pretraining context
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    attention_factor: float | None = None  # yarn: None derives it from factor (and mscale)
    mscale: float = 0.0  # yarn
    mscale_all_dim: float = 0.0  # yarn
    truncate: bool = True  # yarn


def _block(raw: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The RoPE block and the key it came from (transformers lets ``rope_scaling`` win)."""
    for key in ("rope_scaling", "rope_parameters"):
        value = raw.get(key)
        if value is not None and not isinstance(value, dict):
            raise ModelLoadError(f"config.json: {key} {value!r} is not supported (an object)")
        if value:
            return key, value
    return "rope_parameters", {}


def _number(block: dict[str, Any], key: str, where: str, default: float | None = None) -> float:
    if key not in block and default is None:
        raise ModelLoadError(f"config.json: {where}.{key} is missing (a number)")
    value = block.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ModelLoadError(f"config.json: {where}.{key} {value!r} is not supported (a number)")
    return float(value)


def _type(block: dict[str, Any], where: str) -> str:
    key = "rope_type" if "rope_type" in block else "type"
    rope_type = block.get(key, "default")
    if rope_type not in SUPPORTED:
        raise ModelLoadError(
            f"config.json: {where}.{key} {rope_type!r} is not supported ({', '.join(SUPPORTED)})"
        )
    nested = [name for name, value in block.items() if isinstance(value, dict)]
    if nested:  # one block per layer type (Gemma 3 style): not an architecture served here
        raise ModelLoadError(
            f"config.json: {where}.{nested[0]} {block[nested[0]]!r} is not supported "
            "(one RoPE block for every layer)"
        )
    return str(rope_type)


def _partial_rotary(raw: dict[str, Any], block: dict[str, Any], where: str) -> None:
    """Rotating only part of each head is an architecture of its own (Phi, GPT-NeoX): refused."""
    for source, name in ((block, f"{where}.partial_rotary_factor"), (raw, "partial_rotary_factor")):
        value = source.get("partial_rotary_factor")
        if value is not None and value != 1:
            raise ModelLoadError(f"config.json: {name} {value!r} is not supported (1.0)")


def _original_max(raw: dict[str, Any], block: dict[str, Any], where: str) -> int:
    """transformers prefers a top-level ``original_max_position_embeddings`` (Phi-3 style) over
    the block's, and falls back to ``max_position_embeddings``."""
    name = "original_max_position_embeddings"
    value = raw.get(name)
    if value is None:
        value, name = block.get(name, raw["max_position_embeddings"]), f"{where}.{name}"
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ModelLoadError(f"config.json: {name} {value!r} is not supported (a positive integer)")
    return value


def _yarn(block: dict[str, Any], where: str, original: int, max_positions: int) -> dict[str, Any]:
    factor = block.get("factor")
    attention = block.get("attention_factor")
    return {
        # An explicit null factor: the ratio of the contexts (DeepSeek-V3's configs).
        "factor": max_positions / original if factor is None else _number(block, "factor", where),
        "beta_fast": float(block.get("beta_fast") or 32.0),
        "beta_slow": float(block.get("beta_slow") or 1.0),
        "attention_factor": None if attention is None else _number(block, "attention_factor", where),
        "mscale": float(block.get("mscale") or 0.0),
        "mscale_all_dim": float(block.get("mscale_all_dim") or 0.0),
        "truncate": bool(block.get("truncate", True)),
    }


def read_rope(raw: dict[str, Any]) -> RopeConfig:
    """``raw``: config.json with the architecture's defaults filled in (``max_position_embeddings``
    and ``rope_theta`` at least)."""
    where, block = _block(raw)
    rope_type = _type(block, where)
    _partial_rotary(raw, block, where)
    theta = _number(block, "rope_theta", where, raw.get("rope_theta", DEFAULT_THETA))
    if rope_type == "default":
        return RopeConfig(theta=theta)
    if rope_type in ("linear", "dynamic"):
        return RopeConfig(rope_type, theta, _number(block, "factor", where))
    original = _original_max(raw, block, where)
    if rope_type == "llama3":
        return RopeConfig(
            rope_type,
            theta,
            _number(block, "factor", where),
            original,
            low_freq_factor=_number(block, "low_freq_factor", where),
            high_freq_factor=_number(block, "high_freq_factor", where),
        )
    if "factor" not in block:
        raise ModelLoadError(f"config.json: {where}.factor is missing (yarn needs it)")
    yarn = _yarn(block, where, original, int(raw["max_position_embeddings"]))
    return RopeConfig(rope_type, theta, original_max_position_embeddings=original, **yarn)


def _base_inv_freq(theta: float, dim: int) -> Tensor:
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))


def llama3_inv_freq(inv_freq: Tensor, rope: RopeConfig) -> Tensor:
    """Llama 3.1's long-context frequencies: low frequencies slowed by ``factor``, high ones
    kept, a smooth blend between (transformers' ``_compute_llama3_parameters``)."""
    factor, low, high = rope.factor, rope.low_freq_factor, rope.high_freq_factor
    original = float(rope.original_max_position_embeddings)
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > original / low, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < original / high) & ~(wavelen > original / low)
    return torch.where(medium, blended, scaled)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_attention_factor(rope: RopeConfig) -> float:
    if rope.attention_factor is not None:
        return rope.attention_factor
    if rope.mscale and rope.mscale_all_dim:
        return _yarn_mscale(rope.factor, rope.mscale) / _yarn_mscale(rope.factor, rope.mscale_all_dim)
    return _yarn_mscale(rope.factor)


def _yarn_ramp(rope: RopeConfig, dim: int) -> Tensor:
    """Per frequency, 1 where it is kept (extrapolated) and 0 where it is interpolated."""

    def correction_dim(rotations: float) -> float:
        original = rope.original_max_position_embeddings
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(rope.theta))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # as transformers: no division by zero
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    return 1 - ramp


def yarn_inv_freq(rope: RopeConfig, dim: int) -> Tensor:
    pos_freqs = rope.theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)
    extrapolation = 1.0 / pos_freqs
    interpolation = 1.0 / (rope.factor * pos_freqs)
    keep = _yarn_ramp(rope, dim)
    return interpolation * (1 - keep) + extrapolation * keep


def inv_freq(rope: RopeConfig, dim: int, max_positions: int) -> tuple[Tensor, float]:
    """The inverse frequencies and the factor cos and sin are scaled by."""
    if rope.rope_type == "yarn":
        return yarn_inv_freq(rope, dim), yarn_attention_factor(rope)
    theta = rope.theta
    if rope.rope_type == "dynamic":
        # transformers' value at its initial length, max_position_embeddings; it recomputes only
        # past that length, which the engine's context never reaches (LLMEngine.max_context).
        growth = (rope.factor * max_positions / max_positions) - (rope.factor - 1)
        theta = theta * growth ** (dim / (dim - 2))
    base = _base_inv_freq(theta, dim)
    if rope.rope_type == "linear":
        return base / rope.factor, 1.0
    if rope.rope_type == "llama3":
        return llama3_inv_freq(base, rope), 1.0
    return base, 1.0


def rope_tables(
    rope: RopeConfig, head_dim: int, max_positions: int, device: torch.device
) -> tuple[Tensor, Tensor]:
    """cos and sin for every position, [max_positions, head_dim], in float32. The frequencies
    are computed on the CPU, as transformers computes them."""
    freqs, scale = inv_freq(rope, head_dim, max_positions)
    t = torch.arange(max_positions, dtype=torch.float, device=device)
    angles = t[:, None] * freqs.to(device)[None, :]
    emb = torch.cat([angles, angles], dim=-1)
    return emb.cos() * scale, emb.sin() * scale
