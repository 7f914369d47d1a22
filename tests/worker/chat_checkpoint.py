"""A chat checkpoint's text side, generated: a byte-level BPE tokenizer.json with Llama 3 style
special tokens, tokenizer_config.json, chat_template.jinja (tests/worker/fixtures/) and a
generation_config.json with two EOS ids. Needs only ``tokenizers`` (no torch), so
``make_chat_reference.py`` can run it in a throwaway transformers venv."""

from __future__ import annotations

import json
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"
TEMPLATE = FIXTURES / "chat_template.jinja"
REFERENCE = FIXTURES / "chat_reference.json"
SPECIALS = ("<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>")
BOS_ID, END_OF_TEXT_ID, EOT_ID = 256, 257, 258  # the specials' ids, in order after the 256 bytes
GENERATION_CONFIG = {"eos_token_id": [END_OF_TEXT_ID, EOT_ID], "temperature": 0.6, "top_p": 0.9}


def byte_chars() -> dict[int, str]:
    """GPT-2's printable stand-in for each byte (what a byte-level BPE vocab is written in)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def write_tokenizer(out: Path) -> None:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    vocab = {char: b for b, char in byte_chars().items()}  # token id == byte value
    tok = Tokenizer(models.BPE(vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    tok.post_processor = processors.TemplateProcessing(
        single=f"{SPECIALS[0]} $A", special_tokens=[(SPECIALS[0], BOS_ID)]
    )
    tok.save(str(out / "tokenizer.json"))


def write_chat_files(out: Path) -> Path:
    """Everything but config.json and the weights."""
    out.mkdir(parents=True, exist_ok=True)
    write_tokenizer(out)
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": SPECIALS[0],
        "eos_token": SPECIALS[1],
        "model_max_length": 4096,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "chat_template.jinja").write_text(TEMPLATE.read_text())
    (out / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG, indent=2) + "\n")
    return out


# The conversations the reference covers: a system turn, multi-turn with a tool result full of
# characters Jinja's own tojson would HTML-escape, unicode, and a refusal by the template.
CONVERSATIONS: list[list[dict[str, str]]] = [
    [{"role": "user", "content": "Hello!"}],
    [
        {"role": "system", "content": "  You are terse.  "},
        {"role": "user", "content": 'Say "hi" <b>twice</b> & stop.'},
    ],
    [
        {"role": "user", "content": "Weather in Zürich?"},
        {"role": "assistant", "content": "Let me check. "},
        {"role": "tool", "name": "weather", "content": "<sunny> 21°C, it's 'fine' & dry"},
        {"role": "user", "content": "Thanks — and tomorrow?"},
    ],
    [{"role": "assistant", "content": "I speak first."}],
]
