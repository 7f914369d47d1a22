"""The OpenAI API as users reach it: the official ``openai`` client against a real worker process."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.worker.worker_proc import WorkerProcess, running_worker

pytestmark = pytest.mark.slow
PROMPT = "The tiered cache keeps this prefix warm. "  # 41 bytes: 2 full 16-token blocks can hit


@pytest.fixture(scope="module")
def worker(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    with running_worker(tiny_dir, tmp_path_factory.mktemp("openai")) as proc:
        yield proc


@pytest.fixture(scope="module")
def client(worker: WorkerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=worker.base_url + "/v1", api_key="unused", max_retries=0)


def test_models_lists_the_served_model(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == ["tiny"]


def test_completion(client: openai.OpenAI) -> None:
    out = client.completions.create(model="tiny", prompt="hello", max_tokens=4, temperature=0, seed=1)
    assert out.choices[0].finish_reason in ("stop", "length")
    assert out.usage is not None and out.usage.prompt_tokens == 5
    assert out.usage.total_tokens == 5 + out.usage.completion_tokens


def test_chat(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3, temperature=0
    )
    assert out.object == "chat.completion" and out.choices[0].message.role == "assistant"
    assert isinstance(out.choices[0].message.content, str)


def test_cached_tokens_after_a_repeated_prompt(client: openai.OpenAI) -> None:
    def cached() -> int:
        out = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=1, temperature=0)
        assert out.usage is not None and out.usage.prompt_tokens_details is not None
        return out.usage.prompt_tokens_details.cached_tokens or 0

    cached()  # the first time may hit or not (another test may have sent it)
    assert cached() == 32  # (41 - 1) // 16 full blocks; the last token is always computed


def test_streaming_with_include_usage(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=6,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    *content, last = list(stream)
    assert all(c.usage is None and len(c.choices) == 1 for c in content)
    assert content[-1].choices[0].finish_reason in ("stop", "length")
    assert last.choices == [] and last.usage is not None
    assert 1 <= last.usage.completion_tokens <= 6
    assert last.usage.prompt_tokens_details is not None


def test_request_id_is_echoed_and_names_the_response(client: openai.OpenAI, worker: WorkerProcess) -> None:
    raw = client.completions.with_raw_response.create(
        model="tiny", prompt="hi", max_tokens=2, extra_headers={"X-Request-Id": "trace-123"}
    )
    assert raw.headers["x-request-id"] == "trace-123"
    assert raw.parse().id == "cmpl-trace-123"
    finished = [json.loads(line) for line in worker.log_lines() if "trace-123" in line]
    assert [entry["msg"] for entry in finished] == ["request finished"]
    assert finished[0]["request_id"] == "trace-123" and finished[0]["prompt_tokens"] == 2


def test_stream_options_without_stream_is_refused(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(
            model="tiny", prompt="hi", max_tokens=2, stream_options={"include_usage": True}
        )
    assert err.value.param == "stream_options"


def test_content_parts(client: openai.OpenAI) -> None:
    parts: list[Any] = [{"type": "text", "text": "hello"}, {"type": "text", "text": "world"}]
    as_parts = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": parts}], max_tokens=4, temperature=0
    )
    as_text = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hello\nworld"}], max_tokens=4, temperature=0
    )
    assert as_parts.choices[0].message.content == as_text.choices[0].message.content
    assert as_parts.usage == as_text.usage or (
        as_parts.usage is not None
        and as_text.usage is not None
        and as_parts.usage.prompt_tokens == as_text.usage.prompt_tokens
    )


def test_chat_logprobs(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=5,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
        extra_body={"ignore_eos": True},
    )
    logprobs = out.choices[0].logprobs
    assert logprobs is not None and logprobs.content is not None and len(logprobs.content) == 5
    for entry in logprobs.content:
        assert [t.logprob for t in entry.top_logprobs] == sorted(
            (t.logprob for t in entry.top_logprobs), reverse=True
        )
        assert len(entry.top_logprobs) == 3 and entry.logprob <= 0
        best = entry.top_logprobs[0]
        assert (best.bytes, best.logprob) == (entry.bytes, entry.logprob)  # greedy took the most likely
    text = b"".join(bytes(e.bytes or []) for e in logprobs.content).decode("utf-8", errors="replace")
    assert text == out.choices[0].message.content


def test_completion_logprobs_streamed_and_whole_agree(client: openai.OpenAI) -> None:
    args: dict[str, Any] = {
        "model": "tiny",
        "prompt": "abc",
        "max_tokens": 4,
        "temperature": 0,
        "logprobs": 2,
    }
    whole = client.completions.create(**args).choices[0].logprobs
    assert whole is not None and whole.token_logprobs is not None and whole.top_logprobs is not None
    assert len(whole.token_logprobs) == 4 and all(len(top) in (2, 3) for top in whole.top_logprobs)
    streamed: list[float] = []
    for chunk in client.completions.create(**args, stream=True):
        if chunk.choices and chunk.choices[0].logprobs is not None:
            streamed += chunk.choices[0].logprobs.token_logprobs or []
    assert streamed == pytest.approx(whole.token_logprobs)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("tools", [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]),
        ("response_format", {"type": "json_object"}),
        ("n", 2),
        ("presence_penalty", 0.5),
        ("logit_bias", {"42": 3}),
        ("parallel_tool_calls", False),
    ],
)
def test_refused_fields_name_the_parameter(client: openai.OpenAI, field: str, value: Any) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2, **{field: value}
        )
    assert err.value.param == field and field in err.value.message


def test_non_text_content_part_is_refused(client: openai.OpenAI) -> None:
    image: list[Any] = [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": image}], max_tokens=2
        )
    assert err.value.param == "messages[0].content[0].type"
