"""Request bodies as clients send them: what is accepted, normalised, and refused by name."""

from __future__ import annotations

from typing import Any

import pytest

from strata.common.openai.errors import ApiError
from strata.common.openai.messages import chat_messages
from strata.common.openai.protocol import parse_request


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}


def refused(body: dict[str, Any], kind: str = "chat") -> str | None:
    with pytest.raises(ApiError) as err:
        parse_request(body, kind, "m")  # type: ignore[arg-type]
    assert err.value.status == 400 and err.value.param is not None
    assert err.value.message.startswith(err.value.param)
    return err.value.param


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("tools", [{"type": "function", "function": {"name": "f"}}]),
        ("tool_choice", "auto"),
        ("response_format", {"type": "json_object"}),
        ("n", 2),
        ("presence_penalty", 0.5),
        ("frequency_penalty", 1),
        ("logit_bias", {"1": 5}),
        ("functions", [{"name": "f"}]),
        ("parallel_tool_calls", True),
        ("audio", {"voice": "x"}),
        ("modalities", ["text"]),
        ("store", True),
        ("metadata", {"a": "b"}),
        ("reasoning_effort", "low"),
        ("web_search_options", {}),
        ("no_such_field", 1),
    ],
)
def test_unimplemented_fields_are_refused_by_name(field: str, value: Any) -> None:
    assert refused(chat(**{field: value})) == field


@pytest.mark.parametrize("field", ["echo", "best_of", "suffix", "logit_bias"])
def test_completion_only_fields_off_values_pass_others_refused(field: str) -> None:
    off = {"echo": False, "best_of": 1, "suffix": "", "logit_bias": {}}[field]
    on = {"echo": True, "best_of": 3, "suffix": "end", "logit_bias": {"3": 1}}[field]
    body = {"model": "m", "prompt": "x"}
    parse_request({**body, field: off}, "completion", "m")
    parse_request({**body, field: None}, "completion", "m")
    assert refused({**body, field: on}, "completion") == field


def test_off_values_are_accepted() -> None:
    req = parse_request(
        chat(n=1, presence_penalty=0.0, frequency_penalty=0, tools=[], tool_choice="none", logit_bias=None),
        "chat",
        "m",
    )
    assert isinstance(req.prompt, str) and req.prompt.endswith("<|assistant|>\n")
    assert refused(chat(n=True)) == "n"  # True == 1 in Python, not to a client


def test_content_parts_are_joined_and_other_parts_refused() -> None:
    parts = [{"type": "text", "text": "first"}, {"type": "text", "text": "second"}]
    assert chat_messages([{"role": "user", "content": parts}])[0]["content"] == "first\nsecond"
    image = [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "x"}}]
    assert refused(chat(messages=[{"role": "user", "content": image}])) == "messages[0].content[1].type"
    assert refused(chat(messages=[{"role": "user", "content": [{"type": "text"}]}])) == (
        "messages[0].content[0].text"
    )


def test_developer_role_null_assistant_content_and_sent_back_messages() -> None:
    messages = [
        {"role": "developer", "content": "rules"},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": None, "refusal": None, "tool_calls": None},
        {"role": "user", "content": "again", "name": "bob"},
    ]
    assert chat_messages(messages) == [
        {"role": "system", "content": "rules"},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": "again", "name": "bob"},
    ]
    assert refused(chat(messages=[{"role": "user", "content": None}])) == "messages[0].content"
    tool_call = {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]}
    assert refused(chat(messages=[tool_call])) == "messages[0].tool_calls"
    assert refused(chat(messages=[{"role": "robot", "content": "x"}])) == "messages[0].role"


def test_logprobs_fields_per_endpoint() -> None:
    assert parse_request(chat(), "chat", "m").logprobs is None
    assert parse_request(chat(logprobs=True), "chat", "m").logprobs == 0
    assert parse_request(chat(logprobs=True, top_logprobs=3), "chat", "m").logprobs == 3
    assert refused(chat(top_logprobs=3)) == "top_logprobs"
    assert refused(chat(logprobs=True, top_logprobs=21)) == "top_logprobs"
    assert parse_request({"model": "m", "prompt": "x", "logprobs": 2}, "completion", "m").logprobs == 2
    assert refused({"model": "m", "prompt": "x", "logprobs": True}, "completion") == "logprobs"


def test_extensions_and_stream_options() -> None:
    req = parse_request(chat(top_k=5, stop_token_ids=[7, 9], user="u1"), "chat", "m")
    assert (req.top_k, req.stop_token_ids, req.user) == (5, (7, 9), "u1")
    assert refused(chat(stop_token_ids=["x"])) == "stop_token_ids"
    assert refused(chat(top_k=-2)) == "top_k"
    assert (
        refused(chat(stream=True, stream_options={"include_usage": "yes"})) == "stream_options.include_usage"
    )
    assert refused(chat(stream=True, stream_options={"continuous_usage_stats": True})) == (
        "stream_options.continuous_usage_stats"
    )
    assert parse_request(chat(stream=True, stream_options={"include_usage": True}), "chat", "m").include_usage


def test_unset_sampling_fields_stay_unset_for_the_model_defaults() -> None:
    req = parse_request(chat(), "chat", "m")
    assert (req.temperature, req.top_p, req.top_k, req.max_tokens) == (None, None, None, None)
    assert parse_request(chat(max_completion_tokens=5, max_tokens=9), "chat", "m").max_tokens == 5
