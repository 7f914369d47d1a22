"""Load a Hugging Face style model directory (config.json + *.safetensors) onto a device.

The module is built on the ``meta`` device and then given real storage, so a large checkpoint is
not first initialised with random weights it would immediately overwrite.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from strata.worker.models.llama import LlamaConfig, LlamaForCausalLM

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


class ModelLoadError(RuntimeError):
    """The model directory is missing, incomplete or does not match the architecture."""


def read_config(path: str | Path) -> LlamaConfig:
    config_file = Path(path) / "config.json"
    if not config_file.is_file():
        raise ModelLoadError(f"model.path: no config.json in {path}")
    raw = json.loads(config_file.read_text())
    if raw.get("model_type", "llama") != "llama":
        raise ModelLoadError(f"model.path: model_type {raw.get('model_type')!r} is not llama")
    scaling = raw.get("rope_scaling") or {}
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type not in ("default", "llama3"):
        raise ModelLoadError(
            f"model.path: rope_scaling type {rope_type!r} is not supported (default, llama3)"
        )
    return LlamaConfig.from_dict(raw)


def load_model(path: str | Path, dtype: torch.dtype, device: torch.device) -> LlamaForCausalLM:
    config = read_config(path)
    shards = sorted(Path(path).glob("*.safetensors"))
    if not shards:
        raise ModelLoadError(f"model.path: no *.safetensors in {path}")
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model.to_empty(device=device)
    state: dict[str, torch.Tensor] = {}
    for shard in shards:
        state.update(load_file(str(shard), device=str(device)))
    if config.tie_word_embeddings or "lm_head.weight" not in state:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    state = {k: v for k, v in state.items() if not k.endswith("rotary_emb.inv_freq")}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ModelLoadError(f"model.path: missing tensors {missing[:5]}, unexpected {unexpected[:5]}")
    return model.to(dtype).eval()
