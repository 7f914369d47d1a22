"""A Qwen-style (ChatML) chat template and a byte-level BPE tokenizer, saved by transformers
itself: the worker renders every conversation to the string ``apply_chat_template`` renders and
tokenizes it to the same ids."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from strata.common.openai.chat_template import load_chat_template
from strata.worker.tokenizer import load_tokenizer
from tests.worker.chat_checkpoint import CONVERSATIONS, FIXTURES

TEMPLATE = FIXTURES / "chatml_template.jinja"
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
SENTENCES = [
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
    "Hello! What is the weather in Zürich tomorrow? It's sunny, 21°C and dry.",
    "<tool_response> the user asked twice & the assistant answered </tool_response>",
]
MORE = [
    [
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": "Paris"},
        {"role": "user", "content": "And of Italy?"},
    ],
    [{"role": "user", "content": "Hi"}, {"role": "tool", "content": "a"}, {"role": "tool", "content": "b"}],
]


@pytest.fixture(scope="module")
def chatml_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    rust = Tokenizer(models.BPE())
    rust.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    rust.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    rust.train_from_iterator(
        SENTENCES, trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS, initial_alphabet=alphabet)
    )
    tok = PreTrainedTokenizerFast(
        tokenizer_object=rust,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=TEMPLATE.read_text(),
    )
    out = tmp_path_factory.mktemp("chatml")
    tok.save_pretrained(out)
    return out


def reference(model_dir: Path, messages: list[dict[str, str]]) -> tuple[str, list[int]]:
    """transformers' rendering and token ids."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    text = str(tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
    ids: Any = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    return text, list(ids["input_ids"] if isinstance(ids, Mapping) else ids)


@pytest.mark.parametrize("messages", [*CONVERSATIONS, *MORE], ids=lambda m: f"{len(m)}-{m[0]['role']}")
def test_chatml_renders_and_tokenizes_like_transformers(
    chatml_dir: Path, messages: list[dict[str, str]]
) -> None:
    template = load_chat_template(chatml_dir)
    assert template is not None
    text, ids = reference(chatml_dir, messages)
    rendered = template.render(messages)
    assert rendered == text
    assert load_tokenizer(chatml_dir).encode(rendered, add_special_tokens=False) == ids
    assert ids.count(SPECIALS.index("<|im_start|>")) == rendered.count("<|im_start|>") >= 2
