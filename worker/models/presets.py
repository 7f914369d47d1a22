"""Deterministic test models: seeded random weights in a Hugging Face style directory.

``tiny`` keeps unit tests fast; ``small`` makes prefill of a few thousand tokens cost real CPU
time (so cache hits are measurable) and allows 32k-token contexts (the KV-tier benchmark uses
16k prompts). The ``hf-`` presets also write the byte tokenizer as Hugging Face files
(``byte_bpe``), so vLLM serves them too: ``hf-tiny`` for tests, ``hf-small`` (3M parameters)
where many requests must run, ``hf-medium`` (51M) where prefill must dominate a request on the
CPU. The same preset and seed always write
byte-identical files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from strata.worker.models.byte_bpe import write_tokenizer
from strata.worker.models.hf_config import DecoderConfig
from strata.worker.models.llama import LlamaForCausalLM
from strata.worker.models.rope import RopeConfig
from strata.worker.tokenizer import BYTE_BOS_ID, BYTE_EOS_ID, BYTE_VOCAB_SIZE

PRESETS: dict[str, DecoderConfig] = {
    "tiny": DecoderConfig(
        vocab_size=BYTE_VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        eos_token_ids=(BYTE_EOS_ID,),
    ),
    "small": DecoderConfig(
        vocab_size=BYTE_VOCAB_SIZE,
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=32768,
        rms_norm_eps=1e-5,
        rope=RopeConfig(theta=500000.0),
        eos_token_ids=(BYTE_EOS_ID,),
    ),
    # head_dim 64: vLLM's CPU attention takes no smaller one
    "hf-tiny": DecoderConfig(
        vocab_size=BYTE_VOCAB_SIZE,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        eos_token_ids=(BYTE_EOS_ID,),
    ),
    "hf-small": DecoderConfig(
        vocab_size=BYTE_VOCAB_SIZE,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
        eos_token_ids=(BYTE_EOS_ID,),
    ),
    "hf-medium": DecoderConfig(
        vocab_size=BYTE_VOCAB_SIZE,
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=8,
        num_attention_heads=12,
        num_key_value_heads=4,
        head_dim=64,
        max_position_embeddings=16384,
        rms_norm_eps=1e-5,
        rope=RopeConfig(theta=500000.0),
        eos_token_ids=(BYTE_EOS_ID,),
    ),
}
HF_TOKENIZER = frozenset(name for name in PRESETS if name.startswith("hf-"))


def config_json(config: DecoderConfig) -> dict[str, Any]:
    """A Llama preset's config.json, in the layout transformers 5 writes (``rope_parameters``)."""
    fields = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        **{name: getattr(config, name) for name in fields},
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "max_position_embeddings": config.max_position_embeddings,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_parameters": {"rope_type": "default", "rope_theta": config.rope.theta},
        "tie_word_embeddings": config.tie_word_embeddings,
        "bos_token_id": BYTE_BOS_ID,
        "eos_token_id": config.eos_token_ids[0],
    }


def seeded_state(config: DecoderConfig, seed: int) -> dict[str, torch.Tensor]:
    """Weights drawn in sorted-name order from one generator, so they depend on nothing else."""
    with torch.device("meta"):
        shapes = {name: p.shape for name, p in LlamaForCausalLM(config).named_parameters()}
    gen = torch.Generator().manual_seed(seed)
    state: dict[str, torch.Tensor] = {}
    for name in sorted(shapes):
        if name.endswith("norm.weight"):
            state[name] = torch.ones(shapes[name])
        else:
            # std 1/sqrt(fan_in) for projections keeps activations O(1) through the layers, so
            # logits are spread out and greedy decoding is not decided by rounding noise.
            fan_in = shapes[name][-1] if "embed" not in name else 1
            state[name] = torch.randn(shapes[name], generator=gen) / fan_in**0.5
    return state


def write_model(out: str | Path, preset: str, seed: int = 0) -> Path:
    if preset not in PRESETS:
        raise ValueError(f"preset: unknown {preset!r}; choose one of {sorted(PRESETS)}")
    config = PRESETS[preset]
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(config_json(config), indent=2, sort_keys=True) + "\n")
    save_file(seeded_state(config, seed), str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    if preset in HF_TOKENIZER:
        write_tokenizer(out_dir, BYTE_BOS_ID, BYTE_EOS_ID)
    return out_dir
