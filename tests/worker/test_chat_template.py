"""Chat prompts in the model's own format (tokenizer_config.json's Jinja template), over HTTP too."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from strata.common.openai.chat_template import ChatTemplateError, load_chat_template, plain_transcript
from strata.worker.engine.llm_engine import LLMEngine
from strata.worker.models.errors import ModelLoadError
from strata.worker.server.app import build_app
from strata.worker.server.engine_loop import EngineLoop
from tests.worker.conftest import make_config

# Llama 3's layout, trimmed: a BOS, header-wrapped turns, and a refusal of a leading assistant turn.
LLAMA3 = (
    "{{ bos_token }}{% if messages[0]['role'] == 'assistant' %}"
    "{{ raise_exception('Conversation must start with a user or system turn') }}{% endif %}"
    "{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " Hi "}]
RENDERED = (
    "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
    "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
    "<|start_header_id|>assistant<|end_header_id|>\n\n"
)


def write_config(directory: Path, **config: object) -> Path:
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


def test_renders_like_apply_chat_template(tmp_path: Path) -> None:
    bos = {"content": "<|begin_of_text|>", "special": True}  # an AddedToken, as HF writes it
    template = load_chat_template(write_config(tmp_path, chat_template=LLAMA3, bos_token=bos))
    assert template is not None and template.render(MESSAGES) == RENDERED


def test_named_templates_use_default(tmp_path: Path) -> None:
    named = [
        {"name": "tool_use", "template": "x"},
        {"name": "default", "template": "{{ messages | length }}"},
    ]
    template = load_chat_template(write_config(tmp_path, chat_template=named))
    assert template is not None and template.render(MESSAGES) == "2"


def test_template_refusal_is_a_chat_template_error(tmp_path: Path) -> None:
    template = load_chat_template(write_config(tmp_path, chat_template=LLAMA3))
    assert template is not None
    with pytest.raises(ChatTemplateError, match="must start with a user or system turn"):
        template.render([{"role": "assistant", "content": "hello"}])


def test_no_config_or_no_template_means_none(tmp_path: Path) -> None:
    assert load_chat_template(tmp_path) is None
    assert load_chat_template(write_config(tmp_path, bos_token="<s>")) is None


def test_broken_template_fails_the_model_load(tmp_path: Path, tiny_dir: Path) -> None:
    model = Path(shutil.copytree(tiny_dir, tmp_path / "m"))
    write_config(model, chat_template="{% for m in messages %}")
    with pytest.raises(ModelLoadError, match=r"model.path: chat_template in .* does not compile"):
        LLMEngine.from_config(make_config(model))


def test_plain_transcript_for_models_without_one() -> None:
    assert plain_transcript(MESSAGES) == "<|system|>\nBe brief.\n<|user|>\n Hi \n<|assistant|>\n"


async def test_chat_endpoint_uses_the_template_without_adding_special_tokens(
    tmp_path: Path, tiny_dir: Path
) -> None:
    model = Path(shutil.copytree(tiny_dir, tmp_path / "m"))
    write_config(model, chat_template=LLAMA3, bos_token="<|begin_of_text|>")
    client = TestClient(TestServer(build_app(EngineLoop(LLMEngine.from_config(make_config(model))))))
    await client.start_server()
    try:
        body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 2, "temperature": 0}
        resp = await client.post("/v1/chat/completions", json=body)
        assert resp.status == 200, await resp.text()
        # The byte-level tokenizer makes one token per byte: exactly the rendered template.
        assert (await resp.json())["usage"]["prompt_tokens"] == len(RENDERED.encode())
        refused = await client.post(
            "/v1/chat/completions", json={**body, "messages": [{"role": "assistant", "content": "x"}]}
        )
        error = (await refused.json())["error"]
        assert refused.status == 400 and error["param"] == "messages"
        assert "must start with a user or system turn" in error["message"]
    finally:
        await client.close()


def test_hf_tokenizer_can_leave_special_tokens_out(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    from strata.worker.tokenizer import load_tokenizer

    rust = Tokenizer(models.WordLevel({"[UNK]": 0, "<s>": 1, "hi": 2}, unk_token="[UNK]"))
    rust.pre_tokenizer = pre_tokenizers.Whitespace()
    rust.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    rust.save(str(tmp_path / "tokenizer.json"))
    tok = load_tokenizer(tmp_path)
    assert tok.encode("hi") == [1, 2]
    assert tok.encode("hi", add_special_tokens=False) == [2]
