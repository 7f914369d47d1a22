"""A real checkpoint's text side: every EOS id stops generation, generation_config.json gives
the sampling defaults, and chat_template.jinja renders exactly as transformers renders it
(tests/worker/fixtures/chat_reference.json, made by make_chat_reference.py)."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from strata.common.openai.chat_template import ChatTemplateError, load_chat_template
from strata.common.openai.protocol import parse_request
from strata.worker.engine.llm_engine import LLMEngine
from strata.worker.engine.sequence import SamplingParams
from strata.worker.models.generation import GenerationDefaults, load_generation_defaults
from strata.worker.models.presets import write_model
from strata.worker.server.app import build_app
from strata.worker.server.engine_loop import EngineLoop
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


def word_tokenizer(model: Path, special: dict[str, int], specials: bool = True) -> None:
    """A WordLevel tokenizer.json over the tiny model's 320 ids (``t0``... and ``special``)."""
    from tokenizers import AddedToken, Tokenizer, models

    vocab = {f"t{i}": i for i in range(320) if i not in special.values()} | special
    rust = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    if specials:
        rust.add_special_tokens([AddedToken(text, special=True) for text in special])  # keep their ids
    rust.save(str(model / "tokenizer.json"))


def without_eos(tiny_dir: Path, tmp_path: Path) -> Path:
    model = Path(shutil.copytree(tiny_dir, tmp_path / "m"))
    config = json.loads((model / "config.json").read_text())
    del config["eos_token_id"]
    (model / "config.json").write_text(json.dumps(config))
    return model


def test_built_in_end_of_turn_tokens_only_where_the_checkpoint_lists_none(
    tiny_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    free, _ = greedy(tiny_dir, SamplingParams(max_tokens=30, ignore_eos=True))
    at = first_new(free, 3)
    model = without_eos(tiny_dir, tmp_path)
    word_tokenizer(model, {"<|eot_id|>": free[at]})
    assert load_tokenizer(model).special_tokens() == {"<|eot_id|>": free[at]}
    with caplog.at_level(logging.WARNING, logger="strata.worker.models.generation"):
        out, reason = greedy(model, SamplingParams(max_tokens=30))
    assert (out, reason) == (free[: at + 1], "stop")
    assert "lists no EOS token" in caplog.text and "<|eot_id|>" in caplog.text
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "eos_token_id": 1000}))  # lists one
    caplog.clear()
    out, reason = greedy(model, SamplingParams(max_tokens=30))
    assert (out, reason) == (free, "length") and "lists no EOS token" not in caplog.text


def test_an_end_of_turn_token_the_checkpoint_does_not_list_does_not_stop(
    chat_dir: Path, tmp_path: Path
) -> None:
    """<|eom_id|> is special in the tokenizer, but neither config.json, generation_config.json nor
    the tokenizer's eos_token names it: as in transformers and vLLM, it is text like any other."""
    model = Path(shutil.copytree(chat_dir, tmp_path / "m"))
    free, _ = greedy(model, SamplingParams(max_tokens=30, ignore_eos=True))
    at = first_new(free, 3)
    word_tokenizer(model, {"<|eom_id|>": free[at], "<|end_of_text|>": END_OF_TEXT_ID, "<|eot_id|>": EOT_ID})
    defaults = load_generation_defaults(model, load_tokenizer(model))
    assert defaults.eos_token_ids == {END_OF_TEXT_ID, EOT_ID}
    out, _ = greedy(model, SamplingParams(max_tokens=at + 3, ignore_eos=False))
    assert out[: at + 3] == free[: at + 3]


def test_the_tokenizers_eos_token_stops_even_when_not_special(tiny_dir: Path, tmp_path: Path) -> None:
    free, _ = greedy(tiny_dir, SamplingParams(max_tokens=30, ignore_eos=True))
    at = first_new(free, 3)
    model = without_eos(tiny_dir, tmp_path)
    word_tokenizer(model, {}, specials=False)
    (model / "special_tokens_map.json").write_text(json.dumps({"eos_token": f"t{free[at]}"}))
    assert load_generation_defaults(model, load_tokenizer(model)).eos_token_ids == {free[at]}


async def test_a_stop_tokens_text_is_not_returned(tiny_dir: Path, tmp_path: Path) -> None:
    """An EOS that is an ordinary token ends generation; vLLM leaves its text out of the completion
    (the token counts in usage), in a whole response and in a stream alike."""
    free, _ = greedy(tiny_dir, SamplingParams(max_tokens=30, ignore_eos=True))
    at = first_new(free, 3)
    model = without_eos(tiny_dir, tmp_path)
    word_tokenizer(model, {}, specials=False)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "eos_token_id": free[at]}))
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 30, "temperature": 0}
    client = TestClient(TestServer(build_app(EngineLoop(LLMEngine.from_config(make_config(model))))))
    await client.start_server()
    try:
        whole = await (await client.post("/v1/completions", json=body)).json()
        stream = await (await client.post("/v1/completions", json={**body, "stream": True})).text()
    finally:
        await client.close()
    want = " ".join(f"t{t}" for t in free[:at])
    assert whole["choices"][0]["text"] == want and whole["choices"][0]["finish_reason"] == "stop"
    assert whole["usage"]["completion_tokens"] == at + 1
    chunks = [json.loads(line[6:]) for line in stream.split("\n\n") if line.startswith("data: {")]
    assert "".join(c["choices"][0]["text"] for c in chunks) == want


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
