"""Load a Hugging Face style model directory (config.json + *.safetensors) onto a device.

Memory stays within the final weights: the module is built on the ``meta`` device (no storage
at all), then each tensor is allocated once, in the target dtype on the target device, filled
from its shard (``safetensors_reader``) and assigned in place of its meta parameter. Nothing is
allocated twice: no random init to overwrite, no float32 copy before a cast, no shard mapped
whole while it is copied.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from strata.worker.models.decoder import DecoderForCausalLM
from strata.worker.models.errors import ModelLoadError
from strata.worker.models.registry import model_class, read_config
from strata.worker.models.safetensors_reader import SafetensorsError, iter_tensors

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
SHARD_INDEX = "model.safetensors.index.json"
TIED = "lm_head.weight"


def weight_files(path: str | Path) -> list[Path]:
    """The shards the index names (a directory may also hold other formats' files), else every
    *.safetensors."""
    directory = Path(path)
    index = directory / SHARD_INDEX
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        shards = [directory / name for name in sorted(set(weight_map.values()))]
    else:
        shards = sorted(directory.glob("*.safetensors"))
    if not shards:
        raise ModelLoadError(f"model.path: no *.safetensors in {path}")
    for shard in shards:
        if not shard.is_file():
            raise ModelLoadError(f"model.path: {shard.name} is named in {SHARD_INDEX} but missing")
    return shards


def _assign(model: nn.Module, name: str, tensor: torch.Tensor) -> None:
    module_name, _, attr = name.rpartition(".")
    try:
        module = model.get_submodule(module_name)
    except AttributeError:
        raise ModelLoadError(f"model.path: unexpected tensor {name}") from None
    current = getattr(module, attr, None)
    if not isinstance(current, nn.Parameter):
        raise ModelLoadError(f"model.path: unexpected tensor {name}")
    if current.shape != tensor.shape:
        raise ModelLoadError(
            f"model.path: {name} has shape {tuple(tensor.shape)}, expected {tuple(current.shape)}"
        )
    setattr(module, attr, nn.Parameter(tensor, requires_grad=False))


def _fill(model: DecoderForCausalLM, shards: list[Path], dtype: torch.dtype, device: torch.device) -> None:
    skip_head = model.config.tie_word_embeddings
    for shard in shards:
        try:
            for name, tensor in iter_tensors(shard, dtype, device):
                if not (name.endswith("rotary_emb.inv_freq") or (skip_head and name == TIED)):
                    _assign(model, name, tensor)
        except SafetensorsError as exc:
            raise ModelLoadError(f"model.path: {exc}") from exc


def load_model(path: str | Path, dtype: torch.dtype, device: torch.device) -> DecoderForCausalLM:
    config = read_config(path)
    shards = weight_files(path)
    with torch.device("meta"):
        model = model_class(config)(config)
    _fill(model, shards, dtype, device)
    if model.lm_head.weight.is_meta:  # tied, or a checkpoint that relies on tying
        model.lm_head.weight = model.model.embed_tokens.weight
    missing = [name for name, p in model.named_parameters() if p.is_meta]
    if missing:
        raise ModelLoadError(f"model.path: missing tensors {missing[:5]}")
    return model.eval()
