"""Which architecture a checkpoint is: ``architectures`` in config.json (what vLLM goes by),
else ``model_type`` (what transformers' Auto classes go by); where both are given they must
agree. A checkpoint that names neither is refused, never assumed to be a Llama."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from strata.worker.models import llama, mistral, qwen2, qwen3
from strata.worker.models.decoder import DecoderForCausalLM
from strata.worker.models.errors import ModelLoadError
from strata.worker.models.hf_config import Architecture, DecoderConfig, parse_config, refuse
from strata.worker.models.jsonfile import read_object

ARCHITECTURES: tuple[Architecture, ...] = (
    llama.ARCHITECTURE,
    qwen2.ARCHITECTURE,
    qwen3.ARCHITECTURE,
    mistral.ARCHITECTURE,
)
BY_NAME = {arch.name: arch for arch in ARCHITECTURES}
BY_TYPE = {arch.model_type: arch for arch in ARCHITECTURES}


def _by_names(names: Any) -> Architecture:
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise refuse("architectures", names, "a list of names")
    for name in names:  # the first the engine implements, as vLLM picks
        if name in BY_NAME:
            return BY_NAME[name]
    raise refuse("architectures", names, ", ".join(BY_NAME))


def resolve(raw: dict[str, Any]) -> Architecture:
    names, model_type = raw.get("architectures"), raw.get("model_type")
    if not names and model_type is None:
        raise ModelLoadError(
            "config.json: neither architectures nor model_type is given; supported: "
            f"architectures {', '.join(BY_NAME)} (model_type {', '.join(BY_TYPE)})"
        )
    if not names:
        if model_type not in BY_TYPE:
            raise refuse("model_type", model_type, ", ".join(BY_TYPE))
        return BY_TYPE[model_type]
    arch = _by_names(names)
    if model_type is not None and model_type != arch.model_type:
        raise refuse("model_type", model_type, f"{arch.model_type!r}, as architectures {names} says")
    return arch


def read_raw(path: str | Path) -> dict[str, Any]:
    config_file = Path(path) / "config.json"
    if not config_file.is_file():
        raise ModelLoadError(f"model.path: no config.json in {path}")
    return read_object(config_file)


def read_config(path: str | Path) -> DecoderConfig:
    raw = read_raw(path)
    return parse_config(raw, resolve(raw))


def model_class(config: DecoderConfig) -> type[DecoderForCausalLM]:
    return BY_NAME[config.architecture].model
