"""Tiny random checkpoints that transformers itself saves, for the fidelity tests: every
supported architecture, in every config.json layout transformers writes or has written.

``layout``: ``v5`` is what transformers 5 writes (``rope_parameters``); ``legacy`` rewrites the
same config the way earlier versions wrote it (top-level ``rope_theta``, ``rope_scaling`` with
the type spelled as given); ``minimal`` keeps only ``model_type``, the sizes and the case's own
keys, so every other key takes its architecture's default. Weights are redrawn from one seeded
generator with a spread that keeps logits far apart (transformers' own init, std 0.02 and zero
biases, would make greedy decoding a matter of rounding and leave biases and norms untested). Offline: the
tokenizer is a WordLevel one built here, whose every token id reads back from its text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

VOCAB = 256
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
SIZES = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 256,
}
MINIMAL_KEYS = ("model_type", *SIZES)
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}


@dataclass(frozen=True)
class Case:
    name: str
    model_type: str
    config: dict[str, Any] = field(default_factory=dict)  # beyond SIZES
    layout: str = "v5"
    seed: int = 0


CASES = (
    Case(
        "llama-v5-llama3",
        "llama",
        {"num_key_value_heads": 2, "rope_parameters": {**LLAMA3, "rope_theta": 5e5}},
    ),
    Case(
        "llama-legacy-llama3-tied",
        "llama",
        {
            "num_key_value_heads": 2,
            "tie_word_embeddings": True,
            "rope_parameters": {**LLAMA3, "rope_theta": 5e5},
        },
        "legacy",
    ),
    Case(
        "llama-legacy-linear",
        "llama",
        {"rope_parameters": {"type": "linear", "factor": 2.0, "rope_theta": 10000.0}},
        "legacy",
    ),
    Case(
        "llama-v5-dynamic",
        "llama",
        {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}},
    ),
    Case("llama-bias-head-dim", "llama", {"attention_bias": True, "mlp_bias": True, "head_dim": 32}),
    Case("llama-minimal", "llama", layout="minimal"),
    Case(
        "qwen2-v5-tied",
        "qwen2",
        {"num_key_value_heads": 2, "tie_word_embeddings": True, "rope_parameters": {"rope_theta": 1e6}},
    ),
    Case(
        "qwen2-legacy-yarn",
        "qwen2",
        {
            "num_key_value_heads": 2,
            "sliding_window": 32,
            "rope_parameters": {
                "type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 64,
                "rope_theta": 1e6,
            },
        },
        "legacy",
    ),
    Case("qwen3-v5-tied", "qwen3", {"num_key_value_heads": 2, "head_dim": 32, "tie_word_embeddings": True}),
    Case("qwen3-minimal", "qwen3", {"num_key_value_heads": 4}, "minimal"),
    Case("mistral-v5-window", "mistral", {"num_key_value_heads": 2, "sliding_window": 256}),
    Case(
        "mistral-legacy",
        "mistral",
        {"num_key_value_heads": 1, "sliding_window": None, "head_dim": None},
        "legacy",
    ),
)


def _legacy(config: dict[str, Any]) -> dict[str, Any]:
    """The config as transformers 4 wrote it: ``rope_theta`` at the top, the rest (if any) in
    ``rope_scaling``, and ``torch_dtype`` for ``dtype``."""
    out = {k: v for k, v in config.items() if k not in ("rope_parameters", "dtype")}
    rope = dict(config.get("rope_parameters") or {})
    out["rope_theta"] = rope.pop("rope_theta", 10000.0)
    kind = rope.get("rope_type", rope.get("type", "default"))
    out["rope_scaling"] = None if kind == "default" else rope
    out["torch_dtype"] = config.get("dtype", "float32")
    return out


def _rewrite(out: Path, case: Case) -> None:
    path = out / "config.json"
    config = json.loads(path.read_text())
    if case.layout == "legacy":
        # The case's own values where transformers 5 normalised them: the type's spelling
        # ("type" or "rope_type"), a sliding_window beside use_sliding_window false.
        config.update(case.config)
        config.pop("layer_types", None)
        config = {**_legacy(config), "transformers_version": "4.46.0"}
    elif case.layout == "minimal":
        config = {k: config[k] for k in (*MINIMAL_KEYS, *case.config)}
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _redraw(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            noise = torch.randn(param.shape, generator=gen)
            if name.endswith("norm.weight"):
                param.copy_(1 + 0.2 * noise)
            elif name.endswith("bias"):
                param.copy_(0.5 * noise)
            elif "embed_tokens" in name:
                param.copy_(noise)
            else:
                param.copy_(noise / param.shape[-1] ** 0.5)


def write_tokenizer(out: Path) -> None:
    """WordLevel: ``w0``... ``w252`` and the specials, so any id sequence survives a round trip
    through text (the HTTP API's logprobs give each token's text)."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {f"w{i}": i for i in range(VOCAB - len(SPECIALS))}
    vocab = words | {s: VOCAB - len(SPECIALS) + i for i, s in enumerate(SPECIALS)}
    rust = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    rust.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    rust.add_special_tokens([AddedToken(s, special=True) for s in SPECIALS])
    tok = PreTrainedTokenizerFast(tokenizer_object=rust, eos_token=SPECIALS[2], unk_token="w0")
    tok.save_pretrained(out)


def write_checkpoint(case: Case, out: Path) -> Path:
    import transformers

    torch.manual_seed(case.seed)
    config = transformers.AutoConfig.for_model(case.model_type, **SIZES, **case.config)
    model = transformers.AutoModelForCausalLM.from_config(config)
    _redraw(model, case.seed)
    model.save_pretrained(out, safe_serialization=True)
    _rewrite(out, case)
    write_tokenizer(out)
    return out


def token_ids(texts: list[str]) -> list[int]:
    """The ids of tokens given as their text (the WordLevel vocab above)."""
    specials = {s: VOCAB - len(SPECIALS) + i for i, s in enumerate(SPECIALS)}
    return [specials[t] if t in specials else int(t.strip().removeprefix("w")) for t in texts]
