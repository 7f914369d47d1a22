"""When to stop and how to sample by default: what a checkpoint says about its own generation.

A chat model ends a turn with a token that is often not config.json's (first) ``eos_token_id``:
Llama 3.1 Instruct ends turns with ``<|eot_id|>`` (listed in generation_config.json), Qwen with
``<|im_end|>``. Generation stops, as in transformers and vLLM, at what the checkpoint lists: every
EOS id of config.json and generation_config.json and the tokenizer's own ``eos_token`` (special
or not); a request adds its ``stop_token_ids``. Only a checkpoint that lists none stops at the
end-of-turn tokens of the common chat formats its tokenizer has, and a log line says so.
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
# Special tokens that end a turn in the common chat formats (Llama 3, ChatML, Phi, Gemma): the
# stop tokens of a checkpoint that lists none of its own.
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


def tokenizer_eos(model_dir: Path) -> str | None:
    """The tokenizer's ``eos_token``: tokenizer_config.json's, else special_tokens_map.json's."""
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        text = _token_text(read_optional(model_dir / name).get("eos_token"))
        if text is not None:
            return text
    return None


def built_in_stops(tokenizer: Tokenizer) -> frozenset[int]:
    specials = tokenizer.special_tokens()
    found = {text: specials[text] for text in END_OF_TURN if text in specials}
    log.warning(
        "the checkpoint lists no EOS token (config.json, generation_config.json, the tokenizer's "
        "eos_token): generation stops at the built-in end-of-turn tokens its tokenizer has: %s",
        sorted(found) or "none",
        extra={"event": "built_in_stop_tokens", "token_ids": sorted(found.values())},
    )
    return frozenset(found.values())


def eos_token_ids(model_dir: Path, tokenizer: Tokenizer, generation: dict[str, Any]) -> frozenset[int]:
    config = read_optional(model_dir / "config.json")
    ids = _ids(config.get("eos_token_id")) | _ids(generation.get("eos_token_id"))
    eos_text = tokenizer_eos(model_dir)
    eos_id = None if eos_text is None else tokenizer.token_id(eos_text)
    if eos_id is not None:
        ids.add(eos_id)
    return frozenset(ids) if ids else built_in_stops(tokenizer)


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
