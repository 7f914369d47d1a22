"""A real checkpoint's text side: every EOS id stops generation, generation_config.json gives
the sampling defaults, and chat_template.jinja renders exactly as transformers renders it
(tests/worker/fixtures/chat_reference.json, made by make_chat_reference.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from strata.common.openai.chat_template import ChatTemplateError, load_chat_template
from strata.common.openai.protocol import parse_request
from strata.worker.engine.llm_engine import LLMEngine
from strata.worker.engine.sequence import SamplingParams
from strata.worker.models.generation import GenerationDefaults, load_generation_defaults
from strata.worker.models.presets import write_model
from strata.worker.server.generate import sampling_params
from strata.worker.tokenizer import load_tokenizer
from tests.worker.chat_checkpoint import BOS_ID, END_OF_TEXT_ID, EOT_ID, REFERENCE, write_chat_files
from tests.worker.conftest import make_config

REFERENCE_CASES = json.loads(REFERENCE.read_text())["cases"]
PROMPT = [104, 101, 108, 108, 111]  # "hello" as byte ids


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny weights with a chat checkpoint's text side: two EOS ids, generation_config.json,
    chat_template.jinja and a tokenizer.json with Llama 3 style special tokens."""
    return write_chat_files(write_model(tmp_path_factory.mktemp("chat"), "tiny"))


def test_eos_ids_from_config_generation_config_and_tokenizer(chat_dir: Path) -> None:
    defaults = load_generation_defaults(chat_dir, load_tokenizer(chat_dir))
    # config.json says 257; generation_config.json adds 258 (<|eot_id|>, also an end-of-turn special)
    assert defaults.eos_token_ids == {END_OF_TEXT_ID, EOT_ID}
    assert (defaults.temperature, defaults.top_p, defaults.top_k) == (0.6, 0.9, None)


@pytest.mark.parametrize("case", REFERENCE_CASES, ids=lambda c: str(len(c["messages"])))
def test_template_renders_like_transformers(chat_dir: Path, case: dict) -> None:  # type: ignore[type-arg]
    template = load_chat_template(chat_dir)
    assert template is not None
    if "error" in case:
        with pytest.raises(ChatTemplateError, match=case["error"]):
            template.render(case["messages"])
        return
    rendered = template.render(case["messages"])
    assert rendered == case["rendered"]
    assert load_tokenizer(chat_dir).encode(rendered, add_special_tokens=False) == case["token_ids"]
    assert case["token_ids"].count(BOS_ID) == 1  # the template's BOS, not doubled


def test_jinja_file_wins_over_tokenizer_config(chat_dir: Path, tmp_path: Path) -> None:
    model = Path(shutil.copytree(chat_dir, tmp_path / "m"))
    config = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": "old"}))
    template = load_chat_template(model)
    assert template is not None and template.render([{"role": "user", "content": "x"}]) != "old"
    (model / "chat_template.jinja").unlink()
    template = load_chat_template(model)
    assert template is not None and template.render([{"role": "user", "content": "x"}]) == "old"


def greedy(model_dir: Path, params: SamplingParams) -> tuple[list[int], str | None]:
    engine = LLMEngine.from_config(make_config(model_dir))
    seq = engine.generate(PROMPT, params)
    return seq.output_ids, seq.finish_reason


def first_new(tokens: list[int], start: int) -> int:
    """Index of the first token at or after ``start`` that did not occur before it."""
    return next(i for i in range(start, len(tokens)) if tokens[i] not in tokens[:i])


def test_generation_stops_at_either_eos_id(tiny_dir: Path, tmp_path: Path) -> None:
    free, _ = greedy(tiny_dir, SamplingParams(max_tokens=30, ignore_eos=True))
    late = first_new(free, 6)
    early = first_new(free, 2)
    assert free[early] != free[late]
    model = Path(shutil.copytree(tiny_dir, tmp_path / "m"))
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "eos_token_id": free[late]}))
    out, reason = greedy(model, SamplingParams(max_tokens=30))
    assert (out, reason) == (free[: late + 1], "stop")  # config.json's id
    (model / "generation_config.json").write_text(json.dumps({"eos_token_id": [free[late], free[early]]}))
    out, reason = greedy(model, SamplingParams(max_tokens=30))
    assert (out, reason) == (free[: early + 1], "stop")  # generation_config.json's second id
    out, reason = greedy(model, SamplingParams(max_tokens=30, ignore_eos=True, stop_token_ids=(free[1],)))
    assert (out, reason) == (free[:2], "stop")  # a request's stop_token_ids, even with ignore_eos


def test_end_of_turn_special_token_stops(tiny_dir: Path, tmp_path: Path) -> None:
    """A tokenizer whose <|eot_id|> is an id the model produces: generation ends there."""
    free, _ = greedy(tiny_dir, SamplingParams(max_tokens=30, ignore_eos=True))
    at = first_new(free, 3)
    model = Path(shutil.copytree(tiny_dir, tmp_path / "m"))
    from tokenizers import AddedToken, Tokenizer, models

    vocab = {f"t{i}": i for i in range(320) if i != free[at]} | {"<|eot_id|>": free[at]}
    rust = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    rust.add_special_tokens([AddedToken("<|eot_id|>", special=True)])  # keeps its vocab id
    rust.save(str(model / "tokenizer.json"))
    assert load_tokenizer(model).special_tokens() == {"<|eot_id|>": free[at]}
    out, reason = greedy(model, SamplingParams(max_tokens=30))
    assert (out, reason) == (free[: at + 1], "stop")


def test_generation_config_gives_the_defaults_a_request_leaves_out() -> None:
    gen = GenerationDefaults(frozenset(), temperature=0.6, top_p=0.9, top_k=40, max_tokens=100)
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    defaulted = sampling_params(parse_request(body, "chat", "m"), gen, room=500)
    assert (defaulted.temperature, defaulted.top_p, defaulted.top_k, defaulted.max_tokens) == (
        0.6,
        0.9,
        40,
        100,
    )
    explicit = {**body, "temperature": 0, "top_p": 0.5, "top_k": -1, "max_tokens": 7}
    given = sampling_params(parse_request(explicit, "chat", "m"), gen, room=500)
    assert (given.temperature, given.top_p, given.top_k, given.max_tokens) == (0.0, 0.5, 0, 7)
    bare = sampling_params(parse_request(body, "chat", "m"), GenerationDefaults(), room=500)
    assert (bare.temperature, bare.top_p, bare.top_k, bare.max_tokens) == (1.0, 1.0, 0, 500)
