"""When to stop and how to sample by default: what a checkpoint says about its own generation.

A chat model ends a turn with a token that is often not config.json's (first) ``eos_token_id``:
Llama 3.1 Instruct ends turns with ``<|eot_id|>`` (listed in generation_config.json), Qwen with
``<|im_end|>``. Every EOS id from config.json and generation_config.json, the tokenizer's own
``eos_token`` and the special tokens that mark the end of a turn all stop generation.
generation_config.json's sampling settings are the defaults for requests that give none, as
transformers and vLLM apply them. Torch-free.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from strata.worker.models.jsonfile import read_optional
from strata.worker.tokenizer import Tokenizer

log = logging.getLogger(__name__)
# Special tokens that end a turn in the common chat formats (Llama 3, ChatML, Phi, Gemma).
END_OF_TURN = ("<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>")
# generation_config.json sampling keys the engine applies, and those it cannot (logged, not used).
APPLIED = ("temperature", "top_p", "top_k", "max_new_tokens")
NOT_APPLIED = ("repetition_penalty", "min_p", "typical_p", "num_beams", "length_penalty")


@dataclass(frozen=True)
class GenerationDefaults:
    eos_token_ids: frozenset[int] = frozenset()
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_tokens: int | None = None


def _ids(value: Any) -> set[int]:
    """``eos_token_id`` is an int, a list of ints, or absent."""
    values = value if isinstance(value, list) else [value]
    return {v for v in values if isinstance(v, int) and not isinstance(v, bool)}


def _token_text(value: Any) -> str | None:
    """Special tokens appear as plain strings or as AddedToken dicts with a ``content``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def eos_token_ids(model_dir: Path, tokenizer: Tokenizer, generation: dict[str, Any]) -> frozenset[int]:
    config = read_optional(model_dir / "config.json")
    ids = _ids(config.get("eos_token_id")) | _ids(generation.get("eos_token_id"))
    specials = tokenizer.special_tokens()
    eos_text = _token_text(read_optional(model_dir / "tokenizer_config.json").get("eos_token"))
    for text in (eos_text, *END_OF_TURN):
        if text is not None and text in specials:
            ids.add(specials[text])
    return frozenset(ids)


def _sampling(generation: dict[str, Any]) -> dict[str, Any]:
    found = {k: generation[k] for k in APPLIED if isinstance(generation.get(k), int | float)}
    ignored = [k for k in NOT_APPLIED if k in generation]
    if ignored:
        log.warning("generation_config.json settings not applied (not implemented): %s", ignored)
    return {
        "temperature": found.get("temperature"),
        "top_p": found.get("top_p"),
        "top_k": int(found["top_k"]) if found.get("top_k", 0) > 0 else None,  # 0: no top-k
        "max_tokens": int(found["max_new_tokens"]) if "max_new_tokens" in found else None,
    }


def load_generation_defaults(model_dir: str | Path, tokenizer: Tokenizer) -> GenerationDefaults:
    directory = Path(model_dir)
    generation = read_optional(directory / "generation_config.json")
    eos = eos_token_ids(directory, tokenizer, generation)
    return GenerationDefaults(eos_token_ids=eos, **_sampling(generation))
