"""A byte-level tokenizer in Hugging Face's files, for test models any engine can load.

The byte tokenizer (``strata.worker.tokenizer.ByteTokenizer``) needs no files, which suits
Strata's own worker; vLLM and transformers load a tokenizer only from ``tokenizer.json`` and
``tokenizer_config.json``. These are the same byte-level tokenizer in that form: a BPE model with
no merges whose 256 tokens are the bytes (token id = byte value, spelled with GPT-2's byte-to-
character map), ``<s>`` and ``</s>`` as special tokens 256 and 257, no BOS added, and a plain
chat template. Written, not trained: the same files every time.
"""

from __future__ import annotations

import json
from pathlib import Path

BOS, EOS = "<s>", "</s>"
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def byte_chars() -> dict[int, str]:
    """GPT-2's map of every byte to a printable character (byte-level BPE's alphabet)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars, extra = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def tokenizer_json(bos_id: int, eos_id: int) -> dict[str, object]:
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    special = [
        {"id": i, "content": text, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for i, text in ((bos_id, BOS), (eos_id, EOS))
    ]  # fmt: skip
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": special,
        "normalizer": None,
        "pre_tokenizer": byte_level,
        "post_processor": None,
        "decoder": byte_level,
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
            "vocab": {char: b for b, char in byte_chars().items()}, "merges": [],
        },
    }  # fmt: skip


def write_tokenizer(out: Path, bos_id: int, eos_id: int) -> None:
    """tokenizer.json, tokenizer_config.json (with the chat template) and generation_config.json."""
    (out / "tokenizer.json").write_text(json.dumps(tokenizer_json(bos_id, eos_id), ensure_ascii=False) + "\n")
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "add_bos_token": False,
        "add_eos_token": False,
        "model_max_length": 1 << 20,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    generation = {"bos_token_id": bos_id, "eos_token_id": eos_id}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
